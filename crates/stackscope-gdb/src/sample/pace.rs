//! When rounds start: a jittered gap around the mean interval, and the end of sampling by
//! rounds, duration or a stop request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::packet::later;

use super::SamplerOptions;

/// The start of the next round.
pub(super) struct Pace {
    jitter: Jitter,
    start: Instant,
    end: Option<Instant>,
    next: Instant,
    /// How long the last round held the target, and a running mean of how long rounds held
    /// it (each round weighing an eighth).
    last_pause: Duration,
    typical_pause: Duration,
}

impl Pace {
    /// Rounds from `start` until `end`, the options' duration after it.
    pub(super) fn new(start: Instant, end: Option<Instant>, interval: Duration) -> Pace {
        let mut jitter = Jitter::seeded();
        let next = after(start, jitter.around(interval));
        Pace {
            jitter,
            start,
            end,
            next,
            last_pause: Duration::ZERO,
            typical_pause: Duration::ZERO,
        }
    }

    /// The round that just ended held the target for `pause`.
    pub(super) fn paused(&mut self, pause: Duration) {
        self.last_pause = pause;
        self.typical_pause = if self.typical_pause.is_zero() {
            pause
        } else {
            (self.typical_pause * 7 + pause) / 8
        };
    }

    /// How long the target runs at least before the next round: as long as the last round
    /// held it, but no longer than rounds typically do, so that one round the host stalled
    /// does not stall the next as long.
    fn least_run(&self) -> Duration {
        self.last_pause.min(self.typical_pause)
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
        // Back to back, the target runs at least as long as the round before held it: a
        // guest let run for microseconds between rounds would hardly move, every look would
        // repeat the one before, and the guest would crawl. At a set rate the jittered
        // schedule alone gives it time: pushing a round later by how long the one before took
        // would space looks by what the last look found: under gdbserver at 400 Hz it took a
        // program's measured 30/70 split to 42-45/55-58 (32-37/63-68 without it).
        if options.interval.is_zero() {
            self.next = self.next.max(after(Instant::now(), self.least_run()));
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
        let gap = self.jitter.around(options.interval);
        self.next = after(self.next, gap).max(after(now, options.interval / 4));
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
    fn the_target_runs_as_long_as_a_typical_round_held_it() {
        let ms = Duration::from_millis;
        let mut pace = Pace::new(Instant::now(), None, Duration::ZERO);
        pace.paused(ms(1));
        assert_eq!(pace.least_run(), ms(1));
        // One round the host stalled: the next waits longer, not as long.
        pace.paused(ms(81));
        assert_eq!(pace.least_run(), ms(11));
        pace.paused(ms(1));
        assert_eq!(pace.least_run(), ms(1));
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
