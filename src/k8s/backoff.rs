//! Bounded exponential backoff with jitter, so that plugins on many nodes that lost the API
//! server at the same moment do not come back in lockstep.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The longest `Retry-After` honoured; a larger one (a misbehaving proxy) is cut to this.
pub const MAX_SERVER_DELAY: Duration = Duration::from_secs(300);

/// Delays between tries: `initial`, doubling up to `max`, each drawn at random from its upper
/// half (`[d/2, d]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Tries in all, the first included; at least 1.
    pub attempts: u32,
}

impl Default for Backoff {
    /// 6 tries over about 8–16 s: long enough to ride out an API server restart, short enough
    /// for a caller waiting on the result.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
            attempts: 6,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (1 = after the first failure), with jitter.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, random_fraction())
    }

    /// [`Backoff::delay`] with the random draw given: `fraction` in `[0, 1]` picks the delay
    /// within `[d/2, d]`. Never more than `max`.
    pub fn delay_with(&self, retry: u32, fraction: f64) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        let full = self.initial.saturating_mul(1u32 << doublings).min(self.max);
        let half = full / 2;
        half + half.mul_f64(fraction.clamp(0.0, 1.0))
    }

    /// [`Backoff::delay`], but at least what the server asked for (`Retry-After`), which is
    /// honoured up to [`MAX_SERVER_DELAY`]: a server under load says when it can take the next
    /// request, and coming back sooner only adds to its load.
    pub fn delay_after(&self, retry: u32, asked: Option<Duration>) -> Duration {
        let own = self.delay(retry);
        asked.map_or(own, |asked| own.max(asked.min(MAX_SERVER_DELAY)))
    }

    /// Whether another try is allowed after `tried` tries.
    pub fn may_retry(&self, tried: u32) -> bool {
        tried < self.attempts.max(1)
    }
}

/// A number in `[0, 1)` from the standard library's randomly keyed hasher: jitter needs no
/// cryptographic quality, and this keeps a random-number crate out of the dependencies.
fn random_fraction() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x9e37_79b9_7f4a_7c15);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            attempts: 4,
        }
    }

    #[test]
    fn delays_double_from_the_initial_delay_up_to_the_maximum() {
        let got: Vec<Duration> = (1..=6).map(|r| backoff().delay_with(r, 1.0)).collect();
        let want: Vec<Duration> = [100, 200, 400, 800, 1000, 1000]
            .into_iter()
            .map(Duration::from_millis)
            .collect();
        assert_eq!(want, got);
    }

    #[test]
    fn jitter_keeps_a_delay_within_its_upper_half() {
        assert_eq!(Duration::from_millis(200), backoff().delay_with(3, 0.0));
        for retry in 1..40 {
            let d = backoff().delay(retry);
            assert!(d <= Duration::from_secs(1), "retry {retry}: {d:?}");
            assert!(d >= Duration::from_millis(50), "retry {retry}: {d:?}");
        }
    }

    #[test]
    fn a_retry_after_from_the_server_lengthens_the_delay_up_to_a_bound() {
        let b = backoff();
        assert!(b.delay_after(1, None) <= Duration::from_millis(100));
        assert_eq!(
            Duration::from_secs(3),
            b.delay_after(1, Some(Duration::from_secs(3)))
        );
        assert_eq!(
            MAX_SERVER_DELAY,
            b.delay_after(1, Some(Duration::from_secs(86_400)))
        );
        let short = b.delay_after(4, Some(Duration::from_millis(1)));
        assert!(short >= Duration::from_millis(400), "{short:?}");
    }

    #[test]
    fn tries_stop_at_the_attempt_limit() {
        let got: Vec<bool> = (1..=5).map(|t| backoff().may_retry(t)).collect();
        assert_eq!(vec![true, true, true, false, false], got);
    }
}
