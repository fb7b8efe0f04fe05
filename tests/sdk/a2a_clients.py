"""subagentd's A2A door as the clients people use see it.

    python a2a_clients.py SCENARIO --url BASE_URL [--key KEY] [--agent NAME]

Scenarios:
  adk    Google ADK's RemoteA2aAgent (resolving the agent card at BASE_URL), run through ADK's
         Runner with an InMemorySessionService as the root agent. Works under ADK 1.x with
         a2a-sdk 0.3.x (A2A 0.3) and ADK 2.x with a2a-sdk 1.x (A2A 1.0): the A2A wire version is
         the installed a2a-sdk's, not this script's choice.
  sdk03  a2a-sdk 0.3.x's own client (ClientFactory; JSON-RPC, or HTTP+JSON with --transport rest): a blocking
         `message/send`, then a slow one with `blocking: false`, `tasks/get`, `tasks/cancel`.
         Needs a2a-sdk 0.3.x (the a2a03 venv); under 1.x it exits 2 and says so.

BASE_URL is the service's root (http://127.0.0.1:18090): the card is read at
BASE_URL/.well-known/agent-card.json, or with --agent NAME at
BASE_URL/a2a/agents/NAME/.well-known/agent-card.json. A full card URL (ending in .json) is
taken as it is. With --key, every request (the card's too) carries `Authorization: Bearer KEY`.

Prints one JSON object of facts on stdout. A failed check exits 1, with a JSON object that has
`"ok": false` and the `error` on stdout and the traceback on stderr.
"""
import argparse
import asyncio
import importlib.metadata
import json
import sys
import traceback
import uuid
import warnings
from urllib.parse import urlparse

import httpx

warnings.simplefilter("ignore", DeprecationWarning)
warnings.simplefilter("ignore", UserWarning)  # ADK's "[EXPERIMENTAL] ..." warnings

TIMEOUT = httpx.Timeout(60, read=120)


class CheckFailed(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what if isinstance(what, str) else repr(what))


def version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions():
    return {d: version(d) for d in ("google-adk", "a2a-sdk", "httpx")}


def a2a_major():
    return int(version("a2a-sdk").split(".")[0])


def card_url(args):
    if args.url.endswith(".json"):
        return args.url
    base = args.url.rstrip("/")
    if args.agent:
        base += f"/a2a/agents/{args.agent}"
    return base + "/.well-known/agent-card.json"


WIRE = []  # what the client sent: method, path, its A2A-Version header, its JSON-RPC method


def http_client(args):
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}

    async def record(request):
        rpc = None
        if request.method == "POST":
            try:
                rpc = json.loads(request.content).get("method")
            except Exception:
                pass
        WIRE.append({"request": f"{request.method} {request.url.path}",
                     "a2a_version": request.headers.get("a2a-version"), "rpc": rpc})

    async def status(response):
        WIRE.append({"response": response.status_code, "to": response.request.url.path})

    return httpx.AsyncClient(headers=headers, timeout=TIMEOUT,
                             event_hooks={"request": [record], "response": [status]})


# --------------------------------------------------------------------------------------------
# adk: RemoteA2aAgent as the Runner's root agent
# --------------------------------------------------------------------------------------------

def event_text(ev):
    if ev.content is None or not ev.content.parts:
        return ""
    return "".join(p.text for p in ev.content.parts if getattr(p, "text", None) and not getattr(p, "thought", False))


async def adk(args):
    # The import path is the same in ADK 1.x and 2.x (2.x re-exports it from google.adk.a2a.agent).
    from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types as genai_types

    adk_major = int(version("google-adk").split(".")[0])
    # ADK 1.x only speaks a2a-sdk 0.3; ADK 2.x speaks either generation (google/adk/a2a/_compat.py).
    check(adk_major >= 2 or a2a_major() == 0, f"ADK {version('google-adk')} needs a2a-sdk 0.3, got {version('a2a-sdk')}")
    url = card_url(args)
    reply = "hello from adk"
    async with http_client(args) as http:
        # `httpx_client` is accepted by both major versions (1.x marks it deprecated in favour of
        # a2a_client_factory, whose ClientConfig differs between a2a-sdk 0.3 and 1.x; the agent
        # builds that config itself, the version-correct one, from this client).
        agent = RemoteA2aAgent(name="subagentd", agent_card=url, httpx_client=http,
                               description="subagentd over A2A")
        sessions = InMemorySessionService()
        runner = Runner(app_name="a2a-clients", agent=agent, session_service=sessions)
        session = await sessions.create_session(app_name="a2a-clients", user_id="tester")
        msg = genai_types.Content(role="user", parts=[genai_types.Part(text=f"say hello [mock:reply={reply}]")])
        events = []
        async for ev in runner.run_async(user_id="tester", session_id=session.id, new_message=msg):
            events.append(ev)
        if hasattr(runner, "close"):
            await runner.close()
    check(events, "the runner yielded no event")
    errors = [ev.error_message for ev in events if getattr(ev, "error_message", None)]
    check(not errors, f"error events: {errors}")
    texts = [t for t in (event_text(ev) for ev in events) if t]
    final = events[-1]
    final_text = event_text(final)
    meta = dict(getattr(final, "custom_metadata", None) or {})
    facts = {
        "scenario": "adk",
        "versions": versions(),
        "card_url": url,
        "card_rpc_url": _adk_card_url(agent),
        "events": len(events),
        "authors": [ev.author for ev in events],
        "texts": texts,
        "final_text": final_text,
        "final_is_final_response": final.is_final_response(),
        "task_id": meta.get("a2a:task_id"),
        "context_id": meta.get("a2a:context_id"),
    }
    check(reply in final_text, f"final event's text {final_text!r} lacks {reply!r} (texts: {texts})")
    return facts


def _adk_card_url(agent):
    card = getattr(agent, "_agent_card", None)
    if card is None:
        return None
    if a2a_major() == 0:
        return card.url
    return [i.url for i in card.supported_interfaces]


# --------------------------------------------------------------------------------------------
# sdk03: a2a-sdk 0.3's ClientFactory client over JSON-RPC
# --------------------------------------------------------------------------------------------

def parts_text(parts):
    # 0.3: Part is a RootModel over TextPart | FilePart | DataPart.
    return "".join(getattr(p.root, "text", "") or "" for p in parts or [])


def answer_text(result):
    """The answer in a send's result: a Message's text, else the task's artifacts' (subagentd
    puts the summary there), else its status message's."""
    from a2a.types import Message
    if isinstance(result, Message):
        return parts_text(result.parts)
    task = result
    text = "".join(parts_text(a.parts) for a in task.artifacts or [])
    if not text and task.status.message:
        text = parts_text(task.status.message.parts)
    return text


def one_result(events):
    """A non-streaming send yields exactly one item: a (Task, None) pair or a Message."""
    from a2a.types import Message
    check(len(events) == 1, f"expected one result, got {len(events)}: {events}")
    (ev,) = events
    return ev if isinstance(ev, Message) else ev[0]


async def sdk03(args):
    if a2a_major() != 0:
        print(json.dumps({"scenario": "sdk03", "ok": False, "versions": versions(),
                          "error": "sdk03 needs a2a-sdk 0.3.x (the a2a03 venv)"}))
        sys.exit(2)
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types import (
        Message,
        MessageSendConfiguration,
        Part,
        Role,
        Task,
        TaskIdParams,
        TaskQueryParams,
        TaskState,
        TextPart,
        TransportProtocol,
    )

    def message(text):
        return Message(role=Role.user, message_id=str(uuid.uuid4()), parts=[Part(root=TextPart(text=text))])

    url = card_url(args)
    u = urlparse(url)
    facts = {"scenario": "sdk03", "versions": versions(), "card_url": url}
    async with http_client(args) as http:
        card = await A2ACardResolver(http, f"{u.scheme}://{u.netloc}").get_agent_card(relative_card_path=u.path)
        facts["card"] = {
            "url": card.url,
            "preferredTransport": card.preferred_transport,
            "protocolVersion": card.protocol_version,
            "additionalInterfaces": [(i.transport, i.url) for i in card.additional_interfaces or []],
            "streaming": card.capabilities.streaming,
        }
        transport = TransportProtocol.http_json if args.transport == "rest" else TransportProtocol.jsonrpc
        config = ClientConfig(httpx_client=http, streaming=False, polling=False,
                              supported_transports=[transport])
        client = ClientFactory(config).create(card)
        facts["transport"] = type(client._transport).__name__
        facts["rpc_url"] = client._transport.url

        # message/send, blocking (the default: ClientConfig.polling is False).
        reply = "hello from sdk03"
        result = one_result([ev async for ev in client.send_message(message(f"say hello [mock:reply={reply}]"))])
        text = answer_text(result)
        facts["blocking"] = {"kind": result.kind, "text": text}
        if isinstance(result, Task):
            facts["blocking"].update(task_id=result.id, context_id=result.context_id,
                                     state=result.status.state.value)
            check(result.status.state == TaskState.completed, f"blocking send ended {result.status.state}")
        check(reply in text, f"blocking answer {text!r} lacks {reply!r}")

        # message/send with blocking false: the task at once, still running.
        slow = one_result([ev async for ev in client.send_message(
            message("take your time [mock:delay_ms=20000] [mock:reply=too late]"),
            configuration=MessageSendConfiguration(blocking=False))])
        check(isinstance(slow, Task), f"a non-blocking send answered {slow!r}, not a task")
        first = slow.status.state
        check(first in (TaskState.submitted, TaskState.working), f"non-blocking send's task is {first}")

        # tasks/get, until it runs.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            got = await client.get_task(TaskQueryParams(id=slow.id))
            if got.status.state == TaskState.working:
                break
            check(got.status.state == TaskState.submitted, f"task {slow.id} went {got.status.state}")
            check(asyncio.get_running_loop().time() < deadline, f"task {slow.id} stayed {got.status.state}")
            await asyncio.sleep(0.1)
        check(got.id == slow.id and got.context_id == slow.context_id, (got, slow))

        # tasks/cancel: canceled (at once, or by the next tasks/get).
        canceled = await client.cancel_task(TaskIdParams(id=slow.id))
        cancel_answer = canceled.status.state
        deadline = asyncio.get_running_loop().time() + 30
        while canceled.status.state != TaskState.canceled:
            check(asyncio.get_running_loop().time() < deadline, f"task {slow.id} stayed {canceled.status.state}")
            await asyncio.sleep(0.1)
            canceled = await client.get_task(TaskQueryParams(id=slow.id))
        facts["nonblocking"] = {"task_id": slow.id, "first": first.value, "got": got.status.state.value,
                                "cancel_answer": cancel_answer.value, "state": canceled.status.state.value}
        await client.close()
    return facts


SCENARIOS = {"adk": adk, "sdk03": sdk03}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--url", required=True, help="the service's base URL (or a full agent card URL)")
    p.add_argument("--key", help="an API key, sent as a bearer token")
    p.add_argument("--agent", help="an agent type: use its own card, /a2a/agents/NAME/...")
    p.add_argument("--transport", choices=["jsonrpc", "rest"], default="jsonrpc",
                   help="sdk03: the binding the client uses (JSON-RPC, or HTTP+JSON)")
    args = p.parse_args()
    try:
        facts = asyncio.run(SCENARIOS[args.scenario](args))
    except Exception as e:  # a failed check, or the client's own error: name it, then fail
        traceback.print_exc()
        chain = []
        while e is not None and len(chain) < 5:
            chain.append(f"{type(e).__module__}.{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        print(json.dumps({"scenario": args.scenario, "ok": False, "versions": versions(), "error": chain,
                          "wire": WIRE}))
        return 1
    facts["ok"] = True
    facts["wire"] = WIRE
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
