//! How much of the time the target may be stopped: an allowance that wall time fills at the
//! allowed share and each round's pause spends. A round waits until the allowance is no
//! longer overdrawn, so over any stretch of time the target is stopped at most that share of
//! it, give or take what a short stretch saved and the last round's pause.

use std::time::{Duration, Instant};

/// The wall time whose allowance may be saved: a round a little early after one a little late
/// (the gaps are jittered) need not wait, but a long quiet stretch buys no burst of rounds.
const SAVINGS: Duration = Duration::from_millis(50);

pub(super) struct Budget {
    /// The share of wall time the target may be stopped, above 0.
    share: f64,
    /// Seconds of pause the target can take now; below zero after a round that took more.
    balance: f64,
    /// When the balance was last brought up to date.
    at: Instant,
    /// Time the rounds stopped the target, in all.
    pub(super) paused: Duration,
}

impl Budget {
    /// Nothing saved from before `now`.
    pub(super) fn new(share: f64, now: Instant) -> Budget {
        Budget {
            share,
            balance: 0.0,
            at: now,
            paused: Duration::ZERO,
        }
    }

    pub(super) fn share(&self) -> f64 {
        self.share
    }

    /// The allowance the time since the last update earned, the pause included: the target
    /// is stopped for a share of the wall time, which goes on while it is.
    fn fill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.share;
        self.balance = (self.balance + earned).min(SAVINGS.as_secs_f64() * self.share);
        self.at = self.at.max(now);
    }

    /// A round that stopped the target for `pause` ended at `now`.
    pub(super) fn spend(&mut self, pause: Duration, now: Instant) {
        self.fill(now);
        self.balance -= pause.as_secs_f64();
        self.paused += pause;
    }

    /// The earliest the next round may stop the target: when the balance is back to zero.
    pub(super) fn earliest(&self) -> Instant {
        if self.balance >= 0.0 {
            return self.at;
        }
        let wait = Duration::try_from_secs_f64(-self.balance / self.share).unwrap_or(SAVINGS);
        self.at.checked_add(wait).unwrap_or(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds of `pauses` (cycled), each started as early as the budget lets, for `total`
    /// of simulated time; the paused share of every window of `window`.
    fn worst_share(share: f64, pauses: &[Duration], total: Duration, window: Duration) -> f64 {
        let start = Instant::now();
        let mut budget = Budget::new(share, start);
        let mut stops = Vec::new();
        let mut i = 0;
        while budget.earliest() < start + total {
            let begin = budget.earliest();
            let pause = pauses[i % pauses.len()];
            i += 1;
            budget.spend(pause, begin + pause);
            stops.push((begin, pause));
        }
        let mut worst = 0.0f64;
        for (k, &(from, _)) in stops.iter().enumerate() {
            let to = from + window;
            let paused: Duration = stops[k..]
                .iter()
                .take_while(|(s, _)| *s < to)
                .map(|&(s, p)| p.min(to - s))
                .sum();
            worst = worst.max(paused.as_secs_f64() / window.as_secs_f64());
        }
        worst
    }

    #[test]
    fn rounds_as_early_as_allowed_stop_the_target_no_more_than_the_share() {
        let us = Duration::from_micros;
        // Pauses of a quiet host, and of a loaded one with a long stall among them.
        let quiet = [us(300), us(250), us(350), us(320)];
        let loaded = [us(300), us(2_000), us(40_000), us(500), us(900)];
        for pauses in [&quiet[..], &loaded[..]] {
            let worst = worst_share(
                0.05,
                pauses,
                Duration::from_secs(20),
                Duration::from_secs(1),
            );
            // One second's share, plus the savings and at most one round's overhang.
            let bound = 0.05 + (0.05 * SAVINGS.as_secs_f64() + 0.040) / 1.0;
            assert!(worst <= bound, "{pauses:?}: {worst}");
            assert!(worst >= 0.045, "the budget is used, not wasted: {worst}");
        }
    }

    #[test]
    fn a_long_pause_is_paid_back_before_the_next_round() {
        let start = Instant::now();
        let mut budget = Budget::new(0.05, start);
        assert_eq!(budget.earliest(), start);
        let ms = Duration::from_millis;
        budget.spend(ms(10), start + ms(10));
        // 10 ms stopped at 5% needs 200 ms of wall time, 10 of which were the pause itself.
        let wait = budget.earliest() - start;
        assert!(wait >= ms(199) && wait <= ms(201), "{wait:?}");
    }
}
