"""The asynchronous client: `AsyncClient(base_url=…, api_key=…)`, the same shape as `Client`,
its methods coroutines and its lists and events async iterators."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, List, Optional, Type, TypeVar

import httpx

from . import _models as m
from ._base import (
    SETTLED, TERMINAL, USER_AGENT, Answer, Req, Retry, SseReader, body, config, create_req, params, problem_of,
)
from ._errors import APIConnectionError, APITimeoutError, APIStatusError, NotFoundError, ServerError

M = TypeVar("M", bound="m.Model")


class AsyncClient:
    """An asynchronous client of one subagentd service (see `Client`).

    `base_url` (default `SUBAGENTD_URL`, else http://127.0.0.1:8080), `api_key` (default
    `SUBAGENTD_API_KEY`; the admin token for `admin`), `timeout` in seconds for a request (a
    wait adds its own), `retry` (429 and 503 waited out; dropped connections retried for reads
    and creates only).
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = 30.0,
        retry: Optional[Retry] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.base_url, self.api_key = config(base_url, api_key)
        self.timeout = timeout
        self.retry = retry or Retry()
        self._http = http_client or httpx.AsyncClient(timeout=httpx.Timeout(timeout, read=None))
        self.tasks = Tasks(self)
        self.agents = Agents(self)
        self.tools = Tools(self)
        self.tool_sources = ToolSources(self)
        self.schedules = Schedules(self)
        self.workspaces = Workspaces(self)
        self.secrets = Secrets(self)
        self.environments = Environments(self)
        self.usage = Usage(self)
        self.admin = Admin(self)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _headers(self, extra: Dict[str, str]) -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra)
        return h

    async def _send(self, req: Req, *, read_timeout: Optional[float] = None) -> httpx.Response:
        attempt = 0
        while True:
            try:
                r = await self._http.request(
                    req.method, self.base_url + req.path, params=req.params or None, json=req.json,
                    content=req.content, headers=self._headers(req.headers),
                    timeout=httpx.Timeout(self.timeout, read=read_timeout or self.timeout),
                )
            except httpx.TimeoutException as e:
                if req.repeatable and attempt < self.retry.max_retries:
                    await asyncio.sleep(self.retry.delay(attempt, None))
                    attempt += 1
                    continue
                raise APITimeoutError(str(e)) from e
            except httpx.TransportError as e:
                if req.repeatable and attempt < self.retry.max_retries:
                    await asyncio.sleep(self.retry.delay(attempt, None))
                    attempt += 1
                    continue
                raise APIConnectionError(str(e)) from e
            if r.status_code in (429, 503) and attempt < self.retry.max_retries:
                await asyncio.sleep(self.retry.delay(attempt, r.headers.get("retry-after")))
                attempt += 1
                continue
            if r.status_code >= 400:
                raise problem_of(r.status_code, r.text, r.headers)
            return r

    async def _json(self, req: Req, **kw: Any) -> Any:
        r = await self._send(req, **kw)
        return r.json() if r.content else None

    async def _one(self, model: Type[M], req: Req, key: Optional[str] = None, **kw: Any) -> M:
        data = await self._json(req, **kw)
        return model.from_dict(data[key] if key else data)

    async def _many(self, model: Type[M], req: Req, key: str) -> List[M]:
        return [model.from_dict(x) for x in (await self._json(req))[key]]


class _Resource:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client


class Tasks(_Resource):
    async def create(
        self, *, prompt: str, subagent_type: Optional[str] = None, description: Optional[str] = None,
        model: Optional[str] = None, max_turns: Optional[int] = None, system_prompt: Optional[str] = None,
        parent_context: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None,
        timeout_seconds: Optional[float] = None, tools: Optional[List[Dict[str, Any]]] = None,
        allowed_tools: Optional[List[str]] = None, max_cost_usd: Optional[float] = None,
        max_tokens: Optional[int] = None, webhook_url: Optional[str] = None, approval: Optional[str] = None,
        action_timeout_seconds: Optional[float] = None, output_schema: Optional[Dict[str, Any]] = None,
        fallback_models: Optional[List[str]] = None, fallback_on: Optional[List[str]] = None,
        run_at: Optional[str] = None, delay_seconds: Optional[float] = None, priority: Optional[str] = None,
        resume_from: Optional[str] = None, workspace: Optional[Dict[str, Any]] = None,
        environment: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None,
    ) -> m.Task:
        """Submit a task (`POST /tasks`); it runs in the background. Always sent with an
        `Idempotency-Key` (made here when not given): retried, it makes one task."""
        fields = {k: v for k, v in locals().items() if k not in ("self", "idempotency_key")}
        return await self._c._one(m.Task, create_req(fields, idempotency_key, False, None))

    async def run(self, *, wait_timeout: Optional[float] = None, idempotency_key: Optional[str] = None,
            **fields: Any) -> m.Task:
        """Submit a task and wait until it ends or waits for answers (`POST /tasks?wait=true`,
        then joins for as long as it runs). Takes `create`'s fields."""
        req = create_req(fields, idempotency_key, True, wait_timeout)
        r = await self._c._send(req, read_timeout=(wait_timeout or 300) + 30)
        task = m.Task.from_dict(r.json())
        while task.status not in SETTLED:
            task = await self.wait(task.id, timeout=wait_timeout)  # type: ignore[arg-type]
        return task

    async def get(self, task_id: str) -> m.Task:
        return await self._c._one(m.Task, Req("GET", f"/tasks/{task_id}", repeatable=True))

    async def wait(self, task_id: str, timeout: Optional[float] = None) -> m.Task:
        """Wait for the task to end or pause, for at most `timeout` seconds (the service's wait
        bound by default); the task as it then is."""
        req = Req("GET", f"/tasks/{task_id}", params=params(wait=True, timeout=timeout), repeatable=True)
        return await self._c._one(m.Task, req, read_timeout=(timeout or 300) + 30)

    async def list(
        self, *, status: Optional[Any] = None, subagent_type: Optional[str] = None, model: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None, created_after: Optional[str] = None,
        created_before: Optional[str] = None, limit: Optional[int] = None,
    ) -> AsyncIterator[m.Task]:
        """Every task matching, newest first, across all pages."""
        cursor = None
        while True:
            q = params(status=status, subagent_type=subagent_type, model=model, metadata=metadata,
                       created_after=created_after, created_before=created_before, limit=limit, cursor=cursor)
            page = m.TaskPage.from_dict(await self._c._json(Req("GET", "/tasks", params=q, repeatable=True)))
            for t in page.tasks or []:
                yield t
            cursor = page.next_cursor
            if not cursor:
                return

    async def cancel(self, task_id: str) -> m.Task:
        return await self._c._one(m.Task, Req("POST", f"/tasks/{task_id}/cancel", json={}, repeatable=True))

    async def cancel_many(self, *, status: Optional[List[str]] = None,
                    metadata: Optional[Dict[str, Any]] = None) -> m.CancelledMany:
        return await self._c._one(m.CancelledMany, Req("POST", "/tasks/cancel", json=body(status=status, metadata=metadata)))

    async def answer(self, task_id: str, answers: List[Answer]) -> m.Task:
        """Answer pending actions (`approve(id)`, `deny(id, message)`, `output(id, value)`), all
        or none; the last answer queues the run again."""
        return await self._c._one(m.Task, Req("POST", f"/tasks/{task_id}/actions", json=list(answers)))

    async def events(self, task_id: str, *, after: Optional[int] = None) -> AsyncIterator[m.Event]:
        """The task's events, live, until its last: stored events (each with its `seq`) and the
        model's text as it streams (`kind == "output_delta"`, no `seq`). A dropped connection is
        resumed after the last event seen, without gaps or duplicates."""
        last = after
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                async with self._c._http.stream("GET", f"{self._c.base_url}/tasks/{task_id}/events",
                                          headers=self._c._headers(headers),
                                          timeout=httpx.Timeout(self._c.timeout, read=60)) as r:
                    if r.status_code == 204:
                        return
                    if r.status_code >= 400:
                        await r.aread()
                        err = problem_of(r.status_code, r.text, r.headers)
                        if r.status_code in (429, 503) and failures < self._c.retry.max_retries:
                            failures += 1
                            await asyncio.sleep(self._c.retry.delay(failures, r.headers.get("retry-after")))
                            continue
                        raise err
                    reader = SseReader()
                    ended = False
                    async for chunk in r.aiter_text():
                        for ev in reader.feed(chunk):
                            e = m.Event.from_dict(ev["data"] if isinstance(ev["data"], dict) else {"data": ev["data"]})
                            if ev["event"] == "output_delta":
                                e = m.Event(kind="output_delta", data=ev["data"], extra={})
                            elif ev["id"] is not None:
                                last = int(ev["id"])
                            failures = 0
                            yield e
                            if e.kind == "finished":
                                ended = True
                    if ended:
                        return
                    # The stream closed: the task ended (a reconnect is answered 204), or it dropped.
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                failures += 1
                if failures > self._c.retry.max_retries + 2:
                    raise APIConnectionError(str(exc)) from exc
                await asyncio.sleep(self._c.retry.delay(failures, None))

    async def messages(self, task_id: str) -> List[m.Message]:
        return await self._c._many(m.Message, Req("GET", f"/tasks/{task_id}/messages", repeatable=True), "messages")

    async def diff(self, task_id: str) -> str:
        """The task's patch (a unified diff, `git apply` takes it) once its run ended."""
        return (await self._c._send(Req("GET", f"/tasks/{task_id}/diff", repeatable=True))).text

    async def calls(self, task_id: str) -> List[m.Call]:
        return await self._c._many(m.Call, Req("GET", f"/tasks/{task_id}/calls", repeatable=True), "calls")


class Agents(_Resource):
    async def list(self) -> List[m.Agent]:
        return await self._c._many(m.Agent, Req("GET", "/agents", repeatable=True), "agents")

    async def get(self, name: str) -> m.Agent:
        return await self._c._one(m.Agent, Req("GET", f"/agents/{name}", repeatable=True))

    async def put(self, name: str, *, system_prompt: str, description: Optional[str] = None,
            tools: Optional[List[str]] = None, disallowed_tools: Optional[List[str]] = None,
            model: Optional[str] = None, max_turns: Optional[int] = None, max_output_tokens: Optional[int] = None,
            approval: Optional[str] = None, read_only: Optional[bool] = None,
            output_schema: Optional[Dict[str, Any]] = None, fallback_models: Optional[List[str]] = None,
            fallback_on: Optional[List[str]] = None, priority: Optional[str] = None) -> m.Agent:
        """Create or replace a tenant's agent definition."""
        fields = {k: v for k, v in locals().items() if k not in ("self", "name")}
        return await self._c._one(m.Agent, Req("PUT", f"/agents/{name}", json=body(**fields), repeatable=True))

    async def put_markdown(self, name: str, text: str) -> m.Agent:
        """Create or replace a definition from an agent file (`.claude/agents/*.md`)."""
        req = Req("PUT", f"/agents/{name}", content=text.encode(), headers={"Content-Type": "text/markdown"},
                  repeatable=True)
        return await self._c._one(m.Agent, req)

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/agents/{name}", repeatable=True))


class Tools(_Resource):
    async def list(self) -> List[m.Tool]:
        return await self._c._many(m.Tool, Req("GET", "/tools", repeatable=True), "tools")

    async def get(self, name: str) -> m.Tool:
        return await self._c._one(m.Tool, Req("GET", f"/tools/{name}", repeatable=True))

    async def put(self, name: str, *, description: str, parameters: Dict[str, Any], endpoint: Optional[str] = None,
                  policy: str = "auto", timeout_ms: Optional[int] = None) -> m.Tool:
        """Create or replace a catalog tool: an HTTP endpoint, or none (the caller runs it)."""
        fields = {k: v for k, v in locals().items() if k not in ("self", "name")}
        return await self._c._one(m.Tool, Req("PUT", f"/tools/{name}", json=body(**fields), repeatable=True))

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/tools/{name}", repeatable=True))

    async def rotate_signing_secret(self) -> Dict[str, Any]:
        """A new signing secret for the tenant's tool calls and webhooks (shown once)."""
        return await self._c._json(Req("POST", "/signing-secret"))


class ToolSources(_Resource):
    async def list(self) -> List[m.ToolSource]:
        return await self._c._many(m.ToolSource, Req("GET", "/tool-sources", repeatable=True), "tool_sources")

    async def get(self, name: str) -> m.ToolSource:
        return await self._c._one(m.ToolSource, Req("GET", f"/tool-sources/{name}", repeatable=True))

    async def put(self, name: str, *, url: str, headers: Optional[Dict[str, str]] = None) -> m.ToolSource:
        req = Req("PUT", f"/tool-sources/{name}", json=body(url=url, headers=headers), repeatable=True)
        return await self._c._one(m.ToolSource, req)

    async def refresh(self, name: str) -> m.ToolSource:
        return await self._c._one(m.ToolSource, Req("POST", f"/tool-sources/{name}/refresh", repeatable=True))

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/tool-sources/{name}", repeatable=True))


class Schedules(_Resource):
    async def list(self) -> List[m.Schedule]:
        return await self._c._many(m.Schedule, Req("GET", "/schedules", repeatable=True), "schedules")

    async def get(self, name: str) -> m.Schedule:
        return await self._c._one(m.Schedule, Req("GET", f"/schedules/{name}", repeatable=True))

    async def put(self, name: str, *, cron: str, task: Dict[str, Any], timezone: Optional[str] = None,
            paused: Optional[bool] = None) -> m.Schedule:
        """Create or replace a schedule: `task` is a body as `tasks.create` takes it."""
        req = Req("PUT", f"/schedules/{name}", json=body(cron=cron, task=task, timezone=timezone, paused=paused),
                  repeatable=True)
        return await self._c._one(m.Schedule, req)

    async def pause(self, name: str) -> m.Schedule:
        return await self._c._one(m.Schedule, Req("POST", f"/schedules/{name}/pause", repeatable=True))

    async def resume(self, name: str) -> m.Schedule:
        return await self._c._one(m.Schedule, Req("POST", f"/schedules/{name}/resume", repeatable=True))

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/schedules/{name}", repeatable=True))


class Workspaces(_Resource):
    async def list(self) -> List[m.Workspace]:
        return await self._c._many(m.Workspace, Req("GET", "/workspaces", repeatable=True), "workspaces")

    async def get(self, name: str) -> m.Workspace:
        return await self._c._one(m.Workspace, Req("GET", f"/workspaces/{name}", repeatable=True))

    async def put(self, name: str, archive: bytes) -> m.Workspace:
        """Upload (or replace) a workspace: `archive` is a tar.gz; `dropped` says what was left out."""
        req = Req("PUT", f"/workspaces/{name}", content=archive, headers={"Content-Type": "application/gzip"},
                  repeatable=True)
        return await self._c._one(m.Workspace, req)

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/workspaces/{name}", repeatable=True))


class Secrets(_Resource):
    async def list(self) -> List[m.Secret]:
        return await self._c._many(m.Secret, Req("GET", "/secrets", repeatable=True), "secrets")

    async def put(self, name: str, *, value: str, host: str) -> m.Secret:
        """Set a write-only secret (a private repository's token), sent only to `host`."""
        return await self._c._one(m.Secret, Req("PUT", f"/secrets/{name}", json=body(value=value, host=host),
                                                repeatable=True))

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/secrets/{name}", repeatable=True))


class Environments(_Resource):
    async def list(self) -> List[m.Environment]:
        return await self._c._many(m.Environment, Req("GET", "/environments", repeatable=True), "environments")

    async def get(self, name: str) -> m.Environment:
        return await self._c._one(m.Environment, Req("GET", f"/environments/{name}", repeatable=True))

    async def put(self, name: str, *, image: str, setup: Optional[str] = None,
                  network: Optional[Dict[str, Any]] = None) -> m.Environment:
        """Define (or replace) a named environment: an OCI image and a setup script run once over
        it, with `network` (`{"allow": [hosts, *.domains, CIDRs], "in_runs": bool}`) reached through
        the service's egress proxy; `status` is `building` until its build ends (`ready` or
        `failed`)."""
        return await self._c._one(m.Environment, Req("PUT", f"/environments/{name}",
                                                     json=body(image=image, setup=setup, network=network),
                                                     repeatable=True))

    async def delete(self, name: str) -> None:
        await self._c._send(Req("DELETE", f"/environments/{name}", repeatable=True))


class Usage(_Resource):
    async def get(self, *, from_: Optional[str] = None, to: Optional[str] = None, group_by: Optional[Any] = None,
            tenant: Optional[str] = None, model: Optional[str] = None,
            agent_type: Optional[str] = None) -> m.UsageReport:
        """Usage and cost over days (`from_`, `to`: YYYY-MM-DD), grouped by `day`, `tenant`,
        `model` and/or `agent_type`."""
        q = params(to=to, group_by=group_by, tenant=tenant, model=model, agent_type=agent_type)
        if from_:
            q["from"] = from_
        return await self._c._one(m.UsageReport, Req("GET", "/usage", params=q, repeatable=True))

    async def csv(self, **kw: Any) -> str:
        """The same report as CSV text."""
        q = params(to=kw.get("to"), group_by=kw.get("group_by"), tenant=kw.get("tenant"), format="csv")
        if kw.get("from_"):
            q["from"] = kw["from_"]
        return (await self._c._send(Req("GET", "/usage", params=q, repeatable=True))).text


class Keys(_Resource):
    async def create(self, tenant: str, name: Optional[str] = None) -> m.NewKey:
        """A new API key for `tenant` (its `key` is shown once)."""
        return await self._c._one(m.NewKey, Req("POST", "/admin/keys", json=body(tenant=tenant, name=name)))

    async def list(self, tenant: Optional[str] = None) -> List[m.Key]:
        return await self._c._many(m.Key, Req("GET", "/admin/keys", params=params(tenant=tenant), repeatable=True), "keys")

    async def revoke(self, key_id: str) -> None:
        await self._c._send(Req("DELETE", f"/admin/keys/{key_id}", repeatable=True))


class Tenants(_Resource):
    async def list(self) -> List[str]:
        return list((await self._c._json(Req("GET", "/admin/tenants", repeatable=True)))["tenants"])

    async def get(self, name: str) -> m.TenantView:
        return await self._c._one(m.TenantView, Req("GET", f"/admin/tenants/{name}", repeatable=True))

    async def put(self, name: str, **limits: Any) -> m.Limits:
        """Set the tenant's limits (those not given fall back to the configured defaults)."""
        return await self._c._one(m.Limits, Req("PUT", f"/admin/tenants/{name}", json=body(**limits), repeatable=True),
                            "limits")


class Admin(_Resource):
    """The admin API (the client's `api_key` is the admin token)."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.keys = Keys(client)
        self.tenants = Tenants(client)


__all__ = ["AsyncClient"]
