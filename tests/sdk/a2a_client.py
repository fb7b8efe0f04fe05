"""The A2A door as the official Python SDK's client sees it (tests/api/a2a.rs runs this).

    python a2a_client.py SCENARIO --base http://agents.example.com --connect 127.0.0.1:PORT --key sk_...
        [--binding JSONRPC|HTTP+JSON] [--key2 sk_...] [--task-id ID] [--hook URL] [--agent NAME]

The client reaches the service as a deployed one does: by a host name (`--base`), through what
routes that name to the service (`--connect`: every request is sent there, its `Host` and
`Origin` headers still the name's). Each scenario asserts what the client sees and prints one
JSON object of facts for the Rust test to check against the service's own records. A failed
assertion exits non-zero.
"""
import argparse
import asyncio
import json
import sys
import uuid
import warnings

import httpx
from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.utils.errors import A2AError
from a2a.helpers import get_artifact_text, get_data_parts, new_data_part, new_text_part
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

warnings.simplefilter("ignore", DeprecationWarning)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def state(task):
    return TaskState.Name(task.status.state)


def http_client(args, key):
    """An httpx client that sends every request to `--connect` while its URL (and so its Host
    header) names `--base`, with the Origin a browser-based deployment would send."""
    target = httpx.URL(f"http://{args.connect}")
    origin = args.base.rstrip("/")

    async def route(request):
        request.url = request.url.copy_with(scheme="http", host=target.host, port=target.port)

    return httpx.AsyncClient(
        headers={"Authorization": f"Bearer {key}", "Origin": origin},
        timeout=httpx.Timeout(60, read=120),
        event_hooks={"request": [route]},
    )


def message(text=None, task_id="", context_id="", metadata=None, parts=None):
    m = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), task_id=task_id, context_id=context_id,
                parts=parts or [new_text_part(text)])
    if metadata:
        m.metadata.update(metadata)
    return m


class Door:
    """A card resolved at `--base` (or an agent's URL below it) and clients made from it."""

    def __init__(self, args, key=None, base=None):
        self.args, self.key, self.base = args, key or args.key, base or args.base

    async def __aenter__(self):
        self.http = http_client(self.args, self.key)
        await self.http.__aenter__()
        self.card = await A2ACardResolver(self.http, self.base).get_agent_card()
        return self

    async def __aexit__(self, *exc):
        await self.http.__aexit__(*exc)

    def client(self, streaming=False, polling=False):
        config = ClientConfig(httpx_client=self.http, streaming=streaming, polling=polling,
                              supported_protocol_bindings=[self.args.binding])
        return ClientFactory(config).create(self.card)

    async def send(self, msg, streaming=False, configuration=None, polling=False):
        """Every StreamResponse of one send."""
        req = SendMessageRequest(message=msg, configuration=configuration or SendMessageConfiguration())
        out = []
        async for ev in self.client(streaming, polling).send_message(req, context=ClientCallContext(timeout=120)):
            out.append(ev)
        return out


async def until(client, task_id, states, seconds=30):
    deadline = asyncio.get_event_loop().time() + seconds
    while True:
        t = await client.get_task(GetTaskRequest(id=task_id))
        if state(t) in states:
            return t
        check(asyncio.get_event_loop().time() < deadline, f"task {task_id} stayed {state(t)}")
        await asyncio.sleep(0.1)


async def call_in_flight(d, task_id, seconds=30):
    """Until the task's first provider call has started (`GET /tasks/{id}/events`)."""
    deadline = asyncio.get_event_loop().time() + seconds
    while True:
        r = await d.http.get(f"{d.args.base.rstrip('/')}/tasks/{task_id}/events")
        check(r.status_code == 200, r.text)
        if any(e["kind"] == "llm_call_started" for e in r.json()["events"]):
            return
        check(asyncio.get_event_loop().time() < deadline, f"task {task_id} started no provider call")
        await asyncio.sleep(0.05)


async def blocking(args):
    """The card, a blocking send, GetTask with a history length, ListTasks, the errors named."""
    async with Door(args) as d:
        card = d.card
        interfaces = {i.protocol_binding: i.url for i in card.supported_interfaces}
        check(all(i.protocol_version == "1.0" for i in card.supported_interfaces), card.supported_interfaces)
        check(card.capabilities.streaming and card.capabilities.push_notifications, card.capabilities)
        check("bearer" in card.security_schemes, card.security_schemes)
        skills = [s.id for s in card.skills]
        (ev,) = await d.send(message("hello [mock:reply=hello from the sub-agent]",
                                     metadata={"max_turns": 3, "metadata": {"batch": "a2a"}}))
        task = ev.task
        check(state(task) == "TASK_STATE_COMPLETED", task)
        check([get_artifact_text(a) for a in task.artifacts] == ["hello from the sub-agent"], task.artifacts)
        meta = MessageToDict(task.metadata)
        check(meta["stop_reason"] == "final_answer" and meta["usage"]["total_tokens"] > 0, meta)
        c = d.client()
        got = await c.get_task(GetTaskRequest(id=task.id, history_length=1))
        check(len(got.history) == 1 and got.history[0].role == Role.ROLE_AGENT, got.history)
        full = await c.get_task(GetTaskRequest(id=task.id))
        check([m.role for m in full.history] == [Role.ROLE_USER, Role.ROLE_AGENT], full.history)
        listed = await c.list_tasks(ListTasksRequest(page_size=10, status=TaskState.TASK_STATE_COMPLETED))
        check(task.id in [t.id for t in listed.tasks] and listed.total_size >= 1, listed)
        check(all(len(t.artifacts) == 0 for t in listed.tasks), "artifacts only when asked for")
        with_artifacts = await c.list_tasks(ListTasksRequest(page_size=10, include_artifacts=True))
        check(any(len(t.artifacts) for t in with_artifacts.tasks), "artifacts when asked for")
        errors = {}
        try:
            await c.cancel_task(CancelTaskRequest(id=task.id))
        except TaskNotCancelableError as e:
            errors["cancel_completed"] = type(e).__name__
        try:
            await c.get_task(GetTaskRequest(id=str(uuid.uuid4())))
        except TaskNotFoundError as e:
            errors["get_unknown"] = type(e).__name__
        try:
            await c.send_message(SendMessageRequest(message=message("more", task_id=task.id))).__anext__()
        except UnsupportedOperationError as e:
            errors["message_to_ended"] = type(e).__name__
        ext = await d.client().get_extended_agent_card(GetExtendedAgentCardRequest())
        return {"task_id": task.id, "context_id": task.context_id, "interfaces": interfaces, "skills": skills,
                "extended_skills": [s.id for s in ext.skills], "errors": errors}


async def nonblocking(args):
    """returnImmediately: the task at once, then polled with GetTask."""
    async with Door(args) as d:
        (ev,) = await d.send(message("later [mock:delay_ms=1500] [mock:reply=polled]"),
                             configuration=SendMessageConfiguration(return_immediately=True))
        first = state(ev.task)
        check(first in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), first)
        done = await until(d.client(), ev.task.id, ["TASK_STATE_COMPLETED"])
        check(get_artifact_text(done.artifacts[0]) == "polled", done.artifacts)
        return {"task_id": ev.task.id, "first": first}


def kinds(events):
    out = []
    for ev in events:
        k = ev.WhichOneof("payload")
        if k == "status_update":
            out.append(TaskState.Name(ev.status_update.status.state))
        else:
            out.append(k)
    return out


async def stream(args):
    """SendStreamingMessage: the task, working, the artifact, completed; then SubscribeToTask."""
    async with Door(args) as d:
        events = await d.send(message("stream it [mock:tool_turns=1] [mock:delay_ms=300] [mock:reply=streamed]"),
                              streaming=True)
        seen = kinds(events)
        check(seen[0] == "task" and "TASK_STATE_WORKING" in seen, seen)
        check(seen[-2:] == ["artifact_update", "TASK_STATE_COMPLETED"], seen)
        art = [ev.artifact_update.artifact for ev in events if ev.WhichOneof("payload") == "artifact_update"]
        check(get_artifact_text(art[0]) == "streamed", art)
        # The run's text as it streams: an artifact of its own, appended to, apart from the summary's.
        reply = " ".join(f"word{i}" for i in range(40))
        live_events = await d.send(message(f"write [mock:stream_ms=25] [mock:reply={reply}]"), streaming=True)
        ups = [ev.artifact_update for ev in live_events if ev.WhichOneof("payload") == "artifact_update"]
        live = [u for u in ups if u.artifact.artifact_id.startswith("live-output")]
        check(len(live) >= 2 and not live[0].append and all(u.append for u in live[1:]), [(u.artifact.artifact_id, u.append) for u in live])
        check("".join(get_artifact_text(u.artifact) for u in live) == reply, [get_artifact_text(u.artifact) for u in live])
        summary = [u for u in ups if not u.artifact.artifact_id.startswith("live-output")]
        check([get_artifact_text(u.artifact) for u in summary] == [reply], summary)
        # Subscribe to a task already running.
        (ev,) = await d.send(message("slow [mock:delay_ms=1500] [mock:reply=subscribed]"),
                             configuration=SendMessageConfiguration(return_immediately=True))
        sub = []
        async for e in d.client(streaming=True).subscribe(SubscribeToTaskRequest(id=ev.task.id)):
            sub.append(e)
        sub_seen = kinds(sub)
        check(sub_seen[0] == "task" and sub_seen[-1] == "TASK_STATE_COMPLETED", sub_seen)
        try:
            async for _ in d.client(streaming=True).subscribe(SubscribeToTaskRequest(id=ev.task.id)):
                pass
            subscribed_ended = "no error"
        except UnsupportedOperationError as e:
            subscribed_ended = type(e).__name__
        return {"task_id": events[0].task.id, "events": seen, "subscribed": sub_seen, "subscribe_ended": subscribed_ended}


async def cancel(args):
    """A running task canceled: CANCELED."""
    async with Door(args) as d:
        (ev,) = await d.send(message("never mind [mock:delay_ms=30000]"),
                             configuration=SendMessageConfiguration(return_immediately=True))
        c = d.client()
        await until(c, ev.task.id, ["TASK_STATE_WORKING"])
        # WORKING is the claim; the provider call starts a moment later (on a loaded machine,
        # later still). The test asserts that call is stopped, so cancel once it is in flight,
        # as the service's own event log tells (A2A has no word for it).
        await call_in_flight(d, ev.task.id)
        t = await c.cancel_task(CancelTaskRequest(id=ev.task.id))
        if state(t) != "TASK_STATE_CANCELED":
            t = await until(c, ev.task.id, ["TASK_STATE_CANCELED"])
        return {"task_id": ev.task.id, "state": state(t)}


async def pause(args):
    """A run that waits for an approval is input-required; a message answers it; it completes."""
    async with Door(args) as d:
        (ev,) = await d.send(message("deploy it [mock:tool_turns=1] [mock:reply=deployed it]"))
        t = ev.task
        check(state(t) == "TASK_STATE_INPUT_REQUIRED", state(t))
        (asked,) = get_data_parts(t.status.message.parts)
        action = asked["actions"][0]
        check(action["name"] == "deploy" and action["kind"] == "approval", asked)
        text = t.status.message.parts[0].text
        check(action["id"] in text and "decision" in text, text)
        answer = message(task_id=t.id, parts=[new_data_part({"actions": [{"id": action["id"], "decision": "approve"}]})])
        (done,) = await d.send(answer)
        check(state(done.task) == "TASK_STATE_COMPLETED", done.task)
        check(get_artifact_text(done.task.artifacts[0]) == "deployed it", done.task.artifacts)
        full = await d.client().get_task(GetTaskRequest(id=t.id))
        roles = [Role.Name(m.role) for m in full.history]
        check(roles == ["ROLE_USER", "ROLE_USER", "ROLE_AGENT"], roles)
        # A streamed send stops at the pause, and a streamed answer follows the run to its end.
        events = await d.send(message("deploy again [mock:tool_turns=1] [mock:reply=again]"), streaming=True)
        seen = kinds(events)
        check(seen[-1] == "TASK_STATE_INPUT_REQUIRED", seen)
        paused = events[-1].status_update
        (asked,) = get_data_parts(paused.status.message.parts)
        answer = message(task_id=paused.task_id,
                         parts=[new_data_part({"actions": [{"id": asked["actions"][0]["id"], "decision": "deny",
                                                            "message": "not today"}]})])
        rest = kinds(await d.send(answer, streaming=True))
        check(rest[0] == "task" and rest[-1] == "TASK_STATE_COMPLETED", rest)
        return {"task_id": t.id, "action_id": action["id"], "denied_task_id": paused.task_id, "streamed": seen + rest}


async def context(args):
    """A message with only the contextId continues the context's latest task."""
    async with Door(args) as d:
        (one,) = await d.send(message("remember the word kumquat [mock:reply=noted]"))
        ctx = one.task.context_id
        (two,) = await d.send(message("what was the word? [mock:reply=kumquat]", context_id=ctx))
        check(two.task.context_id == ctx and two.task.id != one.task.id, (one.task, two.task))
        check(state(two.task) == "TASK_STATE_COMPLETED", two.task)
        listed = await d.client().list_tasks(ListTasksRequest(context_id=ctx))
        check(sorted(t.id for t in listed.tasks) == sorted([one.task.id, two.task.id]), listed)
        # Retried with the same messageId: the same task, not a second one.
        msg = message("once [mock:reply=once]")
        (a,) = await d.send(msg)
        (b,) = await d.send(msg)
        check(a.task.id == b.task.id, (a.task.id, b.task.id))
        return {"first": one.task.id, "second": two.task.id, "context_id": ctx, "retried": a.task.id}


async def push(args):
    """Push configs: inline with a send, and created, read, listed and deleted by their methods."""
    async with Door(args) as d:
        config = TaskPushNotificationConfig(url=args.hook, token="tok-123",
                                            authentication=AuthenticationInfo(scheme="Bearer", credentials="hook-secret"))
        (ev,) = await d.send(message("push me [mock:delay_ms=2000] [mock:reply=pushed]"),
                             configuration=SendMessageConfiguration(return_immediately=True,
                                                                    task_push_notification_config=config))
        c = d.client()
        made = await c.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=ev.task.id, id="second", url=args.hook, token="tok-456"))
        check(made.id == "second" and made.task_id == ev.task.id, made)
        got = await c.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=ev.task.id, id="second"))
        check(got.url == args.hook and got.token == "tok-456", got)
        listed = await c.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=ev.task.id))
        check(len(listed.configs) == 2, listed)
        await c.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=ev.task.id, id="second"))
        await c.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=ev.task.id, id="second"))
        listed = await c.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=ev.task.id))
        check(len(listed.configs) == 1, listed)
        try:
            await c.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=ev.task.id, id="second"))
            gone = "found"
        except TaskNotFoundError:
            gone = "not found"
        await until(c, ev.task.id, ["TASK_STATE_COMPLETED"])
        return {"task_id": ev.task.id, "deleted": gone}


async def isolation(args):
    """Another tenant's task: not found by any method."""
    async with Door(args, key=args.key2) as d:
        c = d.client()
        found = {}
        for name, call in [
            ("get", lambda: c.get_task(GetTaskRequest(id=args.task_id))),
            ("cancel", lambda: c.cancel_task(CancelTaskRequest(id=args.task_id))),
            ("push", lambda: c.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=args.task_id, url=args.hook or "http://127.0.0.1:9/x"))),
            ("answer", lambda: d.send(message("hi", task_id=args.task_id))),
        ]:
            try:
                await call()
                found[name] = "found"
            except TaskNotFoundError:
                found[name] = "not found"
        listed = await c.list_tasks(ListTasksRequest())
        check(args.task_id not in [t.id for t in listed.tasks], "listed another tenant's task")
        return {"found": found}


async def rejected(args):
    """An admission refusal: a REJECTED task with the reason, not stored."""
    async with Door(args) as d:
        (ev,) = await d.send(message("too much [mock:reply=x]"))
        check(state(ev.task) == "TASK_STATE_REJECTED", ev.task)
        reason = ev.task.status.message.parts[0].text
        try:
            await d.client().get_task(GetTaskRequest(id=ev.task.id))
            stored = "found"
        except TaskNotFoundError:
            stored = "not found"
        return {"reason": reason, "stored": stored}


async def agent(args):
    """An agent type as an agent of its own: its card, its URL, its tasks."""
    base = f"{args.base.rstrip('/')}/a2a/agents/{args.agent}"
    async with Door(args, base=base) as d:
        check(d.card.name == args.agent and [s.id for s in d.card.skills] == [args.agent], d.card)
        (ev,) = await d.send(message("look around [mock:reply=looked]"))
        check(state(ev.task) == "TASK_STATE_COMPLETED", ev.task)
        meta = MessageToDict(ev.task.metadata)
        listed = await d.client().list_tasks(ListTasksRequest())
        return {"task_id": ev.task.id, "subagent_type": meta["subagent_type"],
                "interfaces": [i.url for i in d.card.supported_interfaces],
                "listed_types": sorted({MessageToDict(t.metadata)["subagent_type"] for t in listed.tasks})}


async def refused(args):
    """Bad input: the errors the spec names, and nothing started."""
    async with Door(args) as d:
        out = {}
        for name, msg in [
            ("image", message(parts=[Part(url="https://x.example/a.png", media_type="image/png")])),
            ("unknown_type", message("x", metadata={"subagent_type": "nosuch"})),
            ("unknown_option", message("x", metadata={"colour": "blue"})),
            ("unknown_model", message("x", metadata={"model": "nosuch/model"})),
        ]:
            try:
                await d.send(msg)
                out[name] = "accepted"
            except (A2AError, A2AClientError) as e:
                out[name] = type(e).__name__
        return out


async def details(args):
    """The mapping's finer points: data parts join the prompt as JSON; no model anywhere is
    refused; a budget stop is COMPLETED with its stop reason; a context whose latest task still
    runs takes no message; ListTasks pages (nextPageToken) and filters by status time."""
    m = {"model": "mock/m"}
    async with Door(args) as d:
        c = d.client()
        out = {}
        try:
            await d.send(message("no model named"))
            out["no_model"] = "accepted"
        except (A2AError, A2AClientError) as e:
            out["no_model"] = type(e).__name__
        (ev,) = await d.send(message(metadata=m, parts=[new_text_part("file this ticket [mock:reply=filed]"),
                                                        new_data_part({"ticket": 42, "tags": ["urgent"]})]))
        check(state(ev.task) == "TASK_STATE_COMPLETED", ev.task)
        out["data_task"] = ev.task.id
        (ev,) = await d.send(message("too dear", metadata={**m, "max_cost_usd": 0.000001}))
        meta = MessageToDict(ev.task.metadata)
        check(state(ev.task) == "TASK_STATE_COMPLETED" and meta["stop_reason"] == "budget", (state(ev.task), meta))
        out["budget_task"] = ev.task.id
        (slow,) = await d.send(message("slow [mock:delay_ms=3000]", metadata=m),
                               configuration=SendMessageConfiguration(return_immediately=True))
        try:
            await d.send(message("and then?", context_id=slow.task.context_id, metadata=m))
            out["context_running"] = "accepted"
        except (A2AError, A2AClientError) as e:
            out["context_running"] = type(e).__name__
        await until(c, slow.task.id, ["TASK_STATE_COMPLETED"])
        out["slow_task"] = slow.task.id
        # Pages of two, every task once; then only what changed after the budget task ended.
        seen, token, pages = [], "", 0
        while True:
            page = await c.list_tasks(ListTasksRequest(page_size=2, page_token=token))
            seen += [t.id for t in page.tasks]
            pages += 1
            token = page.next_page_token
            if not token:
                break
        check(len(seen) == len(set(seen)) == page.total_size, (seen, page.total_size))
        out["listed"], out["pages"] = seen, pages
        budget = await c.get_task(GetTaskRequest(id=out["budget_task"]))
        after = await c.list_tasks(ListTasksRequest(status_timestamp_after=budget.status.timestamp))
        out["after"] = [t.id for t in after.tasks]
        return out


async def environment(args):
    """A message whose metadata names a workspace (`--repo`) and an environment (`--image`): the
    task completes; a registry off the allow-list is refused and starts nothing."""
    async with Door(args) as d:
        (ev,) = await d.send(message(args.prompt, metadata={"workspace": {"git": args.repo},
                                                            "environment": {"image": args.image}}))
        check(state(ev.task) == "TASK_STATE_COMPLETED", ev.task)
        try:
            await d.send(message("x", metadata={"workspace": {"git": args.repo},
                                                "environment": {"image": "10.1.2.3:5000/a/b:1"}}))
            refused = "accepted"
        except (A2AError, A2AClientError) as e:
            refused = f"{type(e).__name__}: {e}"
        return {"task_id": ev.task.id, "refused": refused}


SCENARIOS = {f.__name__: f for f in [blocking, nonblocking, stream, cancel, pause, context, push, isolation,
                                      rejected, agent, refused, details, environment]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--base", required=True)
    p.add_argument("--connect", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--key2")
    p.add_argument("--binding", default="JSONRPC")
    p.add_argument("--task-id")
    p.add_argument("--hook")
    p.add_argument("--agent")
    p.add_argument("--image")
    p.add_argument("--repo")
    p.add_argument("--prompt")
    args = p.parse_args()
    facts = asyncio.run(SCENARIOS[args.scenario](args))
    print(json.dumps(facts))


if __name__ == "__main__":
    sys.exit(main())
