/** A Task as the API shows it. */
export interface Task {
    id: string;
    tenant?: string;
    status: string;
    stop_reason?: string | null;
    subagent_type: string;
    description?: string | null;
    model: string;
    fallback_models?: string[];
    fallback_on?: string[];
    answered_model?: string | null;
    priority?: string;
    run_at?: string;
    prompt: string;
    max_turns?: number | null;
    tools?: string[];
    workspace?: Record<string, unknown>;
    environment?: Record<string, unknown>;
    diff?: DiffStats;
    summary?: string | null;
    output?: unknown;
    error?: Record<string, unknown> | null;
    turns: number;
    usage: Record<string, unknown>;
    cost_usd: number;
    cost_complete: boolean;
    usage_estimated?: boolean;
    waiting_for?: string | null;
    pending_actions?: PendingAction[];
    attempt: number;
    metadata: Record<string, unknown>;
    created_at: string;
    started_at?: string | null;
    finished_at?: string | null;
    queue_ms?: number | null;
    run_ms?: number | null;
    parent_task_id?: string | null;
    trace_id?: string | null;
    webhook?: Record<string, unknown> | null;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** What a paused run waits for, answered by its `id` (POST /tasks/{id}/actions). */
export interface PendingAction {
    id?: string;
    tool_call_id?: string;
    kind?: string;
    name?: string;
    arguments?: unknown;
    turn?: number;
    created_at?: string;
    expires_at?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A page of tasks, newest first. */
export interface TaskPage {
    tasks: Task[];
    next_cursor: string | null;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** One event of a task's log. */
export interface Event {
    seq?: number;
    kind?: string;
    data?: Record<string, unknown>;
    created_at?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A page of a task's events. */
export interface EventsPage {
    events: Event[];
    next_after: number;
    task_status: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** One message of a task's saved conversation. */
export interface Message {
    seq?: number;
    turn?: number;
    message?: Record<string, unknown>;
    created_at?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** One provider call attempt, as the ledger records it. */
export interface Call {
    turn?: number;
    attempt?: number;
    try?: number;
    provider?: string;
    model?: string;
    input_tokens?: number;
    output_tokens?: number;
    cached_tokens?: number;
    cache_write_tokens?: number;
    web_searches?: number;
    cost_usd?: number | null;
    latency_ms?: number;
    http_status?: number | null;
    outcome?: string;
    error?: string | null;
    usage_estimated?: boolean;
    created_at?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** What a bulk cancel did. */
export interface CancelledMany {
    cancelled: string[];
    cancel_requested: string[];
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Agent as the API shows it. */
export interface Agent {
    name: string;
    source: string;
    description?: string;
    system_prompt?: string;
    tools?: unknown;
    builtin_tools?: string[];
    disallowed_tools?: string[];
    model?: string;
    max_turns?: number;
    max_output_tokens?: number;
    approval?: string;
    read_only?: boolean;
    output_schema?: Record<string, unknown>;
    fallback_models?: string[];
    fallback_on?: string[];
    priority?: string;
    claude_code?: Record<string, unknown>;
    warnings?: string[];
    unmatched_tools?: string[];
    tool_mapping?: Record<string, unknown>[];
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Tool as the API shows it. */
export interface Tool {
    name?: string;
    description?: string;
    parameters?: Record<string, unknown>;
    policy?: string;
    source?: string;
    endpoint?: string | null;
    run_by?: string;
    timeout_ms?: number;
    tool_source?: string;
    mcp_tool?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A ToolSource as the API shows it. */
export interface ToolSource {
    name?: string;
    url?: string;
    headers?: string[];
    tools?: Tool[];
    refreshed_at?: string | null;
    last_error?: string | null;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** Calls, tokens and cost of one group (the columns not grouped by are null). */
export interface UsageRow {
    day?: string | null;
    tenant?: string | null;
    model?: string | null;
    agent_type?: string | null;
    api_key?: string | null;
    calls?: number;
    ok?: number;
    failed?: number;
    input_tokens?: number;
    output_tokens?: number;
    cached_tokens?: number;
    cache_write_tokens?: number;
    cost_usd?: number;
    estimated_calls?: number;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** Usage over the days asked, grouped. */
export interface UsageReport {
    from: string;
    to: string;
    group_by: string[];
    rows: UsageRow[];
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** An API key (never the key itself). */
export interface Key {
    id?: string;
    tenant?: string;
    prefix?: string;
    name?: string | null;
    created_at?: string;
    revoked_at?: string | null;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A new API key, with the key itself (shown only in this answer). */
export interface NewKey {
    id: string;
    tenant: string;
    prefix: string;
    name?: string | null;
    created_at?: string;
    revoked_at?: string | null;
    key: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Limits as the API shows it. */
export interface Limits {
    usd_per_day?: number | null;
    usd_per_month?: number | null;
    tokens_per_day?: number | null;
    max_running?: number | null;
    max_queued?: number | null;
    max_task_cost_usd?: number | null;
    max_task_tokens?: number | null;
    max_task_turns?: number | null;
    max_task_timeout_seconds?: number | null;
    approval?: string | null;
    requests_per_second?: number | null;
    request_burst?: number | null;
    max_streams?: number | null;
    max_waits?: number | null;
    fallback_models?: string[] | null;
    max_scheduled?: number | null;
    priority?: string | null;
    builtin_tools_off?: string[] | null;
    web_tools_policy?: string | null;
    web_fetches_per_minute?: number | null;
    private_workspace_web?: string | null;
    web_fetch_domains?: string[] | null;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A tenant's limits, its use now, and the configured defaults of the limits it does not set. */
export interface TenantView {
    name: string;
    limits: Limits;
    use: Record<string, unknown>;
    defaults: Record<string, unknown>;
    storage: Record<string, unknown>;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Schedule as the API shows it. */
export interface Schedule {
    name: string;
    cron: string;
    timezone: string;
    task: Record<string, unknown>;
    paused: boolean;
    next_run_at?: string | null;
    last_run_at?: string | null;
    last_task_id?: string | null;
    last_error?: string | null;
    created_at?: string;
    updated_at?: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Problem as the API shows it. */
export interface Problem {
    type: string;
    code: string;
    title: string;
    status: number;
    detail: string;
    errors?: FieldError[];
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** One field of a request at fault, and what is wrong with it. */
export interface FieldError {
    field: string;
    message: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Workspace as the API shows it. */
export interface Workspace {
    name: string;
    content_hash: string;
    files: number;
    size_bytes: number;
    archive_bytes: number;
    dropped: Record<string, unknown>[];
    created_at: string;
    updated_at: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Secret as the API shows it. */
export interface Secret {
    name: string;
    host: string;
    created_at: string;
    updated_at: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** With a writable copy of its workspace (write_file, edit_file, run_command), once its run ended: the counts of its diff (`GET /tasks/{id}/diff`). Absent otherwise. */
export interface DiffStats {
    files_changed: number;
    lines_added: number;
    lines_removed: number;
    binary_files: number;
    bytes: number;
    omitted?: string[];
    omitted_more?: number;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
/** A Environment as the API shows it. */
export interface Environment {
    name: string;
    image: string;
    setup: string;
    network_allow: string[];
    network_in_runs: boolean;
    definition_hash: string;
    status: string;
    digest?: string | null;
    exit_code?: number | null;
    output_tail?: string | null;
    size_bytes?: number | null;
    built_at?: string | null;
    created_at: string;
    updated_at: string;
    /** Fields this version does not know yet. */
    [field: string]: unknown;
}
export declare const MODEL_FIELDS: Record<string, string[]>;
