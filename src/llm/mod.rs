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
pub mod wire;

use std::collections::HashMap;
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

/// An HTTP client for provider calls: no redirects, a whole-request timeout.
pub fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
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
    pub parameters: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The model name as the provider knows it (no `provider/` prefix).
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
    /// W3C trace context to send along.
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
    }
}

#[derive(Debug, Clone)]
pub struct ChatResponse {
    /// Final text, if any.
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub http_status: Option<u16>,
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
            LlmErrorKind::Client | LlmErrorKind::Protocol => false,
        }
    }

    /// The stable error code a task carries when this error ends it.
    pub fn code(&self) -> &'static str {
        match self.kind {
            LlmErrorKind::Protocol => "provider_protocol",
            LlmErrorKind::Client => "provider_rejected",
            _ => "provider_unavailable",
        }
    }
}

#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// The name used in `provider/model`.
    fn name(&self) -> &str;
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError>;
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
        use crate::config::{ConfigError, ProviderKind};
        let mut p = Providers::with_builtin();
        for (name, pc) in &file.providers {
            if name == "mock" || name.contains('/') || name.is_empty() {
                return Err(ConfigError::Invalid(format!("provider name {name:?} is reserved or contains '/'")));
            }
            let key = match &pc.api_key_env {
                Some(var) => Some(Secret::new(env(var).ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "provider {name}: environment variable {var} (api_key_env) is not set"
                    ))
                })?)),
                None => None,
            };
            let timeout = Duration::from_secs(pc.timeout_seconds.max(1));
            match pc.kind {
                ProviderKind::Openai => {
                    let base = pc.base_url.clone().unwrap_or_else(|| "https://api.openai.com/v1".into());
                    let mut o = openai::OpenAi::new(name, &base, key, timeout);
                    if let Some(h) = &pc.auth_header {
                        o.auth_header = h.clone();
                    }
                    if let Some(f) = &pc.max_tokens_field {
                        o.max_tokens_field = f.clone();
                    }
                    o.query = pc.query.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    p.insert(Arc::new(o));
                }
                ProviderKind::Anthropic => {
                    let base = pc.base_url.clone().unwrap_or_else(|| "https://api.anthropic.com".into());
                    let mut a = anthropic::Anthropic::new(name, &base, key, timeout);
                    if let Some(m) = pc.default_max_tokens {
                        a.default_max_tokens = m;
                    }
                    p.insert(Arc::new(a));
                }
            }
        }
        let timeout = Duration::from_secs(120);
        if p.get("openai").is_none() {
            if let Some(k) = env("OPENAI_API_KEY") {
                let base = env("OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into());
                p.insert(Arc::new(openai::OpenAi::new("openai", &base, Some(Secret::new(k)), timeout)));
            }
        }
        if p.get("anthropic").is_none() {
            if let Some(k) = env("ANTHROPIC_API_KEY") {
                let base = env("ANTHROPIC_BASE_URL").unwrap_or_else(|| "https://api.anthropic.com".into());
                p.insert(Arc::new(anthropic::Anthropic::new("anthropic", &base, Some(Secret::new(k)), timeout)));
            }
        }
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

    pub fn insert(&mut self, p: Arc<dyn Provider>) {
        self.map.insert(p.name().to_string(), p);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.map.get(name).cloned()
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

    pub fn price(&self, m: &ModelRef) -> Option<pricing::Price> {
        self.prices.price(m)
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
    fn unknown_config_fields_are_rejected() {
        let r: Result<FileConfig, _> = toml::from_str("[providers.x]\nkind = \"openai\"\nbase = \"http://x\"\n");
        assert!(r.unwrap_err().to_string().contains("unknown field `base`"));
    }
}
