//! When rounds start: a jittered gap around the mean interval, never before the slowdown
//! budget ([`Budget`]) lets the target be stopped again, and the end of sampling by rounds,
//! duration or a stop request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::packet::later;

use super::budget::Budget;
use super::SamplerOptions;

/// The longest mean gap between rounds as often as a limit allows: the budget, not the gap,
/// keeps the target within the limit, and on a busy host a target that ran longer is slower to
/// stop (a QEMU guest's vCPU threads that ran flat out wait longer for a CPU to notice the
/// stop). Rounds spaced by what slow stops cost made the next stops slower: 11-13 fresh
/// stacks/s where rounds 5 ms apart, waiting for the budget, got 27-29 at the same 5%.
const LONGEST_FREE_GAP: Duration = Duration::from_millis(5);

/// The start of the next round.
pub(super) struct Pace {
    jitter: Jitter,
    start: Instant,
    end: Option<Instant>,
    next: Instant,
    /// A running mean of how long rounds held the target (each round weighing an eighth).
    typical_pause: Duration,
    budget: Budget,
    /// Rounds that started later than their schedule to keep within the budget.
    pub(super) late: u64,
}

impl Pace {
    /// Rounds from `start` until `end`, the options' duration after it, stopping the target
    /// at most `share` of the time.
    pub(super) fn new(
        start: Instant,
        end: Option<Instant>,
        interval: Duration,
        share: f64,
    ) -> Pace {
        let mut jitter = Jitter::seeded();
        let next = after(start, jitter.around(interval));
        Pace {
            jitter,
            start,
            end,
            next,
            typical_pause: Duration::ZERO,
            budget: Budget::new(share, start),
            late: 0,
        }
    }

    /// The round that just ended, now, held the target for `pause`.
    pub(super) fn paused(&mut self, pause: Duration, now: Instant) {
        self.typical_pause = if self.typical_pause.is_zero() {
            pause
        } else {
            (self.typical_pause * 7 + pause) / 8
        };
        self.budget.spend(pause, now);
    }

    /// Time the rounds stopped the target, in all.
    pub(super) fn total_paused(&self) -> Duration {
        self.budget.paused
    }

    /// The mean gap between the starts of two rounds: the interval asked for or, back to
    /// back, what the budget allows at a typical round's pause, at most [`LONGEST_FREE_GAP`]
    /// under a limit (the budget makes rounds wait when stops cost more). Even without a
    /// limit the target runs as long as a typical round stops it: a guest let run for
    /// microseconds between rounds would hardly move, and every look would repeat the one
    /// before.
    fn mean_gap(&self, interval: Duration) -> Duration {
        if !interval.is_zero() {
            return interval;
        }
        let share = self.budget.share();
        let paid_back = self.typical_pause.div_f64(share.min(0.5));
        if share < 1.0 {
            paid_back.min(LONGEST_FREE_GAP)
        } else {
            paid_back
        }
    }

    /// Waits for the next round after `rounds` and returns when it starts; `None` when
    /// sampling is over.
    pub(super) fn wait(
        &mut self,
        options: &SamplerOptions,
        rounds: u64,
        stop: &AtomicBool,
    ) -> Option<Instant> {
        if options.rounds.is_some_and(|n| rounds >= n) || stop.load(Ordering::Relaxed) {
            return None;
        }
        if options.duration.is_some_and(|d| {
            self.start.elapsed().saturating_add(options.interval.min(d)) > d && rounds > 0
        }) {
            return None;
        }
        // The budget, not the last round, decides how soon the target is stopped again: a
        // round pushed later by how long the one before took would space looks by what the
        // last look found (under gdbserver at 400 Hz that took a program's measured 30/70
        // split to 42-45/55-58), while the budget repays pauses over many rounds.
        let earliest = self.budget.earliest();
        if earliest > self.next {
            self.next = earliest;
            self.late += 1;
        }
        // A round due after the end would only be cut off; an interval longer than the
        // whole duration still gets its one round, at once.
        if self.end.is_some_and(|end| self.next >= end) {
            if rounds > 0 {
                return None;
            }
            self.next = Instant::now();
        }
        if !wait_until(self.next, stop) {
            return None;
        }
        let now = Instant::now();
        // Late rounds are made up for, but never closer than a quarter of the mean gap: samples
        // taken in a burst after a stall would all land on the same spot and count it many times.
        let mean = self.mean_gap(options.interval);
        let gap = self.jitter.around(mean);
        self.next = after(self.next, gap).max(after(now, mean / 4));
        Some(now)
    }
}

/// A small pseudo-random generator (xorshift64*) for the gaps between rounds, so sampling
/// never runs in lockstep with periodic work in the guest.
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter(nanos | 1)
    }

    /// A duration uniformly between half and one and a half of `mean`.
    fn around(&mut self, mean: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let unit = (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        Duration::try_from_secs_f64(mean.as_secs_f64() * (0.5 + unit)).unwrap_or(mean)
    }
}

/// `at + d`, or far in the future when that is past what the clock holds.
pub(super) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d).unwrap_or_else(|| later(d))
}

/// Sleeps until `deadline`, waking early for `stop`; false when stopped.
fn wait_until(deadline: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_rounds_are_spaced_by_what_the_budget_allows() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let mut pace = Pace::new(Instant::now(), None, Duration::ZERO, 0.05);
        pace.paused(us(100), Instant::now());
        assert_eq!(pace.mean_gap(Duration::ZERO), ms(2));
        // Costlier stops leave the spacing to the budget, the gap no longer than 5 ms.
        pace.paused(ms(20), Instant::now());
        assert!(pace.typical_pause > us(2_000));
        assert_eq!(pace.mean_gap(Duration::ZERO), LONGEST_FREE_GAP);
        // A set interval is kept, whatever the pause.
        assert_eq!(pace.mean_gap(ms(3)), ms(3));
    }

    #[test]
    fn without_a_limit_the_target_runs_as_long_as_a_round_stopped_it() {
        let ms = Duration::from_millis;
        let mut pace = Pace::new(Instant::now(), None, Duration::ZERO, 1.0);
        pace.paused(ms(10), Instant::now());
        assert_eq!(pace.mean_gap(Duration::ZERO), ms(20));
    }

    #[test]
    fn gaps_stay_within_half_and_one_and_a_half_of_the_mean() {
        let mut jitter = Jitter::seeded();
        let mean = Duration::from_millis(10);
        let gaps: Vec<Duration> = (0..10_000).map(|_| jitter.around(mean)).collect();
        assert!(gaps.iter().all(|&g| g >= mean / 2 && g <= mean * 3 / 2));
        let average = gaps.iter().sum::<Duration>() / gaps.len() as u32;
        assert!(
            average > mean * 95 / 100 && average < mean * 105 / 100,
            "{average:?}"
        );
        // Spread over the whole range, not stuck on a few values.
        assert!(
            gaps.iter().any(|&g| g < mean * 6 / 10) && gaps.iter().any(|&g| g > mean * 14 / 10)
        );
    }
}
