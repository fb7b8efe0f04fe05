"""The MCP door as the popular clients reach it (tests/api/mcp_clients.rs runs this):
    python mcp_clients.py SCENARIO --url URL --key KEY
agents_sdk: the OpenAI Agents SDK's MCPServerStreamableHttp with its default timeouts (5 s a
call, no cancel), run by the SDK's Runner with a scripted model: `task` with run_in_background,
then `task_wait` until the answer; then a plain call longer than 5 s, which the SDK gives up on.
langchain: langchain-mcp-adapters' MultiServerMCPClient lists and calls `task`. fastmcp:
fastmcp's Client lists and calls `task`, with progress. Prints one JSON object of facts; exits
non-zero on a failed check."""

import argparse
import asyncio
import json
import re
import sys


def check(cond, what):
    if not cond:
        print(f"ASSERTION FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def texts(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def agents_sdk(args):
    from agents import Agent, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp
    from agents.models.interface import Model
    from agents.items import ModelResponse
    from agents.usage import Usage
    from openai.types.responses import (ResponseFunctionToolCall, ResponseOutputMessage,
                                        ResponseOutputText)

    set_tracing_disabled(True)
    outputs = []

    class Scripted(Model):
        """A model that delegates in the background, then waits for the task by its id."""

        def __init__(self):
            self.turn = 0

        async def get_response(self, system_instructions, input, model_settings, tools, *a, **kw):
            self.turn += 1
            seen = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
            if seen:
                outputs.append(str(seen[-1]["output"]))
            names = [t.name for t in tools]
            check("task" in names and "task_wait" in names, names)
            call = None
            if self.turn == 1:
                call = ("task", {"subagent_type": "general", "description": "from the agents sdk",
                                 "prompt": "p [mock:delay_ms=8000] [mock:reply=answer from the background]",
                                 "run_in_background": True})
            else:
                last = outputs[-1]
                if "answer from the background" not in last:
                    found = re.search(r"[0-9a-f]{8}-[0-9a-f-]{27}", last)
                    check(found, outputs)
                    task_id = found.group(0)
                    # The SDK gives a call 5 s: each wait shorter than that.
                    call = ("task_wait", {"task_id": task_id, "wait_seconds": 3})
            if call:
                item = ResponseFunctionToolCall(id=f"fc{self.turn}", call_id=f"call{self.turn}", name=call[0],
                                                arguments=json.dumps(call[1]), type="function_call")
            else:
                item = ResponseOutputMessage(id="msg", role="assistant", status="completed", type="message",
                                             content=[ResponseOutputText(text="done: " + outputs[-1],
                                                                         type="output_text", annotations=[])])
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *a, **kw):
            raise NotImplementedError

    headers = {"Authorization": f"Bearer {args.key}"}
    # The SDK's defaults: 5 s a call (client_session_timeout_seconds), no cancel on a timeout.
    async with MCPServerStreamableHttp(params={"url": args.url, "headers": headers}, name="subagentd") as server:
        agent = Agent(name="delegator", instructions="delegate", model=Scripted(), mcp_servers=[server])
        result = await Runner.run(agent, "do it", max_turns=20)
        check("answer from the background" in result.final_output, result.final_output)
        check("task_wait" in outputs[0] and "background" in outputs[0], outputs[0])
        # A plain call longer than the SDK's 5 s: it gives up (no cancel), then ends its session.
        timed_out = False
        try:
            await server.call_tool("task", {"subagent_type": "general", "description": "given up by the agents sdk",
                                            "prompt": "p [mock:delay_ms=30000]"})
        except Exception as e:  # the SDK's timeout error
            timed_out = True
            why = repr(e)
        check(timed_out, "a 30 s call returned within the SDK's 5 s")
    return {"waits": len(outputs) - 1, "final": result.final_output, "timeout": why}


async def langchain(args):
    from langchain_mcp_adapters.client import MultiServerMCPClient

    client = MultiServerMCPClient({"subagentd": {"transport": "streamable_http", "url": args.url,
                                                 "headers": {"Authorization": f"Bearer {args.key}"}}})
    tools = {t.name: t for t in await client.get_tools()}
    check({"task", "task_get", "task_wait", "task_cancel"} <= set(tools), list(tools))
    out = await tools["task"].ainvoke({"subagent_type": "general", "description": "from langchain",
                                       "prompt": "p [mock:reply=hello from langchain]"})
    text = out if isinstance(out, str) else json.dumps(out, default=str)
    check("hello from langchain" in text, text)
    bg = await tools["task"].ainvoke({"subagent_type": "general", "description": "langchain background",
                                      "prompt": "p [mock:delay_ms=3000] [mock:reply=later from langchain]",
                                      "run_in_background": True})
    bg = bg if isinstance(bg, str) else json.dumps(bg, default=str)
    task_id = re.search(r"[0-9a-f]{8}-[0-9a-f-]{27}", bg).group(0)
    for _ in range(10):
        done = await tools["task_wait"].ainvoke({"task_id": task_id})
        done = done if isinstance(done, str) else json.dumps(done, default=str)
        if "later from langchain" in done:
            break
    check("later from langchain" in done, done)
    return {"tools": sorted(tools), "text": text, "background": task_id}


async def fastmcp_client(args):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    transport = StreamableHttpTransport(args.url, headers={"Authorization": f"Bearer {args.key}"})
    async with Client(transport) as c:
        tools = [t.name for t in await c.list_tools()]
        check("task" in tools, tools)
        r = await c.call_tool("task", {"subagent_type": "general", "description": "from fastmcp",
                                       "prompt": "p [mock:tool_turns=2] [mock:reply=hello from fastmcp]",
                                       "max_turns": 5},
                              progress_handler=on_progress)
        check(not r.is_error and texts(r) == "hello from fastmcp", texts(r))
        check(r.structured_content["status"] == "completed", r.structured_content)
        check(len(seen) >= 2 and all(a < b for a, b in zip(seen, seen[1:])), seen)
    return {"tools": tools, "text": texts(r), "progress": seen}


SCENARIOS = {"agents_sdk": agents_sdk, "langchain": langchain, "fastmcp": fastmcp_client}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()
    print(json.dumps(asyncio.run(SCENARIOS[args.scenario](args)), default=str))


if __name__ == "__main__":
    main()
