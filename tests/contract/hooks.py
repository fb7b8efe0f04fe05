"""Test data for schemathesis runs against subagentd (tests/api/contract.rs).

The document states every rule that can be checked from one value alone. A few values name
things that must exist in the running service — a configured model, an agent type, a task to
resume, an agent definition whose front matter matches its path — or relate two parameters
(`from` not after `to`); random data cannot hit them. These hooks put in values that exist,
leaving every value of the wrong shape (which the negative cases send) as generated.
"""
import datetime
import json
import os
import uuid

import jsonschema_rs
import schemathesis

MODEL = "mock/m"


def _is_uuid(v):
    try:
        uuid.UUID(str(v))
        return True
    except ValueError:
        return False


# Outbound URLs must pass the operator's allow-list; the run allows loopback only, and this port
# refuses at once (nothing is reached, nothing waits).
LOCAL = "http://127.0.0.1:9/generated"


def _local_urls(body, keys):
    for k in keys:
        if isinstance(body.get(k), str) and "://" in body[k]:
            body[k] = LOCAL


def _valid_schema(body, key):
    # The document asks for "a JSON Schema": the metaschema is too big to inline, so a generated
    # object that is not one (a keyword with a value of the wrong kind) is made one. Only where
    # the document's own rules hold (an output schema says `"type": "object"`), so that the
    # negative cases stay negative.
    v = body.get(key)
    if isinstance(v, dict) and (key != "output_schema" or v.get("type") == "object"):
        try:
            jsonschema_rs.validator_for(v)  # the service's own validator (the Rust crate)
        except Exception:
            body[key] = {"type": "object"}


BUILTIN = {"general", "general-purpose", "research", "explore", "plan"}


def _positive(case):
    meta = getattr(case, "_meta", None)
    mode = getattr(getattr(meta, "generation", None), "mode", "positive")
    return str(getattr(mode, "value", mode)) == "positive"


@schemathesis.hook
def map_case(ctx, case):
    label = f"{case.method.upper()} {case.operation.path}"
    body = case.body
    if case.operation.path.startswith("/a2a"):
        # The document's methods and bodies are 1.0's: a request naming no version is 0.3's,
        # whose methods and bodies have other names and shapes (and whose JSON-RPC errors come in
        # an HTTP 200), as 0.3 clients and the 0.3 conformance suite expect
        # (tests/api/a2a_compat.rs, tck.rs, a2a_clients.rs).
        case.headers = dict(case.headers or {})
        case.headers["A2A-Version"] = "1.0"
    if _positive(case):
        _existing(label, case)
    return case


def _a2a(label, case):
    """A2A: an agent that exists at a per-agent URL, options that exist (none), push URLs the
    allow-list admits."""
    if "{name}" in case.operation.path and isinstance(case.path_parameters, dict):
        case.path_parameters["name"] = "explore"
    body = case.body
    if not isinstance(body, dict):
        return
    if label.endswith("/message:send") or label.endswith("/message:stream"):
        body.pop("metadata", None)
        msg = body.get("message")
        if isinstance(msg, dict):
            msg.pop("metadata", None)
            # A message to an existing task answers its pause: only a paused one takes it.
            msg.pop("taskId", None)
        conf = body.get("configuration")
        if isinstance(conf, dict) and isinstance(conf.get("taskPushNotificationConfig"), dict):
            _local_urls(conf["taskPushNotificationConfig"], ("url",))
    if label.endswith("/pushNotificationConfigs"):
        # The path names the task.
        body.pop("taskId", None)


def _mcp_session():
    """A fresh MCP session of the run's tenant (initialize, as a client does first)."""
    import requests

    r = requests.post(
        os.environ["SUBAGENTD_CONTRACT_URL"] + "/mcp",
        headers={"Authorization": "Bearer " + os.environ["SUBAGENTD_CONTRACT_KEY"]},
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "st", "version": "1"}}},
        timeout=10,
    )
    return r.headers["mcp-session-id"]


def _existing(label, case):
    if case.operation.path.startswith("/a2a"):
        _a2a(label, case)
    body = case.body
    if label in ("POST /mcp", "DELETE /mcp"):
        # A message of a session that exists (each case its own: a DELETE ends it).
        case.headers = dict(case.headers or {})
        case.headers["Mcp-Session-Id"] = _mcp_session()
    if isinstance(body, dict):
        _local_urls(body, ("endpoint", "webhook_url", "url"))
        _valid_schema(body, "parameters")
        _valid_schema(body, "output_schema")
        tools = body.get("tools")
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, dict):
                _local_urls(tool, ("endpoint",))
                _valid_schema(tool, "parameters")
    if label == "POST /tasks" and isinstance(body, dict):
        _task(body)
    if label == "PUT /environments/{name}" and isinstance(body, dict):
        # An image from a registry the guard admits (loopback; nothing listens there: its build
        # fails, the definition stands), and a network list of hosts (a pattern cannot say which
        # strings are hosts).
        if isinstance(body.get("image"), str):
            body["image"] = "127.0.0.1:9/generated:1"
        network = body.get("network")
        if isinstance(network, dict) and isinstance(network.get("allow"), list):
            network["allow"] = [f"host-{i}.example" for i in range(len(network["allow"]))]
    if label == "PUT /schedules/{name}" and isinstance(body, dict):
        # A cron expression whose fields hold values (a pattern sees only their count) and a
        # time zone that exists.
        if isinstance(body.get("cron"), str):
            body["cron"] = "*/5 * * * *"
        if isinstance(body.get("timezone"), str):
            body["timezone"] = "Europe/Berlin"
        task = body.get("task")
        if isinstance(task, dict):
            _local_urls(task, ("webhook_url",))
            _valid_schema(task, "output_schema")
            for tool in task.get("tools") if isinstance(task.get("tools"), list) else []:
                if isinstance(tool, dict):
                    _local_urls(tool, ("endpoint",))
                    _valid_schema(tool, "parameters")
            _task(task)
    if label == "PUT /agents/{name}":
        # A name read back from GET /agents (the stateful phase) may be a built-in's, which the
        # path's schema excludes.
        if (case.path_parameters or {}).get("name") in BUILTIN:
            case.path_parameters["name"] += "-copy"
        name = (case.path_parameters or {}).get("name")
        if isinstance(body, str) and isinstance(name, str):
            prompt = body.strip() or "You help."
            case.body = f"---\nname: {json.dumps(name)}\ndescription: generated\n---\n{prompt}\n"
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]:
            body["model"] = MODEL
    # `tenant` (and grouping by it) is the admin's: the run calls as a tenant.
    if label in ("GET /usage", "GET /tasks") and case.query:
        case.query.pop("tenant", None)
        if isinstance(case.query.get("group_by"), str):
            case.query["group_by"] = ",".join(g for g in case.query["group_by"].split(",") if g.strip() != "tenant")
    if label == "GET /usage" and case.query:
        q = case.query
        if isinstance(q.get("from"), str) and q["from"] > str(q.get("to") or datetime.date.today()):
            if isinstance(q.get("to"), str):
                q["from"], q["to"] = q["to"], q["from"]
            else:
                q["to"] = q["from"]


def _task(body):
    """A task as POST /tasks (or a schedule) takes it: names that exist here."""
    # A workspace the guard admits (loopback; nothing listens there: its run fails, the
    # submission stands). There is no upload or secret to name.
    if isinstance(body.get("workspace"), dict):
        body["workspace"] = {"git": "http://127.0.0.1:9/generated.git"}
    if isinstance(body.get("model"), str) and body["model"]:
        body["model"] = MODEL
    if isinstance(body.get("subagent_type"), str):
        body["subagent_type"] = "general"
    if isinstance(body.get("resume_from"), str) and _is_uuid(body["resume_from"]):
        del body["resume_from"]
    # An environment is where run_command runs (a general task with a workspace), and names an
    # image of an allowed registry or an environment that exists: state a schema cannot hold
    # (tests/api/images.rs covers it).
    body.pop("environment", None)
    # Fallback models that are served here, none the task's own.
    fallbacks = body.get("fallback_models")
    if isinstance(fallbacks, list) and all(isinstance(m, str) for m in fallbacks):
        body["fallback_models"] = [f"mock/fallback-{i}" for i in range(len(fallbacks))]
    # Names of tools the tenant has: it has none.
    allowed = body.get("allowed_tools")
    if isinstance(allowed, list) and all(isinstance(t, str) for t in allowed):
        body["allowed_tools"] = []
