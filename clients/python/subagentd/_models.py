"""The API's types, made from openapi.yaml by clients/gen.py: do not edit by hand."""
# fmt: off
from __future__ import annotations

import dataclasses as _dc
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ._model import Model


@dataclass(repr=False)
class Task(Model):
    """A Task as the API shows it."""

    id: Optional[str] = None
    tenant: Optional[str] = None
    status: Optional[str] = None
    stop_reason: Optional[str] = None
    subagent_type: Optional[str] = None
    description: Optional[str] = None
    model: Optional[str] = None
    fallback_models: Optional[List[str]] = None
    fallback_on: Optional[List[str]] = None
    answered_model: Optional[str] = None
    priority: Optional[str] = None
    run_at: Optional[str] = None
    prompt: Optional[str] = None
    max_turns: Optional[int] = None
    tools: Optional[List[str]] = None
    workspace: Optional[Dict[str, Any]] = None
    environment: Optional[Dict[str, Any]] = None
    diff: Optional[DiffStats] = None
    summary: Optional[str] = None
    output: Optional[Any] = None
    error: Optional[Dict[str, Any]] = None
    turns: Optional[int] = None
    usage: Optional[Dict[str, Any]] = None
    cost_usd: Optional[float] = None
    cost_complete: Optional[bool] = None
    usage_estimated: Optional[bool] = None
    waiting_for: Optional[str] = None
    pending_actions: Optional[List[PendingAction]] = None
    attempt: Optional[int] = None
    metadata: Optional[Dict[str, Any]] = None
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    queue_ms: Optional[int] = None
    run_ms: Optional[int] = None
    parent_task_id: Optional[str] = None
    trace_id: Optional[str] = None
    webhook: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["id", "tenant", "status", "stop_reason", "subagent_type", "description", "model", "fallback_models", "fallback_on", "answered_model", "priority", "run_at", "prompt", "max_turns", "tools", "workspace", "environment", "diff", "summary", "output", "error", "turns", "usage", "cost_usd", "cost_complete", "usage_estimated", "waiting_for", "pending_actions", "attempt", "metadata", "created_at", "started_at", "finished_at", "queue_ms", "run_ms", "parent_task_id", "trace_id", "webhook"]
    _nested = {"diff": ("DiffStats", False), "pending_actions": ("PendingAction", True)}
    _required = ["attempt", "cost_complete", "cost_usd", "created_at", "id", "metadata", "model", "prompt", "status", "subagent_type", "turns", "usage"]

@dataclass(repr=False)
class PendingAction(Model):
    """What a paused run waits for, answered by its `id` (POST /tasks/{id}/actions)."""

    id: Optional[str] = None
    tool_call_id: Optional[str] = None
    kind: Optional[str] = None
    name: Optional[str] = None
    arguments: Optional[Any] = None
    turn: Optional[int] = None
    created_at: Optional[str] = None
    expires_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["id", "tool_call_id", "kind", "name", "arguments", "turn", "created_at", "expires_at"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class TaskPage(Model):
    """A page of tasks, newest first."""

    tasks: Optional[List[Task]] = None
    next_cursor: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["tasks", "next_cursor"]
    _nested = {"tasks": ("Task", True)}
    _required = ["next_cursor", "tasks"]

@dataclass(repr=False)
class Event(Model):
    """One event of a task's log."""

    seq: Optional[int] = None
    kind: Optional[str] = None
    data: Optional[Dict[str, Any]] = None
    created_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["seq", "kind", "data", "created_at"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class EventsPage(Model):
    """A page of a task's events."""

    events: Optional[List[Event]] = None
    next_after: Optional[int] = None
    task_status: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["events", "next_after", "task_status"]
    _nested = {"events": ("Event", True)}
    _required = ["events", "next_after", "task_status"]

@dataclass(repr=False)
class Message(Model):
    """One message of a task's saved conversation."""

    seq: Optional[int] = None
    turn: Optional[int] = None
    message: Optional[Dict[str, Any]] = None
    created_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["seq", "turn", "message", "created_at"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class Call(Model):
    """One provider call attempt, as the ledger records it."""

    turn: Optional[int] = None
    attempt: Optional[int] = None
    try_: Optional[int] = None
    provider: Optional[str] = None
    model: Optional[str] = None
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    cache_write_tokens: Optional[int] = None
    web_searches: Optional[int] = None
    cost_usd: Optional[float] = None
    latency_ms: Optional[int] = None
    http_status: Optional[int] = None
    outcome: Optional[str] = None
    error: Optional[str] = None
    usage_estimated: Optional[bool] = None
    created_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["turn", "attempt", "try", "provider", "model", "input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens", "web_searches", "cost_usd", "latency_ms", "http_status", "outcome", "error", "usage_estimated", "created_at"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class CancelledMany(Model):
    """What a bulk cancel did."""

    cancelled: Optional[List[str]] = None
    cancel_requested: Optional[List[str]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["cancelled", "cancel_requested"]
    _nested = {}
    _required = ["cancel_requested", "cancelled"]

@dataclass(repr=False)
class Agent(Model):
    """A Agent as the API shows it."""

    name: Optional[str] = None
    source: Optional[str] = None
    description: Optional[str] = None
    system_prompt: Optional[str] = None
    tools: Optional[Any] = None
    builtin_tools: Optional[List[str]] = None
    disallowed_tools: Optional[List[str]] = None
    model: Optional[str] = None
    max_turns: Optional[int] = None
    max_output_tokens: Optional[int] = None
    approval: Optional[str] = None
    read_only: Optional[bool] = None
    output_schema: Optional[Dict[str, Any]] = None
    fallback_models: Optional[List[str]] = None
    fallback_on: Optional[List[str]] = None
    priority: Optional[str] = None
    claude_code: Optional[Dict[str, Any]] = None
    warnings: Optional[List[str]] = None
    unmatched_tools: Optional[List[str]] = None
    tool_mapping: Optional[List[Dict[str, Any]]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "source", "description", "system_prompt", "tools", "builtin_tools", "disallowed_tools", "model", "max_turns", "max_output_tokens", "approval", "read_only", "output_schema", "fallback_models", "fallback_on", "priority", "claude_code", "warnings", "unmatched_tools", "tool_mapping"]
    _nested = {}
    _required = ["name", "source"]

@dataclass(repr=False)
class Tool(Model):
    """A Tool as the API shows it."""

    name: Optional[str] = None
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None
    policy: Optional[str] = None
    source: Optional[str] = None
    endpoint: Optional[str] = None
    run_by: Optional[str] = None
    timeout_ms: Optional[int] = None
    tool_source: Optional[str] = None
    mcp_tool: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "description", "parameters", "policy", "source", "endpoint", "run_by", "timeout_ms", "tool_source", "mcp_tool"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class ToolSource(Model):
    """A ToolSource as the API shows it."""

    name: Optional[str] = None
    url: Optional[str] = None
    headers: Optional[List[str]] = None
    tools: Optional[List[Tool]] = None
    refreshed_at: Optional[str] = None
    last_error: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "url", "headers", "tools", "refreshed_at", "last_error"]
    _nested = {"tools": ("Tool", True)}
    _required = []

@dataclass(repr=False)
class UsageRow(Model):
    """Calls, tokens and cost of one group (the columns not grouped by are null)."""

    day: Optional[str] = None
    tenant: Optional[str] = None
    model: Optional[str] = None
    agent_type: Optional[str] = None
    api_key: Optional[str] = None
    calls: Optional[int] = None
    ok: Optional[int] = None
    failed: Optional[int] = None
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    cache_write_tokens: Optional[int] = None
    cost_usd: Optional[float] = None
    estimated_calls: Optional[int] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["day", "tenant", "model", "agent_type", "api_key", "calls", "ok", "failed", "input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens", "cost_usd", "estimated_calls"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class UsageReport(Model):
    """Usage over the days asked, grouped."""

    from_: Optional[str] = None
    to: Optional[str] = None
    group_by: Optional[List[str]] = None
    rows: Optional[List[UsageRow]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["from", "to", "group_by", "rows"]
    _nested = {"rows": ("UsageRow", True)}
    _required = ["from", "group_by", "rows", "to"]

@dataclass(repr=False)
class Key(Model):
    """An API key (never the key itself)."""

    id: Optional[str] = None
    tenant: Optional[str] = None
    prefix: Optional[str] = None
    name: Optional[str] = None
    created_at: Optional[str] = None
    revoked_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["id", "tenant", "prefix", "name", "created_at", "revoked_at"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class NewKey(Model):
    """A new API key, with the key itself (shown only in this answer)."""

    id: Optional[str] = None
    tenant: Optional[str] = None
    prefix: Optional[str] = None
    name: Optional[str] = None
    created_at: Optional[str] = None
    revoked_at: Optional[str] = None
    key: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["id", "tenant", "prefix", "name", "created_at", "revoked_at", "key"]
    _nested = {}
    _required = ["id", "key", "prefix", "tenant"]

@dataclass(repr=False)
class Limits(Model):
    """A Limits as the API shows it."""

    usd_per_day: Optional[float] = None
    usd_per_month: Optional[float] = None
    tokens_per_day: Optional[int] = None
    max_running: Optional[int] = None
    max_queued: Optional[int] = None
    max_task_cost_usd: Optional[float] = None
    max_task_tokens: Optional[int] = None
    max_task_turns: Optional[int] = None
    max_task_timeout_seconds: Optional[int] = None
    approval: Optional[str] = None
    requests_per_second: Optional[float] = None
    request_burst: Optional[int] = None
    max_streams: Optional[int] = None
    max_waits: Optional[int] = None
    fallback_models: Optional[List[str]] = None
    max_scheduled: Optional[int] = None
    priority: Optional[str] = None
    builtin_tools_off: Optional[List[str]] = None
    web_tools_policy: Optional[str] = None
    web_fetches_per_minute: Optional[int] = None
    private_workspace_web: Optional[str] = None
    web_fetch_domains: Optional[List[str]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["usd_per_day", "usd_per_month", "tokens_per_day", "max_running", "max_queued", "max_task_cost_usd", "max_task_tokens", "max_task_turns", "max_task_timeout_seconds", "approval", "requests_per_second", "request_burst", "max_streams", "max_waits", "fallback_models", "max_scheduled", "priority", "builtin_tools_off", "web_tools_policy", "web_fetches_per_minute", "private_workspace_web", "web_fetch_domains"]
    _nested = {}
    _required = []

@dataclass(repr=False)
class TenantView(Model):
    """A tenant's limits, its use now, and the configured defaults of the limits it does not set."""

    name: Optional[str] = None
    limits: Optional[Limits] = None
    use: Optional[Dict[str, Any]] = None
    defaults: Optional[Dict[str, Any]] = None
    storage: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "limits", "use", "defaults", "storage"]
    _nested = {"limits": ("Limits", False)}
    _required = ["defaults", "limits", "name", "storage", "use"]

@dataclass(repr=False)
class Schedule(Model):
    """A Schedule as the API shows it."""

    name: Optional[str] = None
    cron: Optional[str] = None
    timezone: Optional[str] = None
    task: Optional[Dict[str, Any]] = None
    paused: Optional[bool] = None
    next_run_at: Optional[str] = None
    last_run_at: Optional[str] = None
    last_task_id: Optional[str] = None
    last_error: Optional[str] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "cron", "timezone", "task", "paused", "next_run_at", "last_run_at", "last_task_id", "last_error", "created_at", "updated_at"]
    _nested = {}
    _required = ["cron", "name", "paused", "task", "timezone"]

@dataclass(repr=False)
class Problem(Model):
    """A Problem as the API shows it."""

    type: Optional[str] = None
    code: Optional[str] = None
    title: Optional[str] = None
    status: Optional[int] = None
    detail: Optional[str] = None
    errors: Optional[List[FieldError]] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["type", "code", "title", "status", "detail", "errors"]
    _nested = {"errors": ("FieldError", True)}
    _required = ["code", "detail", "status", "title", "type"]

@dataclass(repr=False)
class FieldError(Model):
    """One field of a request at fault, and what is wrong with it."""

    field: Optional[str] = None
    message: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["field", "message"]
    _nested = {}
    _required = ["field", "message"]

@dataclass(repr=False)
class Workspace(Model):
    """A Workspace as the API shows it."""

    name: Optional[str] = None
    content_hash: Optional[str] = None
    files: Optional[int] = None
    size_bytes: Optional[int] = None
    archive_bytes: Optional[int] = None
    dropped: Optional[List[Dict[str, Any]]] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "content_hash", "files", "size_bytes", "archive_bytes", "dropped", "created_at", "updated_at"]
    _nested = {}
    _required = ["archive_bytes", "content_hash", "created_at", "dropped", "files", "name", "size_bytes", "updated_at"]

@dataclass(repr=False)
class Secret(Model):
    """A Secret as the API shows it."""

    name: Optional[str] = None
    host: Optional[str] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "host", "created_at", "updated_at"]
    _nested = {}
    _required = ["created_at", "host", "name", "updated_at"]

@dataclass(repr=False)
class DiffStats(Model):
    """With a writable copy of its workspace (write_file, edit_file, run_command), once its run ended: the counts of its diff (`GET /tasks/{id}/diff`). Absent otherwise."""

    files_changed: Optional[int] = None
    lines_added: Optional[int] = None
    lines_removed: Optional[int] = None
    binary_files: Optional[int] = None
    bytes: Optional[int] = None
    omitted: Optional[List[str]] = None
    omitted_more: Optional[int] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["files_changed", "lines_added", "lines_removed", "binary_files", "bytes", "omitted", "omitted_more"]
    _nested = {}
    _required = ["binary_files", "bytes", "files_changed", "lines_added", "lines_removed"]

@dataclass(repr=False)
class Environment(Model):
    """A Environment as the API shows it."""

    name: Optional[str] = None
    image: Optional[str] = None
    setup: Optional[str] = None
    network_allow: Optional[List[str]] = None
    network_in_runs: Optional[bool] = None
    definition_hash: Optional[str] = None
    status: Optional[str] = None
    digest: Optional[str] = None
    exit_code: Optional[int] = None
    output_tail: Optional[str] = None
    size_bytes: Optional[int] = None
    built_at: Optional[str] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None
    extra: Dict[str, Any] = _dc.field(default_factory=dict)
    _fields = ["name", "image", "setup", "network_allow", "network_in_runs", "definition_hash", "status", "digest", "exit_code", "output_tail", "size_bytes", "built_at", "created_at", "updated_at"]
    _nested = {}
    _required = ["created_at", "definition_hash", "image", "name", "network_allow", "network_in_runs", "setup", "status", "updated_at"]
