//! Per-tenant API request rates: `requests_per_second` and `request_burst` of a tenant's limits
//! (or the configured defaults), counted by this process alone — with N replicas behind a
//! balancer a tenant may make up to N times its rate. Off unless a rate is set.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::error::ApiError;

/// One limiter per tenant, made again when the tenant's rate or burst changes.
#[derive(Default)]
pub struct RateLimits {
    tenants: Mutex<HashMap<String, Entry>>,
    clock: DefaultClock,
}

struct Entry {
    rate: f64,
    burst: u32,
    limiter: Arc<DefaultDirectRateLimiter>,
}

/// The burst when none is set: one second's worth of the rate, at least one request.
pub fn default_burst(rate: f64) -> u32 {
    rate.ceil().clamp(1.0, u32::MAX as f64) as u32
}

impl RateLimits {
    /// Count one request of `tenant`; `Err(wait)` when it is over its rate, with the time until
    /// a request would be let through.
    pub fn check(&self, tenant: &str, rate: f64, burst: Option<i32>) -> Result<(), Duration> {
        let burst = burst.and_then(|b| u32::try_from(b).ok()).filter(|b| *b > 0).unwrap_or_else(|| default_burst(rate));
        let limiter = {
            let mut map = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(tenant) {
                Some(e) if e.rate == rate && e.burst == burst => e.limiter.clone(),
                _ => {
                    let period = Duration::from_secs_f64(1.0 / rate).max(Duration::from_nanos(1));
                    let quota = Quota::with_period(period)
                        .expect("a positive period")
                        .allow_burst(NonZeroU32::new(burst).expect("a positive burst"));
                    let limiter = Arc::new(RateLimiter::direct(quota));
                    map.insert(tenant.to_string(), Entry { rate, burst, limiter: limiter.clone() });
                    limiter
                }
            }
        };
        limiter.check().map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// 429 with `Retry-After` (whole seconds, rounded up).
pub fn too_many(tenant: &str, rate: f64, burst: Option<i32>, wait: Duration) -> ApiError {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    let burst = burst.map(|b| b as u32).unwrap_or_else(|| default_burst(rate));
    metrics::counter!("subagentd_rate_limited_total", "tenant" => tenant.to_string()).increment(1);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        "Too many requests",
        format!(
            "tenant {tenant:?} may make {rate} requests per second (burst {burst}) to this replica; \
             retry after {secs} s"
        ),
    )
    .header(header::RETRY_AFTER, HeaderValue::from(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_let_through_then_the_rate_holds_and_tenants_count_apart() {
        let r = RateLimits::default();
        for _ in 0..3 {
            assert!(r.check("a", 2.0, Some(3)).is_ok());
        }
        let wait = r.check("a", 2.0, Some(3)).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500), "{wait:?}");
        assert!(r.check("b", 2.0, Some(3)).is_ok(), "another tenant has its own count");
        // A changed rate starts a fresh count.
        assert!(r.check("a", 50.0, Some(1)).is_ok());
        assert!(r.check("a", 50.0, Some(1)).is_err());
    }

    #[test]
    fn the_default_burst_is_one_seconds_worth() {
        assert_eq!(default_burst(0.2), 1);
        assert_eq!(default_burst(10.0), 10);
        assert_eq!(default_burst(2.5), 3);
    }
}
