import type { Agent, Call, CancelledMany, Event, Key, Limits, Message, NewKey, Problem, Schedule, Task, TenantView, Tool, ToolSource, UsageReport, Workspace, Secret, Environment } from "./models.js";
export * from "./models.js";
export * as webhooks from "./webhooks.js";
export declare const VERSION = "0.1.0";
/** A task that `run` and `wait` stop at: it ended, or it waits for answers. */
export declare const SETTLED: Set<string>;
export declare const TERMINAL: Set<string>;
/** Every error of this library. */
export declare class SubagentdError extends Error {
}
/** The service could not be reached, or the connection dropped before an answer. */
export declare class APIConnectionError extends SubagentdError {
}
/** The service answered with an error status, and the problem it sent (RFC 9457). */
export declare class APIStatusError extends SubagentdError {
    readonly status: number;
    readonly problem: Partial<Problem>;
    readonly code?: string;
    readonly detail?: string;
    readonly errors: {
        field: string;
        message: string;
    }[];
    readonly headers: Headers;
    constructor(status: number, problem: Partial<Problem>, headers: Headers);
}
/** 400 or 422: the request is not valid (`errors` names each field at fault). */
export declare class ValidationError extends APIStatusError {
}
/** 401: no key, or one that is not valid. */
export declare class AuthenticationError extends APIStatusError {
}
/** 403: not allowed. */
export declare class PermissionDeniedError extends APIStatusError {
}
/** 404: not found (another tenant's task is not found either). */
export declare class NotFoundError extends APIStatusError {
}
/** 409: the request conflicts with the state. */
export declare class ConflictError extends APIStatusError {
}
/** 429: a rate, queue, stream or schedule limit; `retryAfter` is the wait the service asked. */
export declare class RateLimitError extends APIStatusError {
    get retryAfter(): number | undefined;
}
/** 5xx: the service could not do it now, or failed. */
export declare class ServerError extends APIStatusError {
}
/** An answer to a pending action. */
export type Answer = {
    id: string;
    decision?: "approve" | "deny";
    message?: string;
    output?: unknown;
};
/** Approve a pending call: it runs. */
export declare const approve: (id: string, message?: string) => Answer;
/** Deny a pending call: the sub-agent is told, and it does not run. */
export declare const deny: (id: string, message?: string) => Answer;
/** Give a caller tool's output (any JSON). */
export declare const output: (id: string, value: unknown) => Answer;
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
    workspace?: {
        git?: string;
        ref?: string;
        secret?: string;
        name?: string;
        web?: boolean;
    };
    /** Where `run_command` runs: `{image}` (an OCI reference) or `{name}` (a named environment). */
    environment?: {
        image?: string;
        name?: string;
    };
    /** Sent as `Idempotency-Key` (made here when not given: a retried create makes one task). */
    idempotency_key?: string;
}
export declare class Client {
    readonly baseUrl: string;
    readonly apiKey?: string;
    readonly timeoutMs: number;
    readonly maxRetries: number;
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
    constructor(opts?: ClientOptions);
}
declare abstract class Resource {
    protected readonly c: Client;
    constructor(c: Client);
}
export declare class Tasks extends Resource {
    /** Submit a task; it runs in the background. Always sent with an `Idempotency-Key`. */
    create(fields: CreateTask): Promise<Task>;
    private createReq;
    /** Submit a task and wait until it ends or waits for answers (joining for as long as it runs). */
    run(fields: CreateTask & {
        wait_timeout?: number;
    }): Promise<Task>;
    get(id: string): Promise<Task>;
    /** Wait for the task to end or pause, for at most `timeout` seconds; the task as it then is. */
    wait(id: string, timeout?: number): Promise<Task>;
    /** Every task matching, newest first, across all pages. */
    list(filter?: {
        status?: string | string[];
        subagent_type?: string;
        model?: string;
        metadata?: Record<string, unknown>;
        created_after?: string;
        created_before?: string;
        limit?: number;
    }): AsyncGenerator<Task>;
    cancel(id: string): Promise<Task>;
    cancelMany(filter?: {
        status?: string[];
        metadata?: Record<string, unknown>;
    }): Promise<CancelledMany>;
    /** Answer pending actions (`approve(id)`, `deny(id, message)`, `output(id, value)`), all or none. */
    answer(id: string, answers: Answer[]): Promise<Task>;
    /**
     * The task's events, live, until its last: stored events (each with its `seq`) and the model's
     * text as it streams (`kind === "output_delta"`, no `seq`). A dropped connection is resumed after
     * the last event seen, without gaps or duplicates.
     */
    events(id: string, opts?: {
        after?: number;
    }): AsyncGenerator<Event>;
    messages(id: string): Promise<Message[]>;
    /** The task's patch (a unified diff, `git apply` takes it) once its run ended. */
    diff(id: string): Promise<string>;
    calls(id: string): Promise<Call[]>;
}
export declare class Agents extends Resource {
    list(): Promise<Agent[]>;
    get(name: string): Promise<Agent>;
    /** Create or replace a tenant's agent definition. */
    put(name: string, definition: {
        system_prompt: string;
    } & Record<string, unknown>): Promise<Agent>;
    /** Create or replace a definition from an agent file (`.claude/agents/*.md`). */
    putMarkdown(name: string, text: string): Promise<Agent>;
    delete(name: string): Promise<void>;
}
export declare class Tools extends Resource {
    list(): Promise<Tool[]>;
    get(name: string): Promise<Tool>;
    /** Create or replace a catalog tool: an HTTP endpoint, or none (the caller runs it). `policy` defaults to `auto`. */
    put(name: string, tool: {
        description: string;
        parameters: Record<string, unknown>;
        endpoint?: string;
        policy?: string;
        timeout_ms?: number;
    }): Promise<Tool>;
    delete(name: string): Promise<void>;
    /** A new signing secret for the tenant's tool calls and webhooks (shown once). */
    rotateSigningSecret(): Promise<{
        secret: string;
        algorithm: string;
        signed: string;
    }>;
}
export declare class ToolSources extends Resource {
    list(): Promise<ToolSource[]>;
    get(name: string): Promise<ToolSource>;
    put(name: string, source: {
        url: string;
        headers?: Record<string, string>;
    }): Promise<ToolSource>;
    refresh(name: string): Promise<ToolSource>;
    delete(name: string): Promise<void>;
}
export declare class Schedules extends Resource {
    list(): Promise<Schedule[]>;
    get(name: string): Promise<Schedule>;
    /** Create or replace a schedule: `task` is a body as `tasks.create` takes it. */
    put(name: string, schedule: {
        cron: string;
        task: Omit<CreateTask, "idempotency_key">;
        timezone?: string;
        paused?: boolean;
    }): Promise<Schedule>;
    pause(name: string): Promise<Schedule>;
    resume(name: string): Promise<Schedule>;
    delete(name: string): Promise<void>;
}
export declare class Workspaces extends Resource {
    list(): Promise<Workspace[]>;
    get(name: string): Promise<Workspace>;
    /** Upload (or replace) a workspace: `archive` is a tar.gz; `dropped` says what was left out. */
    put(name: string, archive: Uint8Array): Promise<Workspace>;
    delete(name: string): Promise<void>;
}
export declare class Secrets extends Resource {
    list(): Promise<Secret[]>;
    /** Set a write-only secret (a private repository's token), sent only to `host`. */
    put(name: string, secret: {
        value: string;
        host: string;
    }): Promise<Secret>;
    delete(name: string): Promise<void>;
}
export declare class Environments extends Resource {
    list(): Promise<Environment[]>;
    get(name: string): Promise<Environment>;
    /**
     * Define (or replace) a named environment: an OCI image and a setup script run once over it,
     * with `network` (hosts, `*.domain`s and CIDRs; `in_runs` for the tasks' commands too) reached
     * through the service's egress proxy.
     */
    put(name: string, definition: {
        image: string;
        setup?: string;
        network?: {
            allow: string[];
            in_runs?: boolean;
        };
    }): Promise<Environment>;
    delete(name: string): Promise<void>;
}
export interface UsageQuery {
    from?: string;
    to?: string;
    group_by?: string | string[];
    tenant?: string;
}
export declare class Usage extends Resource {
    /** Usage and cost over days (YYYY-MM-DD), grouped by `day`, `tenant`, `model` and/or `agent_type`. */
    get(q?: UsageQuery): Promise<UsageReport>;
    /** The same report as CSV text. */
    csv(q?: UsageQuery): Promise<string>;
}
export declare class Keys extends Resource {
    /** A new API key for `tenant` (its `key` is shown once). */
    create(tenant: string, name?: string): Promise<NewKey>;
    list(tenant?: string): Promise<Key[]>;
    revoke(id: string): Promise<void>;
}
export declare class Tenants extends Resource {
    list(): Promise<string[]>;
    get(name: string): Promise<TenantView>;
    /** Set the tenant's limits (those not given fall back to the configured defaults). */
    put(name: string, limits: Partial<Limits>): Promise<Limits>;
}
/** The admin API (the client's `apiKey` is the admin token). */
export declare class Admin extends Resource {
    readonly keys: Keys;
    readonly tenants: Tenants;
    constructor(c: Client);
}
