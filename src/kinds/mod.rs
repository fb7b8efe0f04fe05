//! The service's domain kinds: a task's status, why a run stopped, how a provider call went,
//! what a paused call waits for, the decision on it and who answered, a task's priority, which
//! failures move a call to a fallback model. Each is an enum, written to and read from its text
//! column once, at the store boundary (the `sqlx` impls below); everywhere else it is matched,
//! never compared as a string.
//!
//! A leaf: imports nothing of the service, so that every layer — `store`, `engine`, `budget`,
//! the lifecycle room, the doors — may use it without an import running back up the layers.

use sqlx::Postgres;

pub mod event;
pub mod text;
pub use event::Event;

/// An enum kept in a text column: its names, both ways, and its `sqlx` and `serde` impls.
macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $v),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $s),+
                }
            }

            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($s => Some($name::$v),)+
                    _ => None,
                }
            }
        }

        /// Compared with its name, as the tests and the doors' strings spell it.
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(concat!("unknown ", stringify!($name), " {:?}"), s))
                })
            }
        }

        impl sqlx::Type<Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, Postgres> for $name {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                let s = <&str as sqlx::Decode<Postgres>>::decode(value)?;
                $name::parse(s).ok_or_else(|| format!(concat!("unknown ", stringify!($name), " {:?}"), s).into())
            }
        }

        impl sqlx::Encode<'_, Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }
    };
}

text_enum! {
    /// A task's state; the schema's check constraint keeps the column to these values.
    TaskStatus {
        /// Waiting for its start time (`run_at`): queued then.
        Scheduled = "scheduled",
        Queued = "queued",
        Running = "running",
        /// Paused until the caller answers its pending actions (decisions or tool outputs).
        RequiresAction = "requires_action",
        Completed = "completed",
        Incomplete = "incomplete",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from `text_enum!`
impl Default for TaskStatus {
    fn default() -> Self {
        TaskStatus::Queued
    }
}

impl TaskStatus {
    /// No run will change it again.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskStatus::Scheduled | TaskStatus::Queued | TaskStatus::Running | TaskStatus::RequiresAction)
    }

    /// Waiting for its time, still to be run, running, or paused: what a cancel applies to.
    pub const OPEN: [TaskStatus; 4] =
        [TaskStatus::Scheduled, TaskStatus::Queued, TaskStatus::Running, TaskStatus::RequiresAction];
}

text_enum! {
    /// Why a run stopped: `final_answer` for a completed task; for an incomplete one, the limit
    /// that stopped it; `cancelled` for a cancel.
    StopReason {
        FinalAnswer = "final_answer",
        MaxTurns = "max_turns",
        /// The answer was cut at the output limit, and no turn was left to ask again.
        MaxTokens = "max_tokens",
        Budget = "budget",
        Timeout = "timeout",
        LoopDetected = "loop_detected",
        /// The final answer never matched the output schema.
        InvalidOutput = "invalid_output",
        /// The model ended with an empty answer.
        FinalAnswerEmpty = "final_answer_empty",
        Cancelled = "cancelled",
    }
}

text_enum! {
    /// Which of a tenant's queued tasks is claimed first: `high`, then `normal`, then `low`
    /// (then arrival). Kept in `tasks.priority` as its rank (2, 1, 0), in the order the claim
    /// index sorts.
    Priority {
        High = "high",
        Normal = "normal",
        Low = "low",
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from `text_enum!`
impl Default for Priority {
    fn default() -> Self {
        Priority::Normal
    }
}

impl Priority {
    pub fn rank(self) -> i16 {
        match self {
            Priority::High => 2,
            Priority::Normal => 1,
            Priority::Low => 0,
        }
    }

    pub fn from_rank(r: i16) -> Priority {
        match r {
            2.. => Priority::High,
            1 => Priority::Normal,
            _ => Priority::Low,
        }
    }
}

text_enum! {
    /// How one provider call attempt went, as the ledger records it.
    CallOutcome {
        Ok = "ok",
        Error = "error",
        /// Stopped while the provider was answering (a cancel, a drain, a lost worker): its
        /// usage is estimated.
        Interrupted = "interrupted",
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from `text_enum!`
impl Default for CallOutcome {
    fn default() -> Self {
        CallOutcome::Ok
    }
}

text_enum! {
    /// The tools the service runs itself: names no tenant tool may take. Each is one
    /// implementation of `tools::builtin::Builtin` (what it does, its schema, policy, the types
    /// that get it, its run), named in that module's one list.
    BuiltinTool {
        /// GET a web page as readable text.
        WebFetch = "web_fetch",
        /// Search the web: titles, URLs and snippets.
        WebSearch = "web_search",
        /// A directory of the task's workspace.
        ListDirectory = "list_directory",
        /// The workspace's files whose paths match a glob pattern.
        Glob = "glob",
        /// Lines of the workspace's files that match a regular expression.
        Grep = "grep",
        /// A file of the workspace, its lines numbered.
        ReadFile = "read_file",
        /// Write a whole file of the task's own copy of the workspace.
        WriteFile = "write_file",
        /// Replace one exact, unique string in a file of the task's copy.
        EditFile = "edit_file",
        /// A shell command in the sandbox, over the task's copy.
        RunCommand = "run_command",
    }
}

/// An agent type built into the service: its prompt, turn budget and filters are the engine's
/// (`engine::agents`), which built-in tools it is given each tool's own (`tools::builtin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentType {
    General,
    Research,
    Explore,
    Plan,
}

impl AgentType {
    pub const ALL: &'static [AgentType] =
        &[AgentType::General, AgentType::Research, AgentType::Explore, AgentType::Plan];

    /// The type a `subagent_type` names, aliases included (`general-purpose` is `general`).
    pub fn parse(name: &str) -> Option<AgentType> {
        match name {
            "general" | "general-purpose" => Some(AgentType::General),
            "research" => Some(AgentType::Research),
            "explore" => Some(AgentType::Explore),
            "plan" => Some(AgentType::Plan),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AgentType::General => "general",
            AgentType::Research => "research",
            AgentType::Explore => "explore",
            AgentType::Plan => "plan",
        }
    }
}

text_enum! {
    /// What a paused tool call waits for (an action's `kind`).
    Gate {
        /// A decision: approve (it runs) or deny (the model is told).
        Approval = "approval",
        /// The caller runs the tool and submits its output.
        Output = "output",
    }
}

text_enum! {
    /// The decision on an approval.
    Decision {
        Approve = "approve",
        Deny = "deny",
    }
}

/// Who answered an action: a key (by its prefix), a tenant in single-user mode, the admin, or
/// nobody in time (`expired`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Answerer {
    Key(String),
    Tenant(String),
    Admin,
    /// No answer came before the action's time ran out.
    #[default]
    Expired,
}

impl Answerer {
    pub fn parse(s: &str) -> Answerer {
        match s {
            "admin" => Answerer::Admin,
            "expired" => Answerer::Expired,
            _ => match (s.strip_prefix("key:"), s.strip_prefix("tenant:")) {
                (Some(k), _) => Answerer::Key(k.to_string()),
                (_, Some(t)) => Answerer::Tenant(t.to_string()),
                // Written by no version: shown as it is, as a tenant's.
                _ => Answerer::Tenant(s.to_string()),
            },
        }
    }
}

impl std::fmt::Display for Answerer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answerer::Key(k) => write!(f, "key:{k}"),
            Answerer::Tenant(t) => write!(f, "tenant:{t}"),
            Answerer::Admin => f.write_str("admin"),
            Answerer::Expired => f.write_str("expired"),
        }
    }
}

impl serde::Serialize for Answerer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Answerer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Answerer::parse(&String::deserialize(d)?))
    }
}

impl sqlx::Type<Postgres> for Answerer {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for Answerer {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(Answerer::parse(<&str as sqlx::Decode<Postgres>>::decode(value)?))
    }
}

impl sqlx::Encode<'_, Postgres> for Answerer {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <String as sqlx::Encode<Postgres>>::encode(self.to_string(), buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_what_it_writes() {
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::parse(s.as_str()), Some(*s));
        }
        for r in StopReason::ALL {
            assert_eq!(StopReason::parse(r.as_str()), Some(*r));
        }
        for o in CallOutcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), serde_json::json!(o.as_str()));
        }
        for a in [Answerer::Key("sk_ab".into()), Answerer::Tenant("t".into()), Answerer::Admin, Answerer::Expired] {
            assert_eq!(Answerer::parse(&a.to_string()), a);
        }
        assert_eq!(TaskStatus::parse("paused"), None);
        assert!(serde_json::from_value::<Gate>(serde_json::json!("maybe")).is_err());
    }

    #[test]
    fn only_the_three_open_states_are_not_terminal() {
        let open: Vec<TaskStatus> = TaskStatus::ALL.iter().copied().filter(|s| !s.is_terminal()).collect();
        assert_eq!(open, TaskStatus::OPEN.to_vec());
    }
}

text_enum! {
    /// A kind of event in a task's log (`task_events.kind`) and on its live stream, as the event
    /// stream, the events pages and the webhooks name it. Each event's `data` is a JSON object of
    /// its own shape (`openapi.yaml`'s `Event`).
    EventKind {
        /// The task was submitted (`subagent_type`, `model`).
        Created = "created",
        /// A scheduled task's time came: it was queued (`run_at`).
        Queued = "queued",
        /// A worker took it (`attempt`, `worker`).
        Claimed = "claimed",
        /// A provider call's reservation was made (its estimate).
        LlmCallStarted = "llm_call_started",
        /// A provider call answered (usage, latency, cost).
        LlmCallFinished = "llm_call_finished",
        /// A provider call failed (its error; it may be tried again).
        LlmCallFailed = "llm_call_failed",
        /// A call moved to the next of its fallback models.
        ModelFallback = "model_fallback",
        /// A fallback model was passed over (why).
        ModelFallbackSkipped = "model_fallback_skipped",
        /// The turn's tool calls began.
        ToolCallsStarted = "tool_calls_started",
        /// One tool call ended (its outcome and duration).
        ToolCallFinished = "tool_call_finished",
        /// A call to a tool the run is not offered, answered as an error and never run.
        ToolCallRefused = "tool_call_refused",
        /// A tool's result was cut at the tool result cap.
        ToolCallCut = "tool_call_cut",
        /// The turn's gated calls wait for decisions or outputs.
        ToolCallsWaiting = "tool_calls_waiting",
        /// Tool calls the model wrote as text were read.
        TextToolCalls = "text_tool_calls",
        /// The same call repeated: the model was warned.
        LoopWarning = "loop_warning",
        /// The answer was cut at the output limit and asked again.
        AnswerCut = "answer_cut",
        /// The final answer did not match the output schema.
        OutputInvalid = "output_invalid",
        /// A turn was committed (`turn`, `messages`).
        Checkpoint = "checkpoint",
        /// A call waits for the tenant's reservations to settle.
        BudgetWait = "budget_wait",
        /// The run paused for its pending actions.
        RequiresAction = "requires_action",
        /// One pending action was answered.
        ActionAnswered = "action_answered",
        /// Every pending action of the pause was answered: the run goes on.
        ActionsAnswered = "actions_answered",
        /// A cancel reached a running task: its worker stops it.
        CancelRequested = "cancel_requested",
        /// The task was cancelled.
        Cancelled = "cancelled",
        /// Its worker gave it back to the queue (a drain, a budget wait).
        Released = "released",
        /// A lost worker's run was queued again or ended.
        Rescued = "rescued",
        /// The task's workspace is on this worker's disk: fetched or unpacked (its time and
        /// bytes), or found in the cache.
        WorkspaceReady = "workspace_ready",
        EnvironmentReady = "environment_ready",
        /// The task ended (`status`, `stop_reason`).
        Finished = "finished",
        /// The run's text as it streams: on the live stream only, never stored (no `seq`).
        OutputDelta = "output_delta",
    }
}

impl EventKind {
    /// Written to the log (every kind but the live stream's `output_delta`).
    pub fn is_stored(self) -> bool {
        self != EventKind::OutputDelta
    }
}

text_enum! {
    /// What a webhook or push notification delivers (`webhook_deliveries.event`, and the `event`
    /// of a webhook's body).
    WebhookEvent {
        /// The task ended.
        TaskFinished = "task.finished",
        /// The task paused for its pending actions.
        TaskRequiresAction = "task.requires_action",
    }
}

text_enum! {
    /// Why a task failed (a failed task's `error.code`; an incomplete one's with an invalid
    /// output too).
    FailureCode {
        /// The provider could not serve the call (connection, timeout, 429, 5xx), retries spent.
        ProviderUnavailable = "provider_unavailable",
        /// The provider refused the request (a 4xx other than a rate limit).
        ProviderRejected = "provider_rejected",
        /// The provider's answer could not be read.
        ProviderProtocol = "provider_protocol",
        /// The prompt does not fit the model's context.
        ContextExceeded = "context_exceeded",
        /// The task's model is no longer configured.
        UnknownModel = "unknown_model",
        /// The task it resumes has no conversation left (purged).
        ResumeUnavailable = "resume_unavailable",
        /// The final answer never matched the output schema (an incomplete task's).
        InvalidOutput = "invalid_output",
        /// The workspace's address is refused by the address guard (a name resolving to a
        /// private address, a host off the allow-list).
        WorkspaceRefused = "workspace_refused",
        /// The workspace's ref names no branch, tag or commit of the repository.
        WorkspaceRefNotFound = "workspace_ref_not_found",
        /// The repository could not be reached or read (the host, its answer, its credentials).
        WorkspaceUnreachable = "workspace_unreachable",
        /// The workspace is over a cap (fetched bytes, time, files, size).
        WorkspaceTooLarge = "workspace_too_large",
        /// The uploaded workspace or the secret it names no longer exists, or was replaced since
        /// the task first read it.
        WorkspaceGone = "workspace_gone",
        /// The environment's registry is refused by the address guard
        /// (`SUBAGENTD_REGISTRY_ALLOW`).
        EnvironmentRefused = "environment_refused",
        /// The registry has no such image (repository, tag or digest).
        EnvironmentNotFound = "environment_not_found",
        /// The image is over a cap (`SUBAGENTD_IMAGE_MAX_MB`, `SUBAGENTD_IMAGE_MAX_ENTRIES`).
        EnvironmentTooLarge = "environment_too_large",
        /// The registry could not be reached or read, or the pull ran out of time.
        EnvironmentUnavailable = "environment_unavailable",
        /// The named environment's setup failed (its exit code and output are on
        /// `GET /environments/{name}`), or it was deleted before the task first started.
        EnvironmentFailed = "environment_failed",
        /// A turn's results could not be stored (the database refused them): the task ends
        /// here, naming why, rather than repeating the work on another attempt.
        CheckpointFailed = "checkpoint_failed",
        /// The workers running it were lost `max_attempts` times.
        WorkerLost = "worker_lost",
        /// The service's own failure.
        Internal = "internal",
    }
}

/// A failure that moves a call to the next model (`fallback_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackWhen {
    /// The model cannot be served (retries ran out, unreachable, 5xx/529, a long 429).
    Unavailable,
    /// The prompt does not fit the model's context.
    ContextLength,
}

impl FallbackWhen {
    pub const ALL: [FallbackWhen; 2] = [FallbackWhen::Unavailable, FallbackWhen::ContextLength];

    pub fn parse(s: &str) -> Option<FallbackWhen> {
        match s {
            "unavailable" => Some(FallbackWhen::Unavailable),
            "context_length" => Some(FallbackWhen::ContextLength),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FallbackWhen::Unavailable => "unavailable",
            FallbackWhen::ContextLength => "context_length",
        }
    }
}

/// A task's `workspace`, as submitted: a git repository at a ref (`git`, `ref`, and the tenant
/// secret `secret` of a private one), or the tenant's uploaded workspace `name`. `web` asks for
/// the web tools beside a private workspace, where the tenant allows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<String>,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<bool>,
}

/// A task's `environment`: the OCI image its commands run in (`{"image": REF}`), resolved to a
/// manifest digest at its first run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl WorkspaceSpec {
    /// Could its contents be private (an upload, or a repository read with a secret)?
    pub fn private(&self) -> bool {
        self.name.is_some() || self.secret.is_some()
    }

    /// `git` or `upload`.
    pub fn source(&self) -> &'static str {
        if self.git.is_some() {
            "git"
        } else {
            "upload"
        }
    }
}
