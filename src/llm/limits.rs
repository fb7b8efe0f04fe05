//! Per-provider and per-model limits from the config file (`[limits."provider/model"]`, and each
//! HTTP provider's `max_connections`):
//! concurrent calls, requests per minute, tokens per minute — so a provider's own rate limit is
//! respected before it answers 429. Per process: with N replicas, give each 1/N.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use super::{ChatRequest, ChatResponse, LlmError, Message, Provider};

pub use crate::config::LimitConfig;

/// A provider behind its limits.
pub struct Limited {
    inner: Arc<dyn Provider>,
    slots: Option<Semaphore>,
    requests: Option<DefaultDirectRateLimiter>,
    tokens: Option<(DefaultDirectRateLimiter, u32)>,
}

impl Limited {
    pub fn new(inner: Arc<dyn Provider>, c: &LimitConfig) -> Limited {
        let per_minute = |n: u32| NonZeroU32::new(n).map(|n| RateLimiter::direct(Quota::per_minute(n)));
        Limited {
            inner,
            slots: c.concurrency.map(|n| Semaphore::new(n.max(1) as usize)),
            requests: c.requests_per_minute.and_then(per_minute),
            tokens: c.tokens_per_minute.and_then(|n| per_minute(n).map(|l| (l, n))),
        }
    }
}

fn estimate_tokens(req: &ChatRequest) -> u32 {
    let chars: usize = req.messages.iter().map(Message::chars).sum();
    (chars / 4) as u32 + req.max_tokens.unwrap_or(0)
}

#[async_trait::async_trait]
impl Provider for Limited {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn system(&self) -> &str {
        self.inner.system()
    }

    fn host(&self) -> Option<String> {
        self.inner.host()
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let _slot = match &self.slots {
            Some(s) => {
                Some(s.acquire().await.map_err(|_| LlmError::new(super::LlmErrorKind::Connection, "limiter closed"))?)
            }
            None => None,
        };
        if let Some(r) = &self.requests {
            r.until_ready().await;
        }
        if let Some((t, burst)) = &self.tokens {
            // A call larger than a minute's budget waits for a whole minute's worth.
            let n = NonZeroU32::new(estimate_tokens(req).clamp(1, *burst)).unwrap_or(NonZeroU32::MIN);
            let _ = t.until_n_ready(n).await;
        }
        self.inner.chat(req).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::llm::mock::MockProvider;

    fn req(prompt: &str) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![Message::User { content: prompt.into() }],
            tools: std::sync::Arc::from(vec![]),
            ..ChatRequest::default()
        }
    }

    #[tokio::test]
    async fn concurrency_is_capped() {
        let l =
            Arc::new(Limited::new(Arc::new(MockProvider), &LimitConfig { concurrency: Some(2), ..Default::default() }));
        let started = Instant::now();
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.chat(&req("[mock:delay_ms=100]")).await.unwrap() })
            })
            .collect();
        for c in calls {
            c.await.unwrap();
        }
        // Four 100 ms calls, two at a time: two rounds.
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn requests_per_minute_hold_back_the_excess() {
        let l =
            Limited::new(Arc::new(MockProvider), &LimitConfig { requests_per_minute: Some(2), ..Default::default() });
        l.chat(&req("a")).await.unwrap();
        l.chat(&req("b")).await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(200), l.chat(&req("c"))).await;
        assert!(third.is_err(), "the third request of the minute waits");
    }
}
