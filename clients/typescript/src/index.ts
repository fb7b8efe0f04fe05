// A client of the subagentd service (LLM sub-agents run as durable jobs), for Node ≥ 20 and
// browsers: `fetch`, no runtime dependencies.
//
//   import { Client } from "subagentd";
//   const client = new Client({ baseUrl: "http://127.0.0.1:8080", apiKey: "sk_…" });
//   const task = await client.tasks.run({ prompt: "List the moons of Jupiter", model: "mock/m" });

import type {
  Agent, Call, CancelledMany, Event, Key, Limits, Message, NewKey, Problem, Schedule, Task, TaskPage, TenantView,
  Tool, ToolSource, UsageReport, Workspace, Secret, Environment,
} from "./models.js";

export * from "./models.js";
export * as webhooks from "./webhooks.js";

export const VERSION = "0.1.0";
/** A task that `run` and `wait` stop at: it ended, or it waits for answers. */
export const SETTLED = new Set(["completed", "incomplete", "failed", "cancelled", "requires_action"]);
export const TERMINAL = new Set(["completed", "incomplete", "failed", "cancelled"]);

// ---------------------------------------------------------------- errors

/** Every error of this library. */
export class SubagentdError extends Error {}

/** The service could not be reached, or the connection dropped before an answer. */
export class APIConnectionError extends SubagentdError {}

/** The service answered with an error status, and the problem it sent (RFC 9457). */
export class APIStatusError extends SubagentdError {
  readonly status: number;
  readonly problem: Partial<Problem>;
  readonly code?: string;
  readonly detail?: string;
  readonly errors: { field: string; message: string }[];
  readonly headers: Headers;
  constructor(status: number, problem: Partial<Problem>, headers: Headers) {
    super(`HTTP ${status} ${problem.code ?? ""}: ${problem.detail ?? problem.title ?? ""}`.trim());
    this.status = status;
    this.problem = problem;
    this.code = problem.code;
    this.detail = problem.detail;
    this.errors = (problem.errors as { field: string; message: string }[] | undefined) ?? [];
    this.headers = headers;
  }
}
/** 400 or 422: the request is not valid (`errors` names each field at fault). */
export class ValidationError extends APIStatusError {}
/** 401: no key, or one that is not valid. */
export class AuthenticationError extends APIStatusError {}
/** 403: not allowed. */
export class PermissionDeniedError extends APIStatusError {}
/** 404: not found (another tenant's task is not found either). */
export class NotFoundError extends APIStatusError {}
/** 409: the request conflicts with the state. */
export class ConflictError extends APIStatusError {}
/** 429: a rate, queue, stream or schedule limit; `retryAfter` is the wait the service asked. */
export class RateLimitError extends APIStatusError {
  get retryAfter(): number | undefined {
    const v = this.headers.get("retry-after");
    return v == null ? undefined : Number(v);
  }
}
/** 5xx: the service could not do it now, or failed. */
export class ServerError extends APIStatusError {}

function errorFor(status: number, problem: Partial<Problem>, headers: Headers): APIStatusError {
  const cls =
    status === 400 || status === 422 ? ValidationError
    : status === 401 ? AuthenticationError
    : status === 403 ? PermissionDeniedError
    : status === 404 ? NotFoundError
    : status === 409 ? ConflictError
    : status === 429 ? RateLimitError
    : status >= 500 ? ServerError
    : APIStatusError;
  return new cls(status, problem, headers);
}

// ---------------------------------------------------------------- answers

/** An answer to a pending action. */
export type Answer = { id: string; decision?: "approve" | "deny"; message?: string; output?: unknown };
/** Approve a pending call: it runs. */
export const approve = (id: string, message?: string): Answer => ({ id, decision: "approve", ...(message ? { message } : {}) });
/** Deny a pending call: the sub-agent is told, and it does not run. */
export const deny = (id: string, message?: string): Answer => ({ id, decision: "deny", ...(message ? { message } : {}) });
/** Give a caller tool's output (any JSON). */
export const output = (id: string, value: unknown): Answer => ({ id, output: value });

// ---------------------------------------------------------------- the client

export interface ClientOptions {
  /** Default: `SUBAGENTD_URL` (in Node), else http://127.0.0.1:8080. */
  baseUrl?: string;
  /** Default: `SUBAGENTD_API_KEY` (in Node). The admin token for `admin`. */
  apiKey?: string;
  /** Milliseconds for a request (a wait adds its own). Default 30,000. */
  timeoutMs?: number;
  /** Retries of 429 and 503 (after `Retry-After`), and of dropped connections for reads and creates. Default 3. */
  maxRetries?: number;
  /** A `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
}

/** `POST /tasks`'s fields, named as the API names them. */
export interface CreateTask {
  prompt: string;
  subagent_type?: string;
  description?: string;
  model?: string;
  max_turns?: number;
  system_prompt?: string;
  parent_context?: string;
  metadata?: Record<string, unknown>;
  timeout_seconds?: number;
  tools?: Record<string, unknown>[];
  allowed_tools?: string[];
  max_cost_usd?: number;
  max_tokens?: number;
  webhook_url?: string;
  approval?: "none" | "propose" | "all";
  action_timeout_seconds?: number;
  output_schema?: Record<string, unknown>;
  fallback_models?: string[];
  fallback_on?: ("unavailable" | "context_length")[];
  run_at?: string;
  delay_seconds?: number;
  priority?: "high" | "normal" | "low";
  resume_from?: string;
  /** The code the workspace tools read: `{git, ref?, secret?}` or `{name}` (an upload). */
  workspace?: { git?: string; ref?: string; secret?: string; name?: string; web?: boolean };
  /** Where `run_command` runs: `{image}` (an OCI reference) or `{name}` (a named environment). */
  environment?: { image?: string; name?: string };
  /** Sent as `Idempotency-Key` (made here when not given: a retried create makes one task). */
  idempotency_key?: string;
}

interface Req {
  method: string;
  path: string;
  query?: Record<string, unknown>;
  json?: unknown;
  body?: string | Uint8Array;
  headers?: Record<string, string>;
  /** Safe to send again after a dropped connection. */
  repeatable?: boolean;
  timeoutMs?: number;
}

const env = (name: string): string | undefined =>
  (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function query(q: Record<string, unknown> | undefined): string {
  if (!q) return "";
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === null) continue;
    p.set(k, Array.isArray(v) ? v.join(",") : typeof v === "object" ? JSON.stringify(v) : String(v));
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

const compact = <T extends Record<string, unknown>>(o: T): Partial<T> =>
  Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;

export class Client {
  readonly baseUrl: string;
  readonly apiKey?: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  /** @internal */
  readonly fetchImpl: typeof fetch;
  readonly tasks: Tasks;
  readonly agents: Agents;
  readonly tools: Tools;
  readonly toolSources: ToolSources;
  readonly schedules: Schedules;
  readonly workspaces: Workspaces;
  readonly secrets: Secrets;
  readonly environments: Environments;
  readonly usage: Usage;
  readonly admin: Admin;

  constructor(opts: ClientOptions = {}) {
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
  headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { accept: "application/json", ...extra };
    if (this.apiKey) h.authorization = `Bearer ${this.apiKey}`;
    // Browsers refuse to set it; Node sends it.
    if (typeof (globalThis as { window?: unknown }).window === "undefined") h["user-agent"] = `subagentd-typescript/${VERSION}`;
    return h;
  }

  /** @internal */
  delay(attempt: number, retryAfter: string | null): number {
    const ra = retryAfter == null ? NaN : Number(retryAfter);
    if (!Number.isNaN(ra)) return Math.min(Math.max(ra, 0), 60) * 1000;
    return Math.random() * Math.min(8000, 250 * 2 ** attempt);
  }

  /** @internal */
  async send(req: Req): Promise<Response> {
    for (let attempt = 0; ; attempt++) {
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(), req.timeoutMs ?? this.timeoutMs);
      let r: Response;
      try {
        r = await this.fetchImpl(this.baseUrl + req.path + query(req.query), {
          method: req.method,
          headers: this.headers({ ...(req.json !== undefined ? { "content-type": "application/json" } : {}), ...req.headers }),
          body: req.json !== undefined ? JSON.stringify(req.json) : req.body,
          signal: ctl.signal,
        });
      } catch (e) {
        clearTimeout(timer);
        if (req.repeatable && attempt < this.maxRetries) {
          await sleep(this.delay(attempt, null));
          continue;
        }
        throw new APIConnectionError(String((e as Error)?.message ?? e));
      }
      clearTimeout(timer);
      if ((r.status === 429 || r.status === 503) && attempt < this.maxRetries) {
        await r.body?.cancel();
        await sleep(this.delay(attempt, r.headers.get("retry-after")));
        continue;
      }
      if (r.status >= 400) throw await problemOf(r);
      return r;
    }
  }

  /** @internal */
  async json<T>(req: Req): Promise<T> {
    const r = await this.send(req);
    const text = await r.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
}

async function problemOf(r: Response): Promise<APIStatusError> {
  const text = await r.text();
  let problem: Partial<Problem> = {};
  try {
    const v = JSON.parse(text);
    if (v && typeof v === "object") problem = v;
  } catch {
    if (text) problem = { detail: text.slice(0, 500) };
  }
  return errorFor(r.status, problem, r.headers);
}

abstract class Resource {
  constructor(protected readonly c: Client) {}
}

function newKey(): string {
  const c = (globalThis as { crypto?: Crypto }).crypto;
  return `subagentd-ts-${c?.randomUUID ? c.randomUUID() : Math.random().toString(36).slice(2) + Date.now()}`;
}

export class Tasks extends Resource {
  /** Submit a task; it runs in the background. Always sent with an `Idempotency-Key`. */
  async create(fields: CreateTask): Promise<Task> {
    return this.c.json<Task>(this.createReq(fields, false));
  }

  private createReq(fields: CreateTask, wait: boolean, waitTimeout?: number): Req {
    const { idempotency_key, ...body } = fields;
    return {
      method: "POST", path: "/tasks", json: compact(body as Record<string, unknown>),
      query: wait ? { wait: "true", timeout: waitTimeout } : undefined,
      headers: { "idempotency-key": idempotency_key ?? newKey() }, repeatable: true,
      timeoutMs: wait ? ((waitTimeout ?? 300) + 30) * 1000 : undefined,
    };
  }

  /** Submit a task and wait until it ends or waits for answers (joining for as long as it runs). */
  async run(fields: CreateTask & { wait_timeout?: number }): Promise<Task> {
    const { wait_timeout, ...rest } = fields;
    let task = await this.c.json<Task>(this.createReq(rest, true, wait_timeout));
    while (!SETTLED.has(task.status)) task = await this.wait(task.id, wait_timeout);
    return task;
  }

  async get(id: string): Promise<Task> {
    return this.c.json<Task>({ method: "GET", path: `/tasks/${id}`, repeatable: true });
  }

  /** Wait for the task to end or pause, for at most `timeout` seconds; the task as it then is. */
  async wait(id: string, timeout?: number): Promise<Task> {
    return this.c.json<Task>({
      method: "GET", path: `/tasks/${id}`, query: { wait: "true", timeout }, repeatable: true,
      timeoutMs: ((timeout ?? 300) + 30) * 1000,
    });
  }

  /** Every task matching, newest first, across all pages. */
  async *list(filter: {
    status?: string | string[]; subagent_type?: string; model?: string; metadata?: Record<string, unknown>;
    created_after?: string; created_before?: string; limit?: number;
  } = {}): AsyncGenerator<Task> {
    let cursor: string | null | undefined;
    do {
      const page = await this.c.json<TaskPage>({ method: "GET", path: "/tasks", query: { ...filter, cursor }, repeatable: true });
      for (const t of page.tasks) yield t;
      cursor = page.next_cursor;
    } while (cursor);
  }

  async cancel(id: string): Promise<Task> {
    return this.c.json<Task>({ method: "POST", path: `/tasks/${id}/cancel`, json: {}, repeatable: true });
  }

  async cancelMany(filter: { status?: string[]; metadata?: Record<string, unknown> } = {}): Promise<CancelledMany> {
    return this.c.json<CancelledMany>({ method: "POST", path: "/tasks/cancel", json: compact(filter) });
  }

  /** Answer pending actions (`approve(id)`, `deny(id, message)`, `output(id, value)`), all or none. */
  async answer(id: string, answers: Answer[]): Promise<Task> {
    return this.c.json<Task>({ method: "POST", path: `/tasks/${id}/actions`, json: answers });
  }

  /**
   * The task's events, live, until its last: stored events (each with its `seq`) and the model's
   * text as it streams (`kind === "output_delta"`, no `seq`). A dropped connection is resumed after
   * the last event seen, without gaps or duplicates.
   */
  async *events(id: string, opts: { after?: number } = {}): AsyncGenerator<Event> {
    let last = opts.after;
    let failures = 0;
    for (;;) {
      let r: Response;
      try {
        r = await this.c.fetchImpl(`${this.c.baseUrl}/tasks/${id}/events`, {
          headers: this.c.headers({ accept: "text/event-stream", ...(last !== undefined ? { "last-event-id": String(last) } : {}) }),
        });
      } catch (e) {
        if (++failures > this.c.maxRetries + 2) throw new APIConnectionError(String((e as Error)?.message ?? e));
        await sleep(this.c.delay(failures, null));
        continue;
      }
      if (r.status === 204) return;
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
            yield { kind: "output_delta", data: ev.data as Record<string, unknown> };
            continue;
          }
          if (ev.id !== undefined) last = Number(ev.id);
          const e = ev.data as Event;
          yield e;
          if (e.kind === "finished") ended = true;
        }
      } catch (e) {
        if (++failures > this.c.maxRetries + 2) throw new APIConnectionError(String((e as Error)?.message ?? e));
        await sleep(this.c.delay(failures, null));
        continue;
      }
      if (ended) return;
      // The stream closed: the task ended (a reconnect is answered 204), or it dropped.
    }
  }

  async messages(id: string): Promise<Message[]> {
    return (await this.c.json<{ messages: Message[] }>({ method: "GET", path: `/tasks/${id}/messages`, repeatable: true })).messages;
  }

  /** The task's patch (a unified diff, `git apply` takes it) once its run ended. */
  async diff(id: string): Promise<string> {
    const r = await this.c.send({ method: "GET", path: `/tasks/${id}/diff`, repeatable: true });
    return r.text();
  }

  async calls(id: string): Promise<Call[]> {
    return (await this.c.json<{ calls: Call[] }>({ method: "GET", path: `/tasks/${id}/calls`, repeatable: true })).calls;
  }
}

/** Server-Sent Events of a response: each event's id, name and parsed data. */
async function* sse(r: Response): AsyncGenerator<{ id?: string; event: string; data: unknown }> {
  if (!r.body) return;
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r\n/g, "\n");
    let at: number;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, at);
      buf = buf.slice(at + 2);
      let id: string | undefined;
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const i = line.indexOf(":");
        const k = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? "" : line.slice(i + 1);
        if (v.startsWith(" ")) v = v.slice(1);
        if (k === "id") id = v;
        else if (k === "event") event = v;
        else if (k === "data") data.push(v);
      }
      if (!data.length) continue;
      const text = data.join("\n");
      let parsed: unknown = text;
      try {
        parsed = JSON.parse(text);
      } catch {
        // kept as text
      }
      yield { id, event, data: parsed };
    }
  }
}

export class Agents extends Resource {
  async list(): Promise<Agent[]> {
    return (await this.c.json<{ agents: Agent[] }>({ method: "GET", path: "/agents", repeatable: true })).agents;
  }
  async get(name: string): Promise<Agent> {
    return this.c.json<Agent>({ method: "GET", path: `/agents/${name}`, repeatable: true });
  }
  /** Create or replace a tenant's agent definition. */
  async put(name: string, definition: { system_prompt: string } & Record<string, unknown>): Promise<Agent> {
    return this.c.json<Agent>({ method: "PUT", path: `/agents/${name}`, json: definition, repeatable: true });
  }
  /** Create or replace a definition from an agent file (`.claude/agents/*.md`). */
  async putMarkdown(name: string, text: string): Promise<Agent> {
    return this.c.json<Agent>({
      method: "PUT", path: `/agents/${name}`, body: text, headers: { "content-type": "text/markdown" }, repeatable: true,
    });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/agents/${name}`, repeatable: true });
  }
}

export class Tools extends Resource {
  async list(): Promise<Tool[]> {
    return (await this.c.json<{ tools: Tool[] }>({ method: "GET", path: "/tools", repeatable: true })).tools;
  }
  async get(name: string): Promise<Tool> {
    return this.c.json<Tool>({ method: "GET", path: `/tools/${name}`, repeatable: true });
  }
  /** Create or replace a catalog tool: an HTTP endpoint, or none (the caller runs it). `policy` defaults to `auto`. */
  async put(name: string, tool: { description: string; parameters: Record<string, unknown>; endpoint?: string; policy?: string; timeout_ms?: number }): Promise<Tool> {
    return this.c.json<Tool>({ method: "PUT", path: `/tools/${name}`, json: compact({ policy: "auto", ...tool }), repeatable: true });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/tools/${name}`, repeatable: true });
  }
  /** A new signing secret for the tenant's tool calls and webhooks (shown once). */
  async rotateSigningSecret(): Promise<{ secret: string; algorithm: string; signed: string }> {
    return this.c.json({ method: "POST", path: "/signing-secret" });
  }
}

export class ToolSources extends Resource {
  async list(): Promise<ToolSource[]> {
    return (await this.c.json<{ tool_sources: ToolSource[] }>({ method: "GET", path: "/tool-sources", repeatable: true })).tool_sources;
  }
  async get(name: string): Promise<ToolSource> {
    return this.c.json<ToolSource>({ method: "GET", path: `/tool-sources/${name}`, repeatable: true });
  }
  async put(name: string, source: { url: string; headers?: Record<string, string> }): Promise<ToolSource> {
    return this.c.json<ToolSource>({ method: "PUT", path: `/tool-sources/${name}`, json: compact(source), repeatable: true });
  }
  async refresh(name: string): Promise<ToolSource> {
    return this.c.json<ToolSource>({ method: "POST", path: `/tool-sources/${name}/refresh`, repeatable: true });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/tool-sources/${name}`, repeatable: true });
  }
}

export class Schedules extends Resource {
  async list(): Promise<Schedule[]> {
    return (await this.c.json<{ schedules: Schedule[] }>({ method: "GET", path: "/schedules", repeatable: true })).schedules;
  }
  async get(name: string): Promise<Schedule> {
    return this.c.json<Schedule>({ method: "GET", path: `/schedules/${name}`, repeatable: true });
  }
  /** Create or replace a schedule: `task` is a body as `tasks.create` takes it. */
  async put(name: string, schedule: { cron: string; task: Omit<CreateTask, "idempotency_key">; timezone?: string; paused?: boolean }): Promise<Schedule> {
    return this.c.json<Schedule>({ method: "PUT", path: `/schedules/${name}`, json: compact(schedule), repeatable: true });
  }
  async pause(name: string): Promise<Schedule> {
    return this.c.json<Schedule>({ method: "POST", path: `/schedules/${name}/pause`, repeatable: true });
  }
  async resume(name: string): Promise<Schedule> {
    return this.c.json<Schedule>({ method: "POST", path: `/schedules/${name}/resume`, repeatable: true });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/schedules/${name}`, repeatable: true });
  }
}

export class Workspaces extends Resource {
  async list(): Promise<Workspace[]> {
    return (await this.c.json<{ workspaces: Workspace[] }>({ method: "GET", path: "/workspaces", repeatable: true })).workspaces;
  }
  async get(name: string): Promise<Workspace> {
    return this.c.json<Workspace>({ method: "GET", path: `/workspaces/${name}`, repeatable: true });
  }
  /** Upload (or replace) a workspace: `archive` is a tar.gz; `dropped` says what was left out. */
  async put(name: string, archive: Uint8Array): Promise<Workspace> {
    return this.c.json<Workspace>({
      method: "PUT", path: `/workspaces/${name}`, body: archive, headers: { "content-type": "application/gzip" }, repeatable: true,
    });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/workspaces/${name}`, repeatable: true });
  }
}

export class Secrets extends Resource {
  async list(): Promise<Secret[]> {
    return (await this.c.json<{ secrets: Secret[] }>({ method: "GET", path: "/secrets", repeatable: true })).secrets;
  }
  /** Set a write-only secret (a private repository's token), sent only to `host`. */
  async put(name: string, secret: { value: string; host: string }): Promise<Secret> {
    return this.c.json<Secret>({ method: "PUT", path: `/secrets/${name}`, json: secret, repeatable: true });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/secrets/${name}`, repeatable: true });
  }
}

export class Environments extends Resource {
  async list(): Promise<Environment[]> {
    return (await this.c.json<{ environments: Environment[] }>({ method: "GET", path: "/environments", repeatable: true }))
      .environments;
  }
  async get(name: string): Promise<Environment> {
    return this.c.json<Environment>({ method: "GET", path: `/environments/${name}`, repeatable: true });
  }
  /**
   * Define (or replace) a named environment: an OCI image and a setup script run once over it,
   * with `network` (hosts, `*.domain`s and CIDRs; `in_runs` for the tasks' commands too) reached
   * through the service's egress proxy.
   */
  async put(
    name: string,
    definition: { image: string; setup?: string; network?: { allow: string[]; in_runs?: boolean } },
  ): Promise<Environment> {
    return this.c.json<Environment>({ method: "PUT", path: `/environments/${name}`, json: definition, repeatable: true });
  }
  async delete(name: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/environments/${name}`, repeatable: true });
  }
}

export interface UsageQuery {
  from?: string;
  to?: string;
  group_by?: string | string[];
  tenant?: string;
}

export class Usage extends Resource {
  /** Usage and cost over days (YYYY-MM-DD), grouped by `day`, `tenant`, `model` and/or `agent_type`. */
  async get(q: UsageQuery = {}): Promise<UsageReport> {
    return this.c.json<UsageReport>({ method: "GET", path: "/usage", query: { ...q }, repeatable: true });
  }
  /** The same report as CSV text. */
  async csv(q: UsageQuery = {}): Promise<string> {
    const r = await this.c.send({ method: "GET", path: "/usage", query: { ...q, format: "csv" }, repeatable: true });
    return r.text();
  }
}

export class Keys extends Resource {
  /** A new API key for `tenant` (its `key` is shown once). */
  async create(tenant: string, name?: string): Promise<NewKey> {
    return this.c.json<NewKey>({ method: "POST", path: "/admin/keys", json: compact({ tenant, name }) });
  }
  async list(tenant?: string): Promise<Key[]> {
    return (await this.c.json<{ keys: Key[] }>({ method: "GET", path: "/admin/keys", query: { tenant }, repeatable: true })).keys;
  }
  async revoke(id: string): Promise<void> {
    await this.c.send({ method: "DELETE", path: `/admin/keys/${id}`, repeatable: true });
  }
}

export class Tenants extends Resource {
  async list(): Promise<string[]> {
    return (await this.c.json<{ tenants: string[] }>({ method: "GET", path: "/admin/tenants", repeatable: true })).tenants;
  }
  async get(name: string): Promise<TenantView> {
    return this.c.json<TenantView>({ method: "GET", path: `/admin/tenants/${name}`, repeatable: true });
  }
  /** Set the tenant's limits (those not given fall back to the configured defaults). */
  async put(name: string, limits: Partial<Limits>): Promise<Limits> {
    return (await this.c.json<{ limits: Limits }>({ method: "PUT", path: `/admin/tenants/${name}`, json: limits, repeatable: true })).limits;
  }
}

/** The admin API (the client's `apiKey` is the admin token). */
export class Admin extends Resource {
  readonly keys: Keys;
  readonly tenants: Tenants;
  constructor(c: Client) {
    super(c);
    this.keys = new Keys(c);
    this.tenants = new Tenants(c);
  }
}
