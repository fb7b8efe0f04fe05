"""The MCP door as the official Python SDK's client sees it (tests/api/mcp.rs runs this).

    python mcp_client.py SCENARIO --url http://host:port/mcp --key sk_... [--key2 sk_...]
        [--urls URL,URL] [--header K=V ...] [--task-id ID] [--answer approve|deny|decline]
        [--image REF --repo URL --prompt TEXT]

Each scenario asserts what the client sees and prints one JSON object of facts for the Rust
test to check against the service's own records. A failed assertion exits non-zero.
"""
import argparse
import asyncio
import itertools
import json
import sys
import warnings
from datetime import timedelta

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.shared.exceptions import McpError
from mcp.client.streamable_http import streamable_http_client

warnings.simplefilter("ignore", DeprecationWarning)  # the SDK's experimental tasks API warns


def http_client(args, key, urls=None, headers=None):
    """An httpx client with the key (and any extra headers); with several URLs, each request
    goes to the next one in turn (replicas behind a balancer)."""
    h = {"Authorization": f"Bearer {key}"}
    for kv in args.header or []:
        k, v = kv.split("=", 1)
        h[k] = v
    h.update(headers or {})
    hooks = {}
    if urls:
        ports = itertools.cycle([httpx.URL(u) for u in urls])

        async def rotate(request):
            target = next(ports)
            request.url = request.url.copy_with(host=target.host, port=target.port)

        hooks["request"] = [rotate]
    return httpx.AsyncClient(headers=h, timeout=httpx.Timeout(30, read=300), event_hooks=hooks)


class Session:
    """An initialized ClientSession over streamable HTTP, as an async context manager."""

    def __init__(self, args, key=None, urls=None, headers=None, elicit=None):
        self.args, self.key, self.urls, self.headers, self.elicit = args, key or args.key, urls, headers, elicit

    async def __aenter__(self):
        self.http = http_client(self.args, self.key, self.urls, self.headers)
        await self.http.__aenter__()
        self.transport = streamable_http_client(self.args.url, http_client=self.http)
        read, write, self.session_id = await self.transport.__aenter__()
        self.session = ClientSession(read, write, elicitation_callback=self.elicit)
        await self.session.__aenter__()
        self.session.init_result = await self.session.initialize()
        return self.session

    async def __aexit__(self, *exc):
        await self.session.__aexit__(*exc)
        await self.transport.__aexit__(*exc)
        await self.http.__aexit__(*exc)


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def list_tools(args):
    async with Session(args) as s:
        tools = (await s.list_tools()).tools
        by = {t.name: t for t in tools}
        check({"task", "task_get", "task_wait", "task_cancel"} <= set(by), f"tools: {list(by)}")
        task = by["task"]
        check(task.inputSchema["required"] == ["subagent_type", "description", "prompt"], task.inputSchema)
        check(task.outputSchema and "task_id" in task.outputSchema["properties"], task.outputSchema)
        check(task.execution and task.execution.taskSupport == "optional", task.execution)
        return {"protocol": s.init_result.protocolVersion,
                "types": task.inputSchema["properties"]["subagent_type"]["enum"], "description": task.description}


async def plain_call(args):
    async with Session(args) as s:
        r = await s.call_tool("task", {"subagent_type": "research", "description": "greet",
                                       "prompt": "say hello [mock:reply=hello from the sub-agent]"})
        check(not r.isError, text(r))
        check(text(r) == "hello from the sub-agent", text(r))
        sc = r.structuredContent
        check(sc["status"] == "completed" and sc["stop_reason"] == "final_answer", sc)
        check(sc["summary"] == "hello from the sub-agent" and "input_tokens" in sc["usage"], sc)
        # A refusal names its code and starts nothing.
        bad = await s.call_tool("task", {"subagent_type": "nosuch", "description": "x", "prompt": "y"})
        check(bad.isError and "unknown_subagent_type" in text(bad), text(bad))
        long = await s.call_tool("task", {"subagent_type": "general", "description": "x" * 81, "prompt": "y"})
        check(long.isError and "description" in text(long), text(long))
        missing = await s.call_tool("task", {"subagent_type": "general", "prompt": "y"})
        check(missing.isError and "description" in text(missing), text(missing))
        return {"task_id": sc["task_id"], "cost_usd": sc["cost_usd"]}


async def long_call(args):
    """A call longer than the door's wait: its id back, then task_wait finishes it."""
    progress = []

    async def on_progress(p, total, message):
        progress.append(p)

    async with Session(args) as s:
        r = await s.call_tool("task", {"subagent_type": "general", "description": "slow",
                                       "prompt": "slowly [mock:delay_ms=5000] [mock:reply=at last]"})
        check(not r.isError and r.structuredContent["status"] in ("queued", "running"), r.structuredContent)
        task_id = r.structuredContent["task_id"]
        check(task_id in text(r) and "task_wait" in text(r), text(r))
        # task_wait waits as long as a call does: called again until the task has ended.
        for _ in range(10):
            done = await s.call_tool("task_wait", {"task_id": task_id})
            if done.structuredContent["status"] not in ("queued", "running"):
                break
        check(done.structuredContent["status"] == "completed", done.structuredContent)
        check(text(done) == "at last", text(done))
        # With a progress token: a notification per finished turn.
        p = await s.call_tool("task", {"subagent_type": "general", "description": "turns",
                                       "prompt": "work [mock:tool_turns=2]", "max_turns": 5},
                              progress_callback=on_progress)
        check(p.structuredContent["status"] == "completed", p.structuredContent)
        check(progress[:2] == [1.0, 2.0], progress)
        return {"task_id": task_id, "progress": progress}


async def task_augmented(args):
    async with Session(args) as s:
        created = await s.experimental.call_tool_as_task(
            "task", {"subagent_type": "plan", "description": "in the background",
                     "prompt": "plan it [mock:delay_ms=500] [mock:reply=the plan]"})
        task_id = created.task.taskId
        check(created.task.status == "working", created.task)
        seen = [t.status async for t in s.experimental.poll_task(task_id)]
        check(seen[-1] == "completed", seen)
        result = await s.experimental.get_task_result(task_id, types.CallToolResult)
        check(text(result) == "the plan", text(result))
        listed = await s.experimental.list_tasks()
        check(any(t.taskId == task_id for t in listed.tasks), [t.taskId for t in listed.tasks])
        return {"task_id": task_id, "statuses": seen}


async def call_in_flight(args, task_id, seconds=30):
    """Until the task's first provider call has started, as the service's event log tells
    (`GET /tasks/{id}/events`): the cancel must find that call in flight, however loaded the
    machine is."""
    base = args.url.removesuffix("/mcp")
    deadline = asyncio.get_event_loop().time() + seconds
    async with http_client(args, args.key) as h:
        while True:
            r = await h.get(f"{base}/tasks/{task_id}/events")
            check(r.status_code == 200, r.text)
            if any(e["kind"] == "llm_call_started" for e in r.json()["events"]):
                return
            check(asyncio.get_event_loop().time() < deadline, f"task {task_id} started no provider call")
            await asyncio.sleep(0.05)


async def cancel(args):
    async with Session(args) as s:
        created = await s.experimental.call_tool_as_task(
            "task", {"subagent_type": "general", "description": "to cancel",
                     "prompt": "never mind [mock:delay_ms=30000]"})
        task_id = created.task.taskId
        await call_in_flight(args, task_id)
        c = await s.experimental.cancel_task(task_id)
        check(c.status == "cancelled", c)
        got = await s.call_tool("task_get", {"task_id": task_id})
        check(got.isError and got.structuredContent["status"] == "cancelled", got.structuredContent)
        return {"task_id": task_id}


async def elicit(args):
    """A run that needs a decision: asked through elicitation, answered (or declined)."""
    asked = []

    async def on_elicit(ctx, params):
        asked.append({"message": params.message, "schema": params.requestedSchema})
        if args.answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": args.answer, "message": "by the test"})

    async with Session(args, elicit=on_elicit) as s:
        r = await s.call_tool("task", {"subagent_type": "general", "description": "needs a yes",
                                       "prompt": "deploy it [mock:tool_turns=1] [mock:reply=done deploying]"},
                              read_timeout_seconds=timedelta(seconds=60))
        check(len(asked) == 1 and "decision" in asked[0]["schema"]["properties"], asked)
        check(not r.isError and r.structuredContent["status"] == "completed", r.structuredContent)
        return {"task_id": r.structuredContent["task_id"], "asked": asked}


async def isolation(args):
    """Another tenant's task is not found, by any method."""
    async with Session(args, key=args.key2) as s:
        r = await s.call_tool("task_get", {"task_id": args.task_id})
        check(r.isError and "not_found" in text(r), text(r))
        w = await s.call_tool("task_cancel", {"task_id": args.task_id})
        check(w.isError and "not_found" in text(w), text(w))
        try:
            await s.experimental.get_task(args.task_id)
            check(False, "tasks/get found another tenant's task")
        except Exception as e:  # McpError
            check("not found" in str(e).lower(), str(e))
        return {"ok": True}


async def depth(args):
    async with Session(args, headers={"Subagent-Depth": "1"}) as s:
        names = [t.name for t in (await s.list_tools()).tools]
        check("task" not in names, names)
        r = await s.call_tool("task", {"subagent_type": "general", "description": "x", "prompt": "deeper"})
        check(r.isError and "recursion_refused" in text(r), text(r))
        return {"tools": names}


async def replicas(args):
    """Every request goes to the other replica in turn: initialize on one, the rest alternate;
    the elicitation's answer lands on whichever replica comes next."""
    asked = []

    async def on_elicit(ctx, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    urls = args.urls.split(",")
    async with Session(args, urls=urls, elicit=on_elicit) as s:
        tools = (await s.list_tools()).tools
        check(any(t.name == "task" for t in tools), [t.name for t in tools])
        r = await s.call_tool("task", {"subagent_type": "general", "description": "across replicas",
                                       "prompt": "deploy [mock:tool_turns=1] [mock:reply=served]"},
                              read_timeout_seconds=timedelta(seconds=60))
        check(text(r) == "served" and len(asked) == 1, (text(r), asked))
        created = await s.experimental.call_tool_as_task(
            "task", {"subagent_type": "plan", "description": "bg", "prompt": "p [mock:reply=again]"})
        async for _ in s.experimental.poll_task(created.task.taskId):
            pass
        result = await s.experimental.get_task_result(created.task.taskId, types.CallToolResult)
        check(text(result) == "again", text(result))
        return {"task_id": r.structuredContent["task_id"]}


async def old_version(args):
    """A client of 2025-06-18: no tasks, the same tools and calls."""
    types.LATEST_PROTOCOL_VERSION = "2025-06-18"
    async with Session(args) as s:
        check(s.init_result.protocolVersion == "2025-06-18", s.init_result.protocolVersion)
        tools = (await s.list_tools()).tools
        task = next(t for t in tools if t.name == "task")
        check(task.execution is None, task.execution)
        r = await s.call_tool("task", {"subagent_type": "general", "description": "old",
                                       "prompt": "p [mock:reply=still works]"})
        check(text(r) == "still works", text(r))
        return {"protocol": "2025-06-18"}


async def refusals(args):
    """Admission refusals are isError results naming the problem's code; none starts a task."""
    async with Session(args) as s:
        r = await s.call_tool("task", {"subagent_type": "general", "description": "no model", "prompt": "p"})
        check(r.isError and "model_required" in text(r), text(r))
        r = await s.call_tool("task", {"subagent_type": "general", "description": "no budget", "prompt": "p",
                                       "model": "mock/m"})
        check(r.isError and "budget_exhausted" in text(r), text(r))
        # A task-augmented call's answer is a task or an error: refused, it is an error.
        try:
            await s.experimental.call_tool_as_task(
                "task", {"subagent_type": "general", "description": "no budget", "prompt": "p", "model": "mock/m"})
            check(False, "a refused task-augmented call made a task")
        except McpError as e:
            check("budget_exhausted" in str(e), str(e))
    async with Session(args, key=args.key2) as s:
        r = await s.call_tool("task", {"subagent_type": "general", "description": "queue full", "prompt": "p",
                                       "model": "mock/m"})
        check(r.isError and "queue_limit_reached" in text(r), text(r))
    return {"ok": True}


async def per_agent(args):
    """One tool per agent type (configured): listed, called, and from inside a sub-agent neither
    offered nor run."""
    async with Session(args) as s:
        names = [t.name for t in (await s.list_tools()).tools]
        check({"agent_general", "agent_research", "agent_plan"} <= set(names), names)
        r = await s.call_tool("agent_plan", {"description": "by its own tool",
                                             "prompt": "p [mock:reply=planned]", "model": "mock/m"})
        check(not r.isError and text(r) == "planned", text(r))
        task_id = r.structuredContent["task_id"]
    async with Session(args, headers={"Subagent-Depth": "1"}) as s:
        names = [t.name for t in (await s.list_tools()).tools]
        check(not any(n.startswith("agent_") for n in names) and "task" not in names, names)
        r = await s.call_tool("agent_plan", {"description": "deeper", "prompt": "p", "model": "mock/m"})
        check(r.isError and "recursion_refused" in text(r), text(r))
    return {"task_id": task_id, "tools": names}


async def result_elicit(args):
    """A task-augmented call whose run pauses: tasks/result, called at once, blocks; the pending
    approval is asked through it (with the related task), and then it answers the result."""
    asked = []

    async def on_elicit(ctx, params):
        meta = params.meta.model_dump(by_alias=True) if params.meta else {}
        asked.append({"message": params.message, "related": meta.get("io.modelcontextprotocol/related-task")})
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async with Session(args, elicit=on_elicit) as s:
        created = await s.experimental.call_tool_as_task(
            "task", {"subagent_type": "general", "description": "needs a yes",
                     "prompt": "deploy it [mock:tool_turns=1] [mock:reply=deployed in the background]"})
        task_id = created.task.taskId
        result = await s.experimental.get_task_result(task_id, types.CallToolResult)
        check(len(asked) == 1 and asked[0]["related"] == {"taskId": task_id}, asked)
        check(not result.isError and text(result) == "deployed in the background", text(result))
        got = await s.experimental.get_task(task_id)
        check(got.status == "completed", got)
        return {"task_id": task_id, "asked": asked}


async def list_paging(args):
    """tasks/list pages through all of the tenant's tasks, each once."""
    async with Session(args) as s:
        seen, cursor, pages = [], None, 0
        while True:
            page = await s.experimental.list_tasks(cursor=cursor)
            seen += [t.taskId for t in page.tasks]
            pages += 1
            cursor = page.nextCursor
            if not cursor:
                break
        check(len(seen) == len(set(seen)), "a task listed twice")
        return {"tasks": seen, "pages": pages}


async def live_progress(args):
    """With a progress token, the run's text as it streams comes as progress messages: progress
    always growing, the messages joining into the summary."""
    seen = []

    async def on_progress(p, total, message):
        seen.append((p, message))

    reply = " ".join(f"word{i}" for i in range(40))
    async with Session(args) as s:
        r = await s.call_tool("task", {"subagent_type": "general", "description": "live",
                                       "prompt": f"write [mock:stream_ms=25] [mock:reply={reply}]"},
                              progress_callback=on_progress)
        check(not r.isError and text(r) == reply, text(r))
        values = [p for p, _ in seen]
        check(all(a < b for a, b in zip(values, values[1:])), values)
        live = "".join(m for p, m in seen if p < 1 and m)
        check(live == reply, (live, reply))
        return {"notifications": len(seen)}


async def slow_start(args):
    """With a progress token, a call whose task takes long to be made (the test holds its insert):
    progress from the start, every few seconds however long that takes."""
    seen = []
    loop = asyncio.get_event_loop()
    start = loop.time()

    async def on_progress(p, total, message):
        seen.append((loop.time() - start, message))

    async with Session(args) as s:
        start = loop.time()
        r = await s.call_tool("task", {"subagent_type": "general", "description": "held",
                                       "prompt": "hi [mock:reply=made at last]"},
                              progress_callback=on_progress, read_timeout_seconds=timedelta(seconds=120))
        check(not r.isError and text(r) == "made at last", text(r))
        return {"seconds": loop.time() - start, "progress": seen}


async def environment(args):
    """A general task with an environment (`--image`) over a repository (`--repo`): its schema
    names the field, the task completes; a registry off the allow-list is refused as a tool error."""
    async with Session(args) as s:
        task = {t.name: t for t in (await s.list_tools()).tools}["task"]
        props = task.inputSchema["properties"]
        check("environment" in props, list(props))
        r = await s.call_tool("task", {"subagent_type": "general", "description": "run in the image",
                                       "workspace": {"git": args.repo}, "environment": {"image": args.image},
                                       "prompt": args.prompt})
        check(not r.isError and r.structuredContent["status"] == "completed", text(r))
        bad = await s.call_tool("task", {"subagent_type": "general", "description": "x", "prompt": "x",
                                         "workspace": {"git": args.repo},
                                         "environment": {"image": "10.1.2.3:5000/a/b:1"}})
        check(bad.isError and "environment.image" in text(bad), text(bad))
        return {"task_id": r.structuredContent["task_id"]}


SCENARIOS = {f.__name__: f for f in [list_tools, plain_call, long_call, task_augmented, cancel, elicit,
                                     isolation, depth, replicas, old_version, refusals, per_agent,
                                     result_elicit, list_paging, live_progress, slow_start, environment]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--key2")
    p.add_argument("--urls")
    p.add_argument("--task-id")
    p.add_argument("--answer", default="approve")
    p.add_argument("--header", action="append")
    p.add_argument("--image")
    p.add_argument("--repo")
    p.add_argument("--prompt")
    args = p.parse_args()
    out = asyncio.run(SCENARIOS[args.scenario](args))
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"ASSERTION FAILED: {e}", file=sys.stderr)
        sys.exit(1)
