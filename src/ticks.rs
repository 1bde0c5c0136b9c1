//! Periodic timers that fire together. Every [`Ticks`] of the process falls on a multiple of
//! its period since one shared epoch, so timers whose periods divide each other (1, 5, 10,
//! 30 and 60 s) expire in the same wake-up instead of each waking the process on its own.
//!
//! Why: on the virtual machines the plugin runs on, one wake-up of an idle process costs
//! 0.1–0.5 ms of CPU whatever little it then does (its caches went cold while it slept), and
//! tokio wakes once more for each level of its timer wheel a deadline cascades through
//! (a 10 s timer wakes the process about three times). An idle plugin's CPU is its number
//! of wake-ups; sharing them is the cheapest way to have fewer.

use std::sync::LazyLock;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// The instant every [`Ticks`] is aligned to: the first use in the process.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// A periodic timer: the first [`Ticks::tick`] completes at once (as with
/// [`tokio::time::interval`]), later ones on the next multiple of `period` since the shared
/// epoch. A tick missed because the task was busy is skipped, not made up, so the timer
/// stays on its grid.
#[derive(Debug)]
pub struct Ticks {
    first: bool,
    interval: Interval,
}

impl Ticks {
    /// A timer ticking every `period` (at least 1 ms) on the shared grid.
    pub fn every(period: Duration) -> Ticks {
        let period = period.max(Duration::from_millis(1));
        let now = Instant::now();
        let mut interval = tokio::time::interval_at(next_on_grid(*EPOCH, now, period), period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        Ticks {
            first: true,
            interval,
        }
    }

    /// Completes at the next tick.
    pub async fn tick(&mut self) {
        if std::mem::take(&mut self.first) {
            return;
        }
        self.interval.tick().await;
    }
}

/// The next instant on `period`'s grid after now: for a one-off wait (a retry's next round)
/// that should wake the process together with the [`Ticks`] of dividing periods.
pub fn next(period: Duration) -> Instant {
    next_on_grid(*EPOCH, Instant::now(), period.max(Duration::from_millis(1)))
}

/// The first instant after `now` that is a whole number of `period`s after `epoch`.
fn next_on_grid(epoch: Instant, now: Instant, period: Duration) -> Instant {
    let since = now.saturating_duration_since(epoch).as_nanos();
    let step = period.as_nanos().max(1);
    let periods = since / step + 1;
    epoch + Duration::from_nanos(u64::try_from(periods * step).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_tick_is_the_next_multiple_of_the_period() {
        let epoch = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(next_on_grid(epoch, epoch, s(10)), epoch + s(10));
        assert_eq!(
            next_on_grid(epoch, epoch + Duration::from_millis(9_999), s(10)),
            epoch + s(10)
        );
        assert_eq!(next_on_grid(epoch, epoch + s(10), s(10)), epoch + s(20));
        assert_eq!(next_on_grid(epoch, epoch + s(23), s(5)), epoch + s(25));
    }

    #[tokio::test(start_paused = true)]
    async fn timers_of_dividing_periods_fire_at_the_same_instants() {
        let mut fast = Ticks::every(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(2_300)).await;
        let mut slow = Ticks::every(Duration::from_secs(5));
        // Both first ticks are immediate.
        fast.tick().await;
        slow.tick().await;
        let epoch = *EPOCH;
        slow.tick().await;
        let at = Instant::now();
        assert_eq!(
            (at - epoch).as_millis() % 5_000,
            0,
            "the slow timer's second tick lies on its grid"
        );
        // The fast timer's ticks missed meanwhile are skipped; its next is on the same grid
        // and, at a multiple of 5 s, at the same instant as the slow one's.
        fast.tick().await;
        assert_eq!((Instant::now() - epoch).as_millis() % 1_000, 0);
    }
}
