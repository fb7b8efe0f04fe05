//! Retry policy for provider calls: exponential backoff with full jitter, honouring the
//! provider's `Retry-After`, capped in attempts and in total time — except for a server that is
//! restarting (refused or reset connections, 503 while it loads), which is retried until the
//! deadline whatever the attempt count, so that a task survives its model server restarting.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base: Duration,
    pub cap: Duration,
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(250),
            cap: Duration::from_secs(8),
            deadline: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `attempt + 1` (`attempt` counts from 1), or `None` to give up.
    /// `restarting`: the server looks like it is restarting; only the deadline gives up then.
    pub fn next_delay(
        &self,
        attempt: u32,
        elapsed: Duration,
        retry_after: Option<Duration>,
        restarting: bool,
    ) -> Option<Duration> {
        if attempt >= self.max_attempts && !restarting {
            return None;
        }
        let exp = self.base.saturating_mul(1u32 << (attempt - 1).min(16)).min(self.cap);
        let jitter = Duration::from_millis(rand::thread_rng().gen_range(0..=exp.as_millis() as u64));
        let delay = retry_after.map_or(jitter, |ra| ra.max(jitter));
        (elapsed.saturating_add(delay) <= self.deadline).then_some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_after_max_attempts_and_past_deadline() {
        let p = RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(40),
            deadline: Duration::from_secs(1),
        };
        assert!(p.next_delay(1, Duration::ZERO, None, false).unwrap() <= Duration::from_millis(10));
        assert!(p.next_delay(2, Duration::ZERO, None, false).unwrap() <= Duration::from_millis(20));
        assert!(p.next_delay(3, Duration::ZERO, None, false).is_none());
        assert!(p.next_delay(1, Duration::from_millis(999), Some(Duration::from_millis(5)), false).is_none());
    }

    #[test]
    fn honours_retry_after() {
        let p = RetryPolicy::default();
        let d = p.next_delay(1, Duration::ZERO, Some(Duration::from_secs(3)), false).unwrap();
        assert_eq!(d, Duration::from_secs(3));
    }

    #[test]
    fn a_restarting_server_is_retried_until_the_deadline_not_the_attempt_count() {
        let p = RetryPolicy {
            max_attempts: 2,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(40),
            deadline: Duration::from_secs(1),
        };
        assert!(p.next_delay(2, Duration::ZERO, None, false).is_none());
        assert!(p.next_delay(30, Duration::from_millis(500), None, true).unwrap() <= Duration::from_millis(40));
        assert!(p.next_delay(30, Duration::from_millis(999), Some(Duration::from_millis(5)), true).is_none());
    }
}
