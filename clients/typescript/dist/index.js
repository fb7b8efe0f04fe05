// A client of the subagentd service (LLM sub-agents run as durable jobs), for Node ≥ 20 and
// browsers: `fetch`, no runtime dependencies.
//
//   import { Client } from "subagentd";
//   const client = new Client({ baseUrl: "http://127.0.0.1:8080", apiKey: "sk_…" });
//   const task = await client.tasks.run({ prompt: "List the moons of Jupiter", model: "mock/m" });
export * from "./models.js";
export * as webhooks from "./webhooks.js";
export const VERSION = "0.1.0";
/** A task that `run` and `wait` stop at: it ended, or it waits for answers. */
export const SETTLED = new Set(["completed", "incomplete", "failed", "cancelled", "requires_action"]);
export const TERMINAL = new Set(["completed", "incomplete", "failed", "cancelled"]);
// ---------------------------------------------------------------- errors
/** Every error of this library. */
export class SubagentdError extends Error {
}
/** The service could not be reached, or the connection dropped before an answer. */
export class APIConnectionError extends SubagentdError {
}
/** The service answered with an error status, and the problem it sent (RFC 9457). */
export class APIStatusError extends SubagentdError {
    status;
    problem;
    code;
    detail;
    errors;
    headers;
    constructor(status, problem, headers) {
        super(`HTTP ${status} ${problem.code ?? ""}: ${problem.detail ?? problem.title ?? ""}`.trim());
        this.status = status;
        this.problem = problem;
        this.code = problem.code;
        this.detail = problem.detail;
        this.errors = problem.errors ?? [];
        this.headers = headers;
    }
}
/** 400 or 422: the request is not valid (`errors` names each field at fault). */
export class ValidationError extends APIStatusError {
}
/** 401: no key, or one that is not valid. */
export class AuthenticationError extends APIStatusError {
}
/** 403: not allowed. */
export class PermissionDeniedError extends APIStatusError {
}
/** 404: not found (another tenant's task is not found either). */
export class NotFoundError extends APIStatusError {
}
/** 409: the request conflicts with the state. */
export class ConflictError extends APIStatusError {
}
/** 429: a rate, queue, stream or schedule limit; `retryAfter` is the wait the service asked. */
export class RateLimitError extends APIStatusError {
    get retryAfter() {
        const v = this.headers.get("retry-after");
        return v == null ? undefined : Number(v);
    }
}
/** 5xx: the service could not do it now, or failed. */
export class ServerError extends APIStatusError {
}
function errorFor(status, problem, headers) {
    const cls = status === 400 || status === 422 ? ValidationError
        : status === 401 ? AuthenticationError
            : status === 403 ? PermissionDeniedError
                : status === 404 ? NotFoundError
                    : status === 409 ? ConflictError
                        : status === 429 ? RateLimitError
                            : status >= 500 ? ServerError
                                : APIStatusError;
    return new cls(status, problem, headers);
}
/** Approve a pending call: it runs. */
export const approve = (id, message) => ({ id, decision: "approve", ...(message ? { message } : {}) });
/** Deny a pending call: the sub-agent is told, and it does not run. */
export const deny = (id, message) => ({ id, decision: "deny", ...(message ? { message } : {}) });
/** Give a caller tool's output (any JSON). */
export const output = (id, value) => ({ id, output: value });
const env = (name) => globalThis.process?.env?.[name];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function query(q) {
    if (!q)
        return "";
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(q)) {
        if (v === undefined || v === null)
            continue;
        p.set(k, Array.isArray(v) ? v.join(",") : typeof v === "object" ? JSON.stringify(v) : String(v));
    }
    const s = p.toString();
    return s ? `?${s}` : "";
}
const compact = (o) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
export class Client {
    baseUrl;
    apiKey;
    timeoutMs;
    maxRetries;
    /** @internal */
    fetchImpl;
    tasks;
    agents;
    tools;
    toolSources;
    schedules;
    workspaces;
    secrets;
    environments;
    usage;
    admin;
    constructor(opts = {}) {
        this.baseUrl = (opts.baseUrl ?? env("SUBAGENTD_URL") ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
        this.apiKey = opts.apiKey ?? env("SUBAGENTD_API_KEY");
        this.timeoutMs = opts.timeoutMs ?? 30_000;
        this.maxRetries = opts.maxRetries ?? 3;
        this.fetchImpl = opts.fetch ?? globalThis.fetch.bind(globalThis);
        this.tasks = new Tasks(this);
        this.agents = new Agents(this);
        this.tools = new Tools(this);
        this.toolSources = new ToolSources(this);
        this.schedules = new Schedules(this);
        this.workspaces = new Workspaces(this);
        this.secrets = new Secrets(this);
        this.environments = new Environments(this);
        this.usage = new Usage(this);
        this.admin = new Admin(this);
    }
    /** @internal */
    headers(extra) {
        const h = { accept: "application/json", ...extra };
        if (this.apiKey)
            h.authorization = `Bearer ${this.apiKey}`;
        // Browsers refuse to set it; Node sends it.
        if (typeof globalThis.window === "undefined")
            h["user-agent"] = `subagentd-typescript/${VERSION}`;
        return h;
    }
    /** @internal */
    delay(attempt, retryAfter) {
        const ra = retryAfter == null ? NaN : Number(retryAfter);
        if (!Number.isNaN(ra))
            return Math.min(Math.max(ra, 0), 60) * 1000;
        return Math.random() * Math.min(8000, 250 * 2 ** attempt);
    }
    /** @internal */
    async send(req) {
        for (let attempt = 0;; attempt++) {
            const ctl = new AbortController();
            const timer = setTimeout(() => ctl.abort(), req.timeoutMs ?? this.timeoutMs);
            let r;
            try {
                r = await this.fetchImpl(this.baseUrl + req.path + query(req.query), {
                    method: req.method,
                    headers: this.headers({ ...(req.json !== undefined ? { "content-type": "application/json" } : {}), ...req.headers }),
                    body: req.json !== undefined ? JSON.stringify(req.json) : req.body,
                    signal: ctl.signal,
                });
            }
            catch (e) {
                clearTimeout(timer);
                if (req.repeatable && attempt < this.maxRetries) {
                    await sleep(this.delay(attempt, null));
                    continue;
                }
                throw new APIConnectionError(String(e?.message ?? e));
            }
            clearTimeout(timer);
            if ((r.status === 429 || r.status === 503) && attempt < this.maxRetries) {
                await r.body?.cancel();
                await sleep(this.delay(attempt, r.headers.get("retry-after")));
                continue;
            }
            if (r.status >= 400)
                throw await problemOf(r);
            return r;
        }
    }
    /** @internal */
    async json(req) {
        const r = await this.send(req);
        const text = await r.text();
        return (text ? JSON.parse(text) : undefined);
    }
}
async function problemOf(r) {
    const text = await r.text();
    let problem = {};
    try {
        const v = JSON.parse(text);
        if (v && typeof v === "object")
            problem = v;
    }
    catch {
        if (text)
            problem = { detail: text.slice(0, 500) };
    }
    return errorFor(r.status, problem, r.headers);
}
class Resource {
    c;
    constructor(c) {
        this.c = c;
    }
}
function newKey() {
    const c = globalThis.crypto;
    return `subagentd-ts-${c?.randomUUID ? c.randomUUID() : Math.random().toString(36).slice(2) + Date.now()}`;
}
export class Tasks extends Resource {
    /** Submit a task; it runs in the background. Always sent with an `Idempotency-Key`. */
    async create(fields) {
        return this.c.json(this.createReq(fields, false));
    }
    createReq(fields, wait, waitTimeout) {
        const { idempotency_key, ...body } = fields;
        return {
            method: "POST", path: "/tasks", json: compact(body),
            query: wait ? { wait: "true", timeout: waitTimeout } : undefined,
            headers: { "idempotency-key": idempotency_key ?? newKey() }, repeatable: true,
            timeoutMs: wait ? ((waitTimeout ?? 300) + 30) * 1000 : undefined,
        };
    }
    /** Submit a task and wait until it ends or waits for answers (joining for as long as it runs). */
    async run(fields) {
        const { wait_timeout, ...rest } = fields;
        let task = await this.c.json(this.createReq(rest, true, wait_timeout));
        while (!SETTLED.has(task.status))
            task = await this.wait(task.id, wait_timeout);
        return task;
    }
    async get(id) {
        return this.c.json({ method: "GET", path: `/tasks/${id}`, repeatable: true });
    }
    /** Wait for the task to end or pause, for at most `timeout` seconds; the task as it then is. */
    async wait(id, timeout) {
        return this.c.json({
            method: "GET", path: `/tasks/${id}`, query: { wait: "true", timeout }, repeatable: true,
            timeoutMs: ((timeout ?? 300) + 30) * 1000,
        });
    }
    /** Every task matching, newest first, across all pages. */
    async *list(filter = {}) {
        let cursor;
        do {
            const page = await this.c.json({ method: "GET", path: "/tasks", query: { ...filter, cursor }, repeatable: true });
            for (const t of page.tasks)
                yield t;
            cursor = page.next_cursor;
        } while (cursor);
    }
    async cancel(id) {
        return this.c.json({ method: "POST", path: `/tasks/${id}/cancel`, json: {}, repeatable: true });
    }
    async cancelMany(filter = {}) {
        return this.c.json({ method: "POST", path: "/tasks/cancel", json: compact(filter) });
    }
    /** Answer pending actions (`approve(id)`, `deny(id, message)`, `output(id, value)`), all or none. */
    async answer(id, answers) {
        return this.c.json({ method: "POST", path: `/tasks/${id}/actions`, json: answers });
    }
    /**
     * The task's events, live, until its last: stored events (each with its `seq`) and the model's
     * text as it streams (`kind === "output_delta"`, no `seq`). A dropped connection is resumed after
     * the last event seen, without gaps or duplicates.
     */
    async *events(id, opts = {}) {
        let last = opts.after;
        let failures = 0;
        for (;;) {
            let r;
            try {
                r = await this.c.fetchImpl(`${this.c.baseUrl}/tasks/${id}/events`, {
                    headers: this.c.headers({ accept: "text/event-stream", ...(last !== undefined ? { "last-event-id": String(last) } : {}) }),
                });
            }
            catch (e) {
                if (++failures > this.c.maxRetries + 2)
                    throw new APIConnectionError(String(e?.message ?? e));
                await sleep(this.c.delay(failures, null));
                continue;
            }
            if (r.status === 204)
                return;
            if (r.status >= 400) {
                if ((r.status === 429 || r.status === 503) && failures < this.c.maxRetries) {
                    failures++;
                    await r.body?.cancel();
                    await sleep(this.c.delay(failures, r.headers.get("retry-after")));
                    continue;
                }
                throw await problemOf(r);
            }
            let ended = false;
            try {
                for await (const ev of sse(r)) {
                    failures = 0;
                    if (ev.event === "output_delta") {
                        yield { kind: "output_delta", data: ev.data };
                        continue;
                    }
                    if (ev.id !== undefined)
                        last = Number(ev.id);
                    const e = ev.data;
                    yield e;
                    if (e.kind === "finished")
                        ended = true;
                }
            }
            catch (e) {
                if (++failures > this.c.maxRetries + 2)
                    throw new APIConnectionError(String(e?.message ?? e));
                await sleep(this.c.delay(failures, null));
                continue;
            }
            if (ended)
                return;
            // The stream closed: the task ended (a reconnect is answered 204), or it dropped.
        }
    }
    async messages(id) {
        return (await this.c.json({ method: "GET", path: `/tasks/${id}/messages`, repeatable: true })).messages;
    }
    /** The task's patch (a unified diff, `git apply` takes it) once its run ended. */
    async diff(id) {
        const r = await this.c.send({ method: "GET", path: `/tasks/${id}/diff`, repeatable: true });
        return r.text();
    }
    async calls(id) {
        return (await this.c.json({ method: "GET", path: `/tasks/${id}/calls`, repeatable: true })).calls;
    }
}
/** Server-Sent Events of a response: each event's id, name and parsed data. */
async function* sse(r) {
    if (!r.body)
        return;
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
        const { value, done } = await reader.read();
        if (done)
            return;
        buf += value.replace(/\r\n/g, "\n");
        let at;
        while ((at = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, at);
            buf = buf.slice(at + 2);
            let id;
            let event = "message";
            const data = [];
            for (const line of block.split("\n")) {
                if (!line || line.startsWith(":"))
                    continue;
                const i = line.indexOf(":");
                const k = i < 0 ? line : line.slice(0, i);
                let v = i < 0 ? "" : line.slice(i + 1);
                if (v.startsWith(" "))
                    v = v.slice(1);
                if (k === "id")
                    id = v;
                else if (k === "event")
                    event = v;
                else if (k === "data")
                    data.push(v);
            }
            if (!data.length)
                continue;
            const text = data.join("\n");
            let parsed = text;
            try {
                parsed = JSON.parse(text);
            }
            catch {
                // kept as text
            }
            yield { id, event, data: parsed };
        }
    }
}
export class Agents extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/agents", repeatable: true })).agents;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/agents/${name}`, repeatable: true });
    }
    /** Create or replace a tenant's agent definition. */
    async put(name, definition) {
        return this.c.json({ method: "PUT", path: `/agents/${name}`, json: definition, repeatable: true });
    }
    /** Create or replace a definition from an agent file (`.claude/agents/*.md`). */
    async putMarkdown(name, text) {
        return this.c.json({
            method: "PUT", path: `/agents/${name}`, body: text, headers: { "content-type": "text/markdown" }, repeatable: true,
        });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/agents/${name}`, repeatable: true });
    }
}
export class Tools extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/tools", repeatable: true })).tools;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/tools/${name}`, repeatable: true });
    }
    /** Create or replace a catalog tool: an HTTP endpoint, or none (the caller runs it). `policy` defaults to `auto`. */
    async put(name, tool) {
        return this.c.json({ method: "PUT", path: `/tools/${name}`, json: compact({ policy: "auto", ...tool }), repeatable: true });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/tools/${name}`, repeatable: true });
    }
    /** A new signing secret for the tenant's tool calls and webhooks (shown once). */
    async rotateSigningSecret() {
        return this.c.json({ method: "POST", path: "/signing-secret" });
    }
}
export class ToolSources extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/tool-sources", repeatable: true })).tool_sources;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/tool-sources/${name}`, repeatable: true });
    }
    async put(name, source) {
        return this.c.json({ method: "PUT", path: `/tool-sources/${name}`, json: compact(source), repeatable: true });
    }
    async refresh(name) {
        return this.c.json({ method: "POST", path: `/tool-sources/${name}/refresh`, repeatable: true });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/tool-sources/${name}`, repeatable: true });
    }
}
export class Schedules extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/schedules", repeatable: true })).schedules;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/schedules/${name}`, repeatable: true });
    }
    /** Create or replace a schedule: `task` is a body as `tasks.create` takes it. */
    async put(name, schedule) {
        return this.c.json({ method: "PUT", path: `/schedules/${name}`, json: compact(schedule), repeatable: true });
    }
    async pause(name) {
        return this.c.json({ method: "POST", path: `/schedules/${name}/pause`, repeatable: true });
    }
    async resume(name) {
        return this.c.json({ method: "POST", path: `/schedules/${name}/resume`, repeatable: true });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/schedules/${name}`, repeatable: true });
    }
}
export class Workspaces extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/workspaces", repeatable: true })).workspaces;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/workspaces/${name}`, repeatable: true });
    }
    /** Upload (or replace) a workspace: `archive` is a tar.gz; `dropped` says what was left out. */
    async put(name, archive) {
        return this.c.json({
            method: "PUT", path: `/workspaces/${name}`, body: archive, headers: { "content-type": "application/gzip" }, repeatable: true,
        });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/workspaces/${name}`, repeatable: true });
    }
}
export class Secrets extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/secrets", repeatable: true })).secrets;
    }
    /** Set a write-only secret (a private repository's token), sent only to `host`. */
    async put(name, secret) {
        return this.c.json({ method: "PUT", path: `/secrets/${name}`, json: secret, repeatable: true });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/secrets/${name}`, repeatable: true });
    }
}
export class Environments extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/environments", repeatable: true }))
            .environments;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/environments/${name}`, repeatable: true });
    }
    /**
     * Define (or replace) a named environment: an OCI image and a setup script run once over it,
     * with `network` (hosts, `*.domain`s and CIDRs; `in_runs` for the tasks' commands too) reached
     * through the service's egress proxy.
     */
    async put(name, definition) {
        return this.c.json({ method: "PUT", path: `/environments/${name}`, json: definition, repeatable: true });
    }
    async delete(name) {
        await this.c.send({ method: "DELETE", path: `/environments/${name}`, repeatable: true });
    }
}
export class Usage extends Resource {
    /** Usage and cost over days (YYYY-MM-DD), grouped by `day`, `tenant`, `model` and/or `agent_type`. */
    async get(q = {}) {
        return this.c.json({ method: "GET", path: "/usage", query: { ...q }, repeatable: true });
    }
    /** The same report as CSV text. */
    async csv(q = {}) {
        const r = await this.c.send({ method: "GET", path: "/usage", query: { ...q, format: "csv" }, repeatable: true });
        return r.text();
    }
}
export class Keys extends Resource {
    /** A new API key for `tenant` (its `key` is shown once). */
    async create(tenant, name) {
        return this.c.json({ method: "POST", path: "/admin/keys", json: compact({ tenant, name }) });
    }
    async list(tenant) {
        return (await this.c.json({ method: "GET", path: "/admin/keys", query: { tenant }, repeatable: true })).keys;
    }
    async revoke(id) {
        await this.c.send({ method: "DELETE", path: `/admin/keys/${id}`, repeatable: true });
    }
}
export class Tenants extends Resource {
    async list() {
        return (await this.c.json({ method: "GET", path: "/admin/tenants", repeatable: true })).tenants;
    }
    async get(name) {
        return this.c.json({ method: "GET", path: `/admin/tenants/${name}`, repeatable: true });
    }
    /** Set the tenant's limits (those not given fall back to the configured defaults). */
    async put(name, limits) {
        return (await this.c.json({ method: "PUT", path: `/admin/tenants/${name}`, json: limits, repeatable: true })).limits;
    }
}
/** The admin API (the client's `apiKey` is the admin token). */
export class Admin extends Resource {
    keys;
    tenants;
    constructor(c) {
        super(c);
        this.keys = new Keys(c);
        this.tenants = new Tenants(c);
    }
}
