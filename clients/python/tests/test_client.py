"""The Python client against the real service (tests/api/clients.rs starts it with the mock
provider and runs this): every method, with the sync and the async client alike; a dropped event
stream resumed without gaps or duplicates; a create retried after a dropped connection making one
task; a 429 waited out; problems mapped to their exceptions; a signed webhook verified and a
tampered one refused; the types in step with the API (no field the client does not know).

Environment: SUBAGENTD_URL, SUBAGENTD_API_KEY (a tenant's key), SUBAGENTD_ADMIN_TOKEN.
"""
import asyncio
import http.server
import json
import os
import socket
import threading
import time
import uuid

import pytest

import subagentd
from subagentd import AsyncClient, Client, approve, deny, output, webhooks

URL = os.environ["SUBAGENTD_URL"]
KEY = os.environ["SUBAGENTD_API_KEY"]
ADMIN = os.environ["SUBAGENTD_ADMIN_TOKEN"]
MODEL = "mock/m"


def unique(word):
    return f"{word}-{uuid.uuid4().hex[:8]}"


def no_unknown_fields(obj):
    """Every field the API sent is one the client knows (openapi.yaml documents it)."""
    assert obj.extra == {}, f"{type(obj).__name__} has fields the client does not know: {obj.extra}"
    for name in obj._fields:
        v = obj[name]
        for x in v if isinstance(v, list) else [v]:
            if hasattr(x, "_fields"):
                no_unknown_fields(x)


@pytest.fixture
def client():
    with Client(base_url=URL, api_key=KEY) as c:
        yield c


@pytest.fixture
def admin():
    with Client(base_url=URL, api_key=ADMIN) as c:
        yield c


# ---------------------------------------------------------------- tasks, sync and async alike


def test_run_create_get_wait_list_and_the_ledger(client):
    t = client.tasks.run(prompt="Say hello [mock:reply=hello there]", subagent_type="research", model=MODEL,
                         metadata={"suite": "py"})
    assert isinstance(t, subagentd.Task)
    assert (t.status, t.summary, t.subagent_type) == ("completed", "hello there", "research")
    assert t.usage["total_tokens"] > 0 and t.cost_usd > 0
    no_unknown_fields(t)
    again = client.tasks.get(t.id)
    assert again.id == t.id and again.status == "completed"
    bg = client.tasks.create(prompt="Later [mock:delay_ms=300] [mock:reply=done]", model=MODEL,
                             metadata={"suite": "py"})
    assert bg.status in ("queued", "running")
    waited = client.tasks.wait(bg.id, timeout=30)
    assert waited.status == "completed" and waited.summary == "done"
    # A wait that runs out gives the task as it is.
    slow = client.tasks.create(prompt="Slow [mock:delay_ms=3000]", model=MODEL)
    assert client.tasks.wait(slow.id, timeout=0.2).status in ("queued", "running")
    listed = list(client.tasks.list(metadata={"suite": "py"}, limit=1))
    assert {x.id for x in listed} >= {t.id, bg.id}, "every page, one at a time"
    assert all(isinstance(x, subagentd.Task) for x in listed)
    msgs = client.tasks.messages(t.id)
    assert [m.message["role"] for m in msgs][:2] == ["system", "user"]
    calls = client.tasks.calls(t.id)
    assert calls and calls[0].outcome == "ok" and calls[0].try_ == 1
    for x in msgs + calls:
        no_unknown_fields(x)


@pytest.mark.asyncio
async def test_the_async_client_does_the_same():
    async with AsyncClient(base_url=URL, api_key=KEY) as c:
        t = await c.tasks.run(prompt="Say hi [mock:reply=hi async]", model=MODEL, metadata={"suite": "py-async"})
        assert (t.status, t.summary) == ("completed", "hi async")
        assert (await c.tasks.get(t.id)).status == "completed"
        bg = await c.tasks.create(prompt="Later [mock:delay_ms=200]", model=MODEL, metadata={"suite": "py-async"})
        assert (await c.tasks.wait(bg.id, timeout=30)).status == "completed"
        seen = [x.id async for x in c.tasks.list(metadata={"suite": "py-async"}, limit=1)]
        assert set(seen) == {t.id, bg.id}
        kinds = [e.kind async for e in c.tasks.events(t.id, after=0)]
        assert kinds[0] == "created" and kinds[-1] == "finished"
        assert (await c.tasks.calls(t.id))[0].outcome == "ok"
        assert (await c.tasks.messages(t.id))[0].message["role"] == "system"
        with pytest.raises(subagentd.NotFoundError):
            await c.tasks.get(str(uuid.uuid4()))
        agents = await c.agents.list()
        assert "general" in [a.name for a in agents]


def test_cancel_and_cancel_many(client):
    t = client.tasks.create(prompt="Long [mock:delay_ms=20000]", model=MODEL, metadata={"batch": unique("c")})
    c = client.tasks.cancel(t.id)
    assert c.id == t.id
    assert client.tasks.wait(t.id, timeout=15).status == "cancelled"
    tag = unique("bulk")
    ids = {client.tasks.create(prompt="p [mock:delay_ms=20000]", model=MODEL, metadata={"b": tag}).id for _ in range(2)}
    r = client.tasks.cancel_many(metadata={"b": tag})
    assert set(r.cancelled) | set(r.cancel_requested) == ids
    no_unknown_fields(r)


def test_a_pause_is_answered_with_approve_deny_and_output(client):
    tools = [{"name": "deploy", "description": "Deploys", "parameters": {"type": "object"}, "policy": "propose",
              "endpoint": "http://127.0.0.1:9/never"},
             {"name": "ask_user", "description": "Asks the user", "parameters": {"type": "object"}, "policy": "auto"}]
    # A caller tool's output, then a decision: two pauses.
    t = client.tasks.run(prompt="Ask, then deploy [mock:tool_turns=1] [mock:tool=ask_user,deploy] [mock:reply=all done]",
                         model=MODEL, approval="propose", tools=tools)
    assert t.status == "requires_action", t
    pending = {a.name: a for a in t.pending_actions}
    assert isinstance(pending["deploy"], subagentd.PendingAction)
    answered = client.tasks.answer(t.id, [output(pending["ask_user"].id, {"answer": 42}),
                                          deny(pending["deploy"].id, "not today")])
    assert answered.status in ("queued", "running", "completed")
    done = client.tasks.wait(t.id, timeout=30)
    assert (done.status, done.summary) == ("completed", "all done")
    # An approval through the same helper.
    t = client.tasks.run(prompt="Deploy [mock:tool_turns=1] [mock:tool=deploy] [mock:reply=ok]", model=MODEL,
                         approval="all", tools=tools[:1])
    a = t.pending_actions[0]
    client.tasks.answer(t.id, [approve(a.id)])
    assert client.tasks.wait(t.id, timeout=30).status == "completed"
    # Answered otherwise, after: a conflict, with the problem's fields.
    with pytest.raises(subagentd.ConflictError) as e:
        client.tasks.answer(t.id, [deny(a.id)])
    assert e.value.status == 409 and e.value.code


# ---------------------------------------------------------------- events, live and resumed


class Cutter:
    """A TCP proxy to the service that cuts connections: after `cut_after` bytes of the answer
    (an event stream dropped mid-way), or before any answer (`drop_first`: a request whose
    answer is lost). Counts the connections it served."""

    def __init__(self, cut_after=None, drop_first=0):
        host, port = URL.split("//")[1].split(":")
        self.upstream = (host, int(port))
        self.cut_after, self.drop_first = cut_after, drop_first
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            n = self.connections
            threading.Thread(target=self.pipe, args=(c, n), daemon=True).start()

    def pipe(self, c, n):
        u = socket.create_connection(self.upstream)
        def up():
            try:
                while True:
                    b = c.recv(65536)
                    if not b:
                        break
                    u.sendall(b)
            except OSError:
                pass
        threading.Thread(target=up, daemon=True).start()
        sent = 0
        try:
            while True:
                b = u.recv(65536)
                if not b:
                    break
                if n <= self.drop_first:
                    break  # the request was served; its answer is lost
                if self.cut_after is not None and n == 1 and sent + len(b) > self.cut_after:
                    c.sendall(b[: self.cut_after - sent])
                    break
                c.sendall(b)
                sent += len(b)
        except OSError:
            pass
        finally:
            for s in (c, u):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.sock.close()


def test_a_dropped_event_stream_is_resumed_without_gaps_or_duplicates(client):
    t = client.tasks.create(prompt="Steps [mock:tool_turns=4] [mock:delay_ms=250] [mock:stream_ms=20] [mock:reply=a b c d e]",
                            model=MODEL, max_turns=6)
    cutter = Cutter(cut_after=700)
    try:
        with Client(base_url=cutter.url, api_key=KEY) as c:
            events = list(c.tasks.events(t.id))
    finally:
        cutter.close()
    assert cutter.connections >= 2, "the stream was cut and resumed"
    seqs = [e.seq for e in events if e.kind != "output_delta"]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert events[-1].kind == "finished"
    assert all(isinstance(e, subagentd.Event) for e in events)
    for e in events:
        if e.kind != "output_delta":
            no_unknown_fields(e)


def test_a_create_retried_after_a_dropped_connection_makes_one_task():
    cutter = Cutter(drop_first=1)
    tag = unique("once")
    try:
        with Client(base_url=cutter.url, api_key=KEY) as c:
            t = c.tasks.create(prompt="Once [mock:reply=once]", model=MODEL, metadata={"tag": tag})
    finally:
        cutter.close()
    assert cutter.connections == 2, "the first answer was lost; the create was sent again"
    with Client(base_url=URL, api_key=KEY) as c:
        made = list(c.tasks.list(metadata={"tag": tag}))
    assert [x.id for x in made] == [t.id], "one task"


def test_a_rate_limit_is_waited_out(admin):
    tenant = unique("rl")
    key = admin.admin.keys.create(tenant).key
    admin.admin.tenants.put(tenant, requests_per_second=1, request_burst=1)
    time.sleep(3)  # the limits are cached a few seconds
    with Client(base_url=URL, api_key=key) as c:
        started = time.monotonic()
        for _ in range(3):
            assert c.agents.list()
        assert time.monotonic() - started >= 1.0, "it waited as the service asked"
        no_retry = Client(base_url=URL, api_key=key, retry=subagentd.Retry(max_retries=0))
        with pytest.raises(subagentd.RateLimitError) as e:
            for _ in range(5):
                no_retry.agents.list()
        assert e.value.status == 429 and e.value.retry_after is not None
        no_retry.close()


def test_problems_become_their_exceptions_with_their_fields(client):
    with pytest.raises(subagentd.ValidationError) as e:
        client.tasks.create(prompt="", model=MODEL)
    assert e.value.status == 422 and e.value.code == "validation_failed"
    assert e.value.errors[0]["field"] == "prompt" and e.value.detail
    with pytest.raises(subagentd.ValidationError) as e:
        client.tasks.create(prompt="x", model=MODEL, idempotency_key="\x01bad")
    assert e.value.status == 400
    with pytest.raises(subagentd.NotFoundError) as e:
        client.tasks.get(str(uuid.uuid4()))
    assert e.value.code == "not_found"
    with pytest.raises(subagentd.AuthenticationError) as e:
        Client(base_url=URL, api_key="sk_wrong_key").tasks.get(str(uuid.uuid4()))
    assert e.value.status == 401
    with pytest.raises(subagentd.APIStatusError) as e:
        client.admin.keys.list()
    assert e.value.status in (401, 403)
    with pytest.raises(subagentd.ConflictError):
        key = unique("k")
        client.tasks.create(prompt="a", model=MODEL, idempotency_key=key)
        client.tasks.create(prompt="b", model=MODEL, idempotency_key=key)
    with pytest.raises(subagentd.APIConnectionError):
        Client(base_url="http://127.0.0.1:9", api_key=KEY, retry=subagentd.Retry(max_retries=0)).agents.list()


# ---------------------------------------------------------------- webhooks


class Hook(http.server.BaseHTTPRequestHandler):
    got = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        Hook.got.append((dict(self.headers), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_a_signed_webhook_is_verified_and_a_tampered_one_refused(client):
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = client.tools.rotate_signing_secret()["secret"]
    try:
        t = client.tasks.run(prompt="Hook [mock:reply=hooked]", model=MODEL,
                             webhook_url=f"http://127.0.0.1:{server.server_port}/hook")
        deadline = time.time() + 20
        while not Hook.got and time.time() < deadline:
            time.sleep(0.1)
        headers, body = Hook.got[0]
        webhooks.verify(secret, headers, body)
        event = webhooks.construct_event(secret, headers, body)
        assert event.event == "task.finished" and event.task.id == t.id and event.task.summary == "hooked"
        with pytest.raises(webhooks.WebhookVerificationError):
            webhooks.verify(secret, headers, body.replace(b"hooked", b"hacked"))
        with pytest.raises(webhooks.WebhookVerificationError):
            webhooks.verify("another secret", headers, body)
        old = {k: v for k, v in headers.items() if k.lower() != "subagent-timestamp"}
        old["Subagent-Timestamp"] = str(int(time.time()) - 3600)
        with pytest.raises(webhooks.WebhookVerificationError):
            webhooks.verify(secret, old, body)
    finally:
        server.shutdown()


# ---------------------------------------------------------------- the other resources


def test_agents_tools_sources_schedules_usage_and_admin(client, admin):
    name = unique("triage").lower()
    a = client.agents.put(name, system_prompt="You triage.", description="Sorts tickets", max_turns=3)
    assert (a.name, a.source, a.max_turns) == (name, "api", 3)
    md = f"---\nname: {name}-md\ndescription: From a file\n---\nYou read files.\n"
    b = client.agents.put_markdown(f"{name}-md", md)
    assert b.description == "From a file"
    assert {name, f"{name}-md"} <= {x.name for x in client.agents.list()}
    assert client.agents.get(name).system_prompt == "You triage."
    client.agents.delete(f"{name}-md")
    with pytest.raises(subagentd.NotFoundError):
        client.agents.get(f"{name}-md")
    tool = client.tools.put("lookup", description="Looks up", parameters={"type": "object"},
                            endpoint="http://127.0.0.1:9/lookup")
    assert tool.name == "lookup" and "lookup" in [t.name for t in client.tools.list()]
    assert client.tools.get("lookup").description == "Looks up"
    client.tools.delete("lookup")
    with pytest.raises(subagentd.ValidationError):
        client.tool_sources.put("bad name!", url="http://127.0.0.1:9/mcp")
    assert isinstance(client.tool_sources.list(), list)
    s = client.schedules.put(unique("nightly"), cron="0 3 * * *", timezone="Europe/Paris",
                             task={"prompt": "Nightly digest", "model": MODEL})
    assert s.next_run_at and not s.paused
    assert client.schedules.pause(s.name).paused
    assert not client.schedules.resume(s.name).paused
    assert s.name in [x.name for x in client.schedules.list()]
    assert client.schedules.get(s.name).cron == "0 3 * * *"
    client.schedules.delete(s.name)
    no_unknown_fields(s)
    import io, tarfile
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as t:
        data = b"pub fn retry_policy() {}\n"
        info = tarfile.TarInfo("src/lib.rs")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    wname = unique("code").lower()
    w = client.workspaces.put(wname, raw.getvalue())
    assert (w.files, w.dropped) == (1, []) and w.content_hash.startswith("sha256:")
    no_unknown_fields(w)
    assert client.workspaces.get(wname).content_hash == w.content_hash
    assert wname in [x.name for x in client.workspaces.list()]
    client.workspaces.delete(wname)
    with pytest.raises(subagentd.NotFoundError):
        client.workspaces.get(wname)
    # A named environment: defined, read, listed and removed (its image on a registry that is not
    # there: the build, where the sandbox runs, waits on it, `building`).
    e = client.environments.put(wname, image="127.0.0.1:9/none/base:1", setup="echo ready",
                                network={"allow": ["pypi.org"], "in_runs": False})
    assert (e.name, e.status, e.network_allow) == (wname, "building", ["pypi.org"])
    no_unknown_fields(e)
    assert client.environments.get(wname).definition_hash == e.definition_hash
    assert wname in [x.name for x in client.environments.list()]
    with pytest.raises(subagentd.ValidationError):
        client.environments.put(wname, image="127.0.0.1:9/none/base:1", network={"allow": ["*"]})
    client.environments.delete(wname)
    with pytest.raises(subagentd.NotFoundError):
        client.environments.get(wname)
    sec = client.secrets.put(wname, value="tok", host="git.example.com")
    assert sec.host == "git.example.com" and "tok" not in repr(client.secrets.list())
    client.secrets.delete(wname)
    report = client.usage.get(group_by=["model"])
    assert isinstance(report, subagentd.UsageReport) and report.rows
    assert any(r.model == MODEL for r in report.rows)
    assert client.usage.csv(group_by="model").startswith("day,") or "model" in client.usage.csv(group_by="model")
    tenant = unique("t")
    k = admin.admin.keys.create(tenant, name="ci")
    assert k.key.startswith("sk_") and k.tenant == tenant
    no_unknown_fields(k)
    assert tenant in [x.tenant for x in admin.admin.keys.list(tenant=tenant)]
    limits = admin.admin.tenants.put(tenant, usd_per_day=5, max_running=2)
    assert float(limits.usd_per_day) == 5 and limits.max_running == 2
    view = admin.admin.tenants.get(tenant)
    assert view.limits.max_running == 2 and "queued" in view.use
    assert tenant in admin.admin.tenants.list()
    admin.admin.keys.revoke(k.id)
    with pytest.raises(subagentd.AuthenticationError):
        Client(base_url=URL, api_key=k.key).agents.list()


def test_configuration_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SUBAGENTD_URL", URL)
    monkeypatch.setenv("SUBAGENTD_API_KEY", KEY)
    with Client() as c:
        assert c.base_url == URL.rstrip("/") and c.api_key == KEY
        assert c.agents.list()
