//! LLM providers behind one trait with neutral request, response and usage types.

pub mod mock;
pub mod pricing;
pub mod retry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
        LlmError {
            kind,
            message: message.into(),
            http_status: None,
            retry_after: None,
        }
    }

    pub fn from_status(
        status: u16,
        message: impl Into<String>,
        retry_after: Option<Duration>,
    ) -> Self {
        let kind = match status {
            408 | 429 => LlmErrorKind::RateLimited,
            529 => LlmErrorKind::Overloaded,
            500..=599 => LlmErrorKind::Server,
            _ => LlmErrorKind::Client,
        };
        LlmError {
            kind,
            message: message.into(),
            http_status: Some(status),
            retry_after,
        }
    }

    pub fn retryable(&self) -> bool {
        match self.kind {
            LlmErrorKind::Connection
            | LlmErrorKind::Timeout
            | LlmErrorKind::RateLimited
            | LlmErrorKind::Overloaded => true,
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
        Some(ModelRef {
            provider: p.to_string(),
            model: m.to_string(),
        })
    }
    pub fn full(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// The configured providers, by name.
#[derive(Clone, Default)]
pub struct Providers {
    map: HashMap<String, Arc<dyn Provider>>,
}

impl Providers {
    pub fn with_builtin() -> Self {
        let mut p = Providers::default();
        p.insert(Arc::new(mock::MockProvider));
        p
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
}
