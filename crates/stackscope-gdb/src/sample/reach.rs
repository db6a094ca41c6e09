//! How much stack a look reads in its first request: learned per pc from the walks before,
//! so that most walks need no second round trip to the stub.

use std::collections::HashMap;

/// What a pc never walked from gets: the widest reach seen so far, at least this.
const FIRST_GUESS: u64 = 512;
/// Slack above the learned reach, for a stack a few words deeper at the same pc.
const SLACK: u64 = 64;
pub(super) const PAGE: u64 = 4096;
/// Pcs remembered before the memory starts over (a guest runs far fewer hot pcs).
const MAX_PCS: usize = 1 << 16;

pub(super) struct Reach {
    by_pc: HashMap<u64, u64>,
    widest: u64,
    /// The largest read the stub takes in one packet.
    most: u64,
}

impl Reach {
    /// Reads of at most `most` bytes.
    pub(super) fn new(most: u64) -> Reach {
        Reach {
            by_pc: HashMap::new(),
            widest: FIRST_GUESS,
            most: most.max(8),
        }
    }

    /// Bytes to read above `sp` for a stack whose leaf is at `pc`: what walks from `pc`
    /// read, with slack, but not into the page after the last byte they read (the top of a
    /// stack may be followed by unmapped memory, and a stub fails a read that touches it).
    pub(super) fn of(&self, pc: u64, sp: u64) -> usize {
        let need = self.by_pc.get(&pc).copied().unwrap_or(self.widest).max(8);
        let end = sp.saturating_add(need);
        let page_end = ((end - 1) | (PAGE - 1)).saturating_add(1);
        let with_slack = end.saturating_add(SLACK).min(page_end);
        (with_slack - sp).min(self.most) as usize
    }

    /// The largest read the stub takes in one packet.
    pub(super) fn most(&self) -> u64 {
        self.most
    }

    /// A walk from `pc` read `reach` bytes above the stack pointer.
    pub(super) fn learn(&mut self, pc: u64, reach: u64) {
        if self.by_pc.len() >= MAX_PCS {
            self.by_pc.clear();
        }
        let known = self.by_pc.entry(pc).or_insert(0);
        *known = (*known).max(reach);
        self.widest = self.widest.max(reach);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_pc_needed_with_slack_within_its_page() {
        let mut reach = Reach::new(2048);
        let sp = 0x10_0100;
        assert_eq!(reach.of(0x1000, sp), 512 + 64, "first guess, with slack");
        reach.learn(0x1000, 200);
        assert_eq!(reach.of(0x1000, sp), 264);
        // The slack stops at the end of the page of the last byte needed.
        assert_eq!(reach.of(0x1000, 0x10_0f00), 256);
        // Another pc gets the widest reach seen.
        reach.learn(0x2000, 1000);
        assert_eq!(reach.of(0x3000, sp), 1064);
        // Never more than the stub takes.
        reach.learn(0x4000, 10_000);
        assert_eq!(reach.of(0x4000, sp), 2048);
    }
}
