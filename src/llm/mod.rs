//! LLM providers behind one trait with neutral request, response and usage types: OpenAI-
//! compatible and Anthropic over HTTP, the mock; retries, prices, rate limits, model routing.
//!
//! May import: `config`, `telemetry`. Nothing that stores or runs tasks.

pub mod anthropic;
pub mod limits;
pub mod mock;
pub mod openai;
pub mod pricing;
pub mod retry;
pub mod sse;
pub mod text_tools;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A credential: never printed, logged or serialised.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An HTTP client for provider calls: no redirects, a connect timeout, and no whole-request
/// timeout: a streamed answer may take minutes, and `wire::Timeouts` bound the wait for its
/// first byte and the silences between its chunks instead.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// Calls in flight to one HTTP provider at once, per process, unless configured
/// (`max_connections`): beyond it, calls wait their turn — 10,000 sub-agents in flight need not
/// hold 10,000 connections and their buffers, and no real provider takes that many at once.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;

/// An HTTP provider behind its `max_connections` (the same limiter as `[limits]`' concurrency,
/// under any per-model limits, which wrap it).
fn capped(p: Arc<dyn Provider>, max_connections: Option<u32>) -> Arc<dyn Provider> {
    let cap = limits::LimitConfig {
        concurrency: Some(max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)),
        ..Default::default()
    };
    Arc::new(limits::Limited::new(p, &cap))
}

/// Where a streamed answer's text goes as it arrives (live output).
pub trait TextSink: Send + Sync {
    fn text(&self, piece: &str);
}

/// What a streamed answer has produced so far, readable while the call is in flight (to
/// record an interrupted call's output as it stood), and its text as it arrives, to a sink.
#[derive(Default)]
pub struct Progress {
    output_chars: AtomicU64,
    sink: Option<Arc<dyn TextSink>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("output_chars", &self.output_chars).finish_non_exhaustive()
    }
}

impl Progress {
    /// Progress whose text also goes to `sink`.
    pub fn with_sink(sink: Arc<dyn TextSink>) -> Progress {
        Progress { sink: Some(sink), ..Progress::default() }
    }

    pub fn add_output(&self, chars: usize) {
        self.output_chars.fetch_add(chars as u64, Ordering::Relaxed);
    }

    /// Text the model wrote (not a tool call's arguments).
    pub fn add_text(&self, piece: &str) {
        self.add_output(piece.len());
        if let Some(s) = &self.sink {
            s.text(piece);
        }
    }
    pub fn output_chars(&self) -> u64 {
        self.output_chars.load(Ordering::Relaxed)
    }
}

/// One message of a conversation, in the provider-neutral form we checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        name: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Message {
    /// Characters of text the model reads in this message (tool calls as name + arguments):
    /// the basis of every token estimate.
    pub fn chars(&self) -> usize {
        match self {
            Message::System { content } | Message::User { content } => content.len(),
            Message::Assistant { content, tool_calls } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls.iter().map(|t| t.name.len() + t.arguments.to_string().len()).sum::<usize>()
            }
            Message::Tool { content, .. } => content.len(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: serde_json::Value,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Shared with the run's tool definition (the same every turn).
    pub parameters: Arc<serde_json::Value>,
    /// Run by the provider itself (Anthropic's server-side web search): sent as that
    /// provider's own tool, never called back here; dropped for a provider that has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<crate::kinds::BuiltinTool>,
}

/// The searches a provider's server-side web search may make in one call (Anthropic's
/// `max_uses`); a call's reservation holds that many searches' price.
pub const SERVER_SEARCH_MAX_USES: u32 = 5;

#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// The model name as the provider knows it (no `provider/` prefix).
    pub model: String,
    pub messages: Vec<Message>,
    /// Shared with the run (the same tools every turn): a clone is a count, not a copy.
    pub tools: Arc<[ToolSpec]>,
    pub max_tokens: Option<u32>,
    /// W3C trace context to send along.
    pub traceparent: Option<String>,
    /// Where a streamed answer reports its progress.
    pub progress: Option<Arc<Progress>>,
    /// The JSON Schema the final answer must satisfy: sent as the provider's native structured
    /// output (OpenAI-compatible `response_format`; Anthropic, a `final_answer` tool whose call
    /// comes back as the answer's text).
    pub output_schema: Option<serde_json::Value>,
    /// This call must give the final answer (no other tool call): after an answer that did not
    /// match `output_schema`.
    pub force_output: bool,
}

/// The Anthropic tool that carries a structured final answer.
pub const FINAL_ANSWER_TOOL: &str = "final_answer";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every prompt token, whether read from the provider's cache, written to it, or neither.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (billed at its cached rate).
    pub cached_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic bills them above the input
    /// rate; OpenAI's automatic caching writes at no extra charge and reports none).
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Searches the provider ran itself in this call (Anthropic's server-side web search),
    /// billed per search.
    #[serde(default)]
    pub web_searches: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.web_searches += o.web_searches;
    }
}

/// Why the model stopped producing output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end (OpenAI `stop`, Anthropic `end_turn` / `stop_sequence`).
    #[default]
    Stop,
    /// It asked for tools.
    ToolCalls,
    /// Cut at `max_tokens` or the context's end (OpenAI `length`, Anthropic `max_tokens`): the
    /// text is partial, and a tool call's arguments may be too.
    Length,
    /// Withheld by a content filter or refused.
    Filtered,
    Other(String),
}

impl FinishReason {
    /// OpenAI's `finish_reason` or Anthropic's `stop_reason`.
    pub fn parse(s: &str) -> FinishReason {
        match s {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
            "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
            "length" | "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
            "content_filter" | "refusal" => FinishReason::Filtered,
            other => FinishReason::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
            FinishReason::Filtered => "content_filter",
            FinishReason::Other(s) => s,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ChatResponse {
    /// Final text, if any.
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub http_status: Option<u16>,
    pub finish: FinishReason,
    /// The provider reported no usage: `usage` is estimated from the text (a character is
    /// counted as a quarter of a token).
    pub usage_estimated: bool,
    /// The model that answered, as the provider names it (may differ from the one asked for).
    pub model: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmErrorKind {
    Connection,
    Timeout,
    /// 429 and 408.
    RateLimited,
    /// 529 and provider "overloaded" answers.
    Overloaded,
    /// 500, 502, 503, 504.
    Server,
    /// 400, 401, 403, 404, 422 and other 4xx: the request itself is wrong.
    Client,
    /// A body we cannot understand.
    Protocol,
    /// The prompt plus `max_tokens` do not fit the model's context window.
    ContextExceeded,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    pub kind: LlmErrorKind,
    pub message: String,
    pub http_status: Option<u16>,
    pub retry_after: Option<Duration>,
}

impl LlmError {
    pub fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
        LlmError { kind, message: message.into(), http_status: None, retry_after: None }
    }

    pub fn from_status(status: u16, message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        let kind = match status {
            408 | 429 => LlmErrorKind::RateLimited,
            529 => LlmErrorKind::Overloaded,
            500..=599 => LlmErrorKind::Server,
            _ => LlmErrorKind::Client,
        };
        LlmError { kind, message: message.into(), http_status: Some(status), retry_after }
    }

    pub fn retryable(&self) -> bool {
        match self.kind {
            LlmErrorKind::Connection | LlmErrorKind::Timeout | LlmErrorKind::RateLimited | LlmErrorKind::Overloaded => {
                true
            }
            LlmErrorKind::Server => matches!(self.http_status, None | Some(500 | 502 | 503 | 504)),
            LlmErrorKind::Client | LlmErrorKind::Protocol | LlmErrorKind::ContextExceeded => false,
        }
    }

    /// What a restarting server looks like — a refused or reset connection, or 503 while it
    /// loads its model: retried until the retry deadline, whatever the attempt count.
    pub fn restarting(&self) -> bool {
        self.kind == LlmErrorKind::Connection || self.http_status == Some(503)
    }

    /// The stable error code a task carries when this error ends it.
    pub fn code(&self) -> crate::kinds::FailureCode {
        use crate::kinds::FailureCode;
        match self.kind {
            LlmErrorKind::Protocol => FailureCode::ProviderProtocol,
            LlmErrorKind::Client => FailureCode::ProviderRejected,
            LlmErrorKind::ContextExceeded => FailureCode::ContextExceeded,
            _ => FailureCode::ProviderUnavailable,
        }
    }
}

#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// The name used in `provider/model`.
    fn name(&self) -> &str;
    /// The API it speaks, as OpenTelemetry's `gen_ai.provider.name` names it (`openai`,
    /// `anthropic`); its name by default.
    fn system(&self) -> &str {
        self.name()
    }
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError>;
    /// The host calls go to, for logs (`None` for a provider with no server).
    fn host(&self) -> Option<String> {
        None
    }
}

/// The host of `base_url`, for logs.
pub fn host_of(base_url: &str) -> Option<String> {
    url::Url::parse(base_url).ok().and_then(|u| u.host_str().map(str::to_string))
}

/// Is `base_url` the official API of its kind (whose list prices the shipped table holds)?
pub fn is_official(kind: crate::config::ProviderKind, base_url: &str) -> bool {
    let host = host_of(base_url).unwrap_or_default();
    match kind {
        crate::config::ProviderKind::Openai => host == "api.openai.com",
        crate::config::ProviderKind::Anthropic => host == "api.anthropic.com",
    }
}

/// How one configured provider's calls are made and billed.
#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    /// `max_tokens` of its calls, unless the model's or an agent definition's says otherwise.
    pub max_output_tokens: Option<u32>,
    /// Per model (as the provider knows it): `max_tokens` of its calls.
    pub model_max_output_tokens: BTreeMap<String, u32>,
    /// A whole answer that is a tool call written as text is taken as that tool call.
    pub text_tool_calls: bool,
    /// The shipped price table applies to its models.
    pub shipped_prices: bool,
    /// What its models cannot serve, if anything: `tools`, `structured output`.
    pub cannot: Vec<&'static str>,
}

/// Is `model` a model name at all (`provider/model` or an alias)? Whether it can be served is
/// another matter (`Providers::resolve`).
pub fn check_model_name(model: &str) -> Result<(), String> {
    let ok = !model.is_empty()
        && model.chars().count() <= 200
        && !model.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\u{feff}')
        && model.split_once('/').is_none_or(|(p, m)| !p.is_empty() && !m.is_empty());
    if ok {
        Ok(())
    } else {
        Err("must be `provider/model` or a model alias (no spaces, at most 200 characters)".into())
    }
}

/// At most this many fallback models (each may wait out its own retries).
pub const MAX_FALLBACK_MODELS: usize = 5;

/// A list of fallback models as written: each a model name, none twice, at most five.
pub fn check_fallback_models(models: &[String]) -> Result<Vec<String>, String> {
    if models.len() > MAX_FALLBACK_MODELS {
        return Err(format!("at most {MAX_FALLBACK_MODELS} models"));
    }
    let mut out: Vec<String> = vec![];
    for (i, m) in models.iter().enumerate() {
        let m = m.to_string();
        check_model_name(&m).map_err(|e| format!("[{i}] {m:?}: {e}"))?;
        if out.contains(&m) {
            return Err(format!("[{i}] {m:?} is named twice"));
        }
        out.push(m);
    }
    Ok(out)
}

/// `provider/model`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub provider: String,
    pub model: String,
}

impl ModelRef {
    pub fn parse(s: &str) -> Option<ModelRef> {
        let (p, m) = s.split_once('/')?;
        if p.is_empty() || m.is_empty() {
            return None;
        }
        Some(ModelRef { provider: p.to_string(), model: m.to_string() })
    }
    pub fn full(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// The configured providers, by name, with model aliases, prices and the retry policy.
#[derive(Clone, Default)]
pub struct Providers {
    map: HashMap<String, Arc<dyn Provider>>,
    pub aliases: HashMap<String, String>,
    pub prices: pricing::PriceTable,
    pub retry: retry::RetryPolicy,
    /// From the config file; `SUBAGENTD_DEFAULT_MODEL` wins over it.
    pub default_model: Option<String>,
    /// Providers wrapped in their `[limits]`, by `provider/model` or `provider`.
    limited: HashMap<String, Arc<dyn Provider>>,
    /// By provider name.
    settings: HashMap<String, ProviderSettings>,
}

/// Aliases every installation has (the config file may add or replace them).
const BUILTIN_ALIASES: &[(&str, &str)] = &[
    ("haiku", "anthropic/claude-haiku-4-5"),
    ("sonnet", "anthropic/claude-sonnet-4-5"),
    ("opus", "anthropic/claude-opus-4-1"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    Malformed(String),
    UnknownProvider { provider: String, model: String },
}

impl Providers {
    /// Only the built-in `mock` provider.
    pub fn with_builtin() -> Self {
        let mut p = Providers::default();
        p.insert(Arc::new(mock::MockProvider));
        // The mock prices its own calls (`pricing`), and has no text tool calls to read.
        p.settings.insert("mock".into(), ProviderSettings::default());
        for (a, m) in BUILTIN_ALIASES {
            p.aliases.insert(a.to_string(), m.to_string());
        }
        p
    }

    /// `mock`, then the providers of the config file, then `openai` / `anthropic` from
    /// `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` when the file does not define them.
    pub fn from_config(
        file: &crate::config::FileConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, crate::config::ConfigError> {
        use crate::config::ConfigError;
        let mut p = Providers::with_builtin();
        for (name, pc) in &file.providers {
            p.configured(name, pc, env)?;
        }
        p.keyed_in_env(env);
        for (a, m) in &file.aliases {
            if ModelRef::parse(m).is_none() {
                return Err(ConfigError::Invalid(format!("alias {a:?}: {m:?} is not provider/model")));
            }
            p.aliases.insert(a.clone(), m.clone());
        }
        for (model, pc) in &file.pricing {
            p.prices.overrides.insert(
                model.clone(),
                pricing::Price {
                    input_per_m: pc.input,
                    output_per_m: pc.output,
                    cached_per_m: pc.cached.unwrap_or(pc.input),
                    cache_write_per_m: pc.cache_write.unwrap_or(pc.input),
                    web_search: pc.web_search.unwrap_or_default(),
                },
            );
        }
        if let Some(r) = &file.retry {
            let d = retry::RetryPolicy::default();
            p.retry = retry::RetryPolicy {
                max_attempts: r.max_attempts.unwrap_or(d.max_attempts).max(1),
                base: r.base_ms.map(Duration::from_millis).unwrap_or(d.base),
                cap: r.cap_ms.map(Duration::from_millis).unwrap_or(d.cap),
                deadline: r.deadline_seconds.map(Duration::from_secs).unwrap_or(d.deadline),
            };
        }
        p.default_model = file.default_model.clone();
        for (key, lc) in &file.limits {
            let provider = key.split_once('/').map_or(key.as_str(), |(p, _)| p);
            let inner = p
                .get(provider)
                .ok_or_else(|| ConfigError::Invalid(format!("limits.{key:?}: no provider {provider:?}")))?;
            p.limited.insert(key.clone(), Arc::new(limits::Limited::new(inner, lc)));
        }
        Ok(p)
    }

    /// A provider of the config file.
    fn configured(
        &mut self,
        name: &str,
        pc: &crate::config::ProviderConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), crate::config::ConfigError> {
        use crate::config::{ConfigError, ProviderKind};
        if name == "mock" || name.contains('/') || name.is_empty() {
            return Err(ConfigError::Invalid(format!("provider name {name:?} is reserved or contains '/'")));
        }
        let key = match &pc.api_key_env {
            Some(var) => Some(Secret::new(env(var).ok_or_else(|| {
                ConfigError::Invalid(format!("provider {name}: environment variable {var} (api_key_env) is not set"))
            })?)),
            None => None,
        };
        let timeouts = wire::Timeouts {
            first_byte: Duration::from_secs(pc.first_byte_timeout_seconds.max(1)),
            idle: Duration::from_secs(pc.idle_timeout_seconds.max(1)),
        };
        let base = pc.base_url.clone().unwrap_or_else(|| official_base(pc.kind).into());
        let official = is_official(pc.kind, &base);
        match pc.kind {
            ProviderKind::Openai => {
                let mut o = openai::OpenAi::new(name, &base, key, timeouts);
                if let Some(h) = &pc.auth_header {
                    o.auth_header = h.clone();
                }
                if let Some(f) = &pc.max_tokens_field {
                    if f != "max_tokens" && f != "max_completion_tokens" {
                        return Err(ConfigError::Invalid(format!(
                            "provider {name}: max_tokens_field {f:?} is neither max_tokens nor max_completion_tokens"
                        )));
                    }
                    o.max_tokens_field = f.clone();
                }
                o.query = pc.query.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                o.stream = pc.stream.unwrap_or(true);
                o.prompt_cache_key = pc.prompt_caching.unwrap_or(official);
                self.insert(capped(Arc::new(o), pc.max_connections));
            }
            ProviderKind::Anthropic => {
                let mut a = anthropic::Anthropic::new(name, &base, key, timeouts);
                a.stream = pc.stream.unwrap_or(true);
                a.prompt_caching = pc.prompt_caching.unwrap_or(true);
                self.insert(capped(Arc::new(a), pc.max_connections));
            }
        }
        let mut model_max = BTreeMap::new();
        for (model, mc) in &pc.models {
            if let Some(n) = mc.max_output_tokens {
                model_max.insert(model.clone(), n.max(1));
            }
        }
        self.settings.insert(
            name.to_string(),
            ProviderSettings {
                max_output_tokens: pc.max_output_tokens.map(|n| n.max(1)),
                model_max_output_tokens: model_max,
                text_tool_calls: pc.text_tool_calls.unwrap_or(!official),
                shipped_prices: pc.shipped_prices.unwrap_or(official),
                cannot: [
                    (!pc.supports_tools.unwrap_or(true)).then_some("tools"),
                    (!pc.supports_structured_output.unwrap_or(true)).then_some("structured output"),
                ]
                .into_iter()
                .flatten()
                .collect(),
            },
        );
        Ok(())
    }

    /// `openai` and `anthropic` from their API keys in the environment, unless configured.
    fn keyed_in_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        use crate::config::ProviderKind;
        for (name, kind, key_var, base_var) in [
            ("openai", ProviderKind::Openai, "OPENAI_API_KEY", "OPENAI_BASE_URL"),
            ("anthropic", ProviderKind::Anthropic, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
        ] {
            if self.get(name).is_some() {
                continue;
            }
            let Some(k) = env(key_var) else { continue };
            let base = env(base_var).unwrap_or_else(|| official_base(kind).into());
            let official = is_official(kind, &base);
            let key = Some(Secret::new(k));
            match kind {
                ProviderKind::Openai => {
                    let mut o = openai::OpenAi::new(name, &base, key, wire::Timeouts::default());
                    o.prompt_cache_key = official;
                    self.insert(capped(Arc::new(o), None))
                }
                ProviderKind::Anthropic => self.insert(capped(
                    Arc::new(anthropic::Anthropic::new(name, &base, key, wire::Timeouts::default())),
                    None,
                )),
            }
            let s = ProviderSettings { text_tool_calls: !official, shipped_prices: official, ..Default::default() };
            self.settings.insert(name.into(), s);
        }
    }

    pub fn insert(&mut self, p: Arc<dyn Provider>) {
        self.map.insert(p.name().to_string(), p);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.map.get(name).cloned()
    }

    /// The models the configuration names (aliases' targets, the default, per-model settings)
    /// whose provider is configured: (provider, `provider/model`).
    pub fn known_models(&self) -> Vec<(String, String)> {
        let mut named: Vec<&str> = self.aliases.values().map(String::as_str).collect();
        named.extend(self.default_model.as_deref());
        let per_model: Vec<String> = self
            .settings
            .iter()
            .flat_map(|(p, s)| s.model_max_output_tokens.keys().map(move |m| format!("{p}/{m}")))
            .collect();
        named.extend(per_model.iter().map(String::as_str));
        let mut out: Vec<(String, String)> =
            named.into_iter().filter_map(|n| self.resolve(n).ok()).map(|m| (m.provider.clone(), m.full())).collect();
        out.sort();
        out.dedup();
        out
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.map.keys().cloned().collect();
        v.sort();
        v
    }

    /// An alias or `provider/model`, to a model of a configured provider.
    pub fn resolve(&self, name: &str) -> Result<ModelRef, ResolveError> {
        let full = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        let m = ModelRef::parse(full).ok_or_else(|| ResolveError::Malformed(name.to_string()))?;
        if self.get(&m.provider).is_none() {
            return Err(ResolveError::UnknownProvider { provider: m.provider, model: full.to_string() });
        }
        Ok(m)
    }

    /// The provider to call for `m`: behind the model's limits, else the provider's, else bare.
    pub fn for_model(&self, m: &ModelRef) -> Option<Arc<dyn Provider>> {
        self.limited.get(&m.full()).or_else(|| self.limited.get(&m.provider)).cloned().or_else(|| self.get(&m.provider))
    }

    /// The model's price: configured under `[pricing]`, else the shipped list price when its
    /// provider bills those (the official API, or `shipped_prices = true`), else none.
    pub fn price(&self, m: &ModelRef) -> Option<pricing::Price> {
        let shipped = self.settings.get(&m.provider).is_some_and(|s| s.shipped_prices);
        self.prices.price(m, shipped)
    }

    /// Whether the model has a price of its own under `[pricing]` (or is the mock's).
    pub fn has_configured_price(&self, m: &ModelRef) -> bool {
        self.prices.price(m, false).is_some()
    }

    /// `max_tokens` of the model's calls: the model's setting, else its provider's, else none
    /// (the caller's default applies).
    pub fn max_output_tokens(&self, m: &ModelRef) -> Option<u32> {
        let s = self.settings.get(&m.provider)?;
        s.model_max_output_tokens.get(&m.model).copied().or(s.max_output_tokens)
    }

    /// `max_tokens` of a call of `m`: an agent definition's `agent` override, else the model's
    /// or its provider's setting, else `default`.
    pub fn max_tokens_for(&self, m: &ModelRef, agent: Option<u32>, default: u32) -> u32 {
        agent.or_else(|| self.max_output_tokens(m)).unwrap_or(default).max(1)
    }

    /// Whether the model's provider reads tool calls written as text.
    pub fn text_tool_calls(&self, m: &ModelRef) -> bool {
        self.settings.get(&m.provider).is_some_and(|s| s.text_tool_calls)
    }

    /// What the model's provider cannot serve (`tools`, `structured output`), as configured.
    pub fn cannot(&self, m: &ModelRef) -> &[&'static str] {
        self.settings.get(&m.provider).map_or(&[], |s| s.cannot.as_slice())
    }
}

fn official_base(kind: crate::config::ProviderKind) -> &'static str {
    match kind {
        crate::config::ProviderKind::Openai => "https://api.openai.com/v1",
        crate::config::ProviderKind::Anthropic => "https://api.anthropic.com",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    #[test]
    fn aliases_resolve_and_unknown_providers_are_named() {
        let file: FileConfig = toml::from_str(
            r#"
            [providers.local]
            kind = "openai"
            base_url = "http://127.0.0.1:1/v1"
            [aliases]
            fast = "local/llama3"
            "#,
        )
        .unwrap();
        let p = Providers::from_config(&file, &|_| None).unwrap();
        assert_eq!(p.resolve("fast").unwrap().full(), "local/llama3");
        assert_eq!(p.resolve("mock/x").unwrap().full(), "mock/x");
        assert_eq!(
            p.resolve("sonnet"),
            Err(ResolveError::UnknownProvider {
                provider: "anthropic".into(),
                model: "anthropic/claude-sonnet-4-5".into()
            })
        );
        assert_eq!(p.resolve("gpt"), Err(ResolveError::Malformed("gpt".into())));
    }

    #[test]
    fn keys_come_from_the_environment_and_a_missing_one_is_an_error() {
        let file: FileConfig =
            toml::from_str("[providers.oai]\nkind = \"openai\"\napi_key_env = \"MY_KEY\"\n").unwrap();
        let e = Providers::from_config(&file, &|_| None).err().unwrap();
        assert!(e.to_string().contains("MY_KEY"), "{e}");
        let p = Providers::from_config(&file, &|v| (v == "MY_KEY").then(|| "sk-secret".to_string())).unwrap();
        assert!(p.get("oai").is_some());
        let env_only =
            Providers::from_config(&FileConfig::default(), &|v| (v == "ANTHROPIC_API_KEY").then(|| "k".into()))
                .unwrap();
        assert_eq!(env_only.names(), ["anthropic", "mock"]);
        assert_eq!(format!("{:?}", Secret::new("sk-secret")), "Secret(***)");
    }

    #[test]
    fn configured_prices_take_cache_writes_and_default_them_to_input() {
        let file: FileConfig = toml::from_str(
            "[pricing]\n\"ant/c\" = {input = 3, output = 15, cached = 0.3, cache_write = 3.75}\n\
             \"local/q\" = {input = 1, output = 2}\n",
        )
        .unwrap();
        let p = Providers::from_config(&file, &|_| None).unwrap();
        let c = p.prices.price(&ModelRef::parse("ant/c").unwrap(), false).unwrap();
        assert_eq!(c.cache_write_per_m, rust_decimal::Decimal::new(375, 2));
        let q = p.prices.price(&ModelRef::parse("local/q").unwrap(), false).unwrap();
        assert_eq!((q.cached_per_m, q.cache_write_per_m), (q.input_per_m, q.input_per_m));
    }

    #[test]
    fn max_tokens_field_is_one_of_the_two_names_the_api_has() {
        let with = |f: &str| {
            let file: FileConfig =
                toml::from_str(&format!("[providers.x]\nkind = \"openai\"\nmax_tokens_field = \"{f}\"\n")).unwrap();
            Providers::from_config(&file, &|_| None).map(|_| ())
        };
        assert!(with("max_completion_tokens").is_ok());
        assert!(with("max_tokens").is_ok());
        let e = with("model").unwrap_err().to_string();
        assert!(e.contains("provider x") && e.contains("\"model\""), "{e}");
    }

    #[test]
    fn unknown_config_fields_are_rejected() {
        let r: Result<FileConfig, _> = toml::from_str("[providers.x]\nkind = \"openai\"\nbase = \"http://x\"\n");
        assert!(r.unwrap_err().to_string().contains("unknown field `base`"));
    }
}
