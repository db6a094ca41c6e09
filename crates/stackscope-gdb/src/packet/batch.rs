//! Waking once per batch: a stub writes each reply of a batch on its own, and a reader woken
//! for every one of them takes turns with the stub for the CPU (each reply costs two context
//! switches when both share one, tens of microseconds on a virtual machine). Knowing how many
//! bytes a batch's replies will likely take, the connection asks the socket not to wake it
//! before they are there ([`super::Stream::set_min_read`]), for a short while at most.

use std::time::{Duration, Instant};

/// Longest wait for the bytes a batch likely takes before reads return what there is: what
/// a wrong guess costs at most.
const PATIENCE: Duration = Duration::from_millis(2);
/// Batches sent without a guess after the first wrong one; doubled for each wrong one after,
/// up to 64 times as many.
const BACKOFF: u32 = 16;
/// A stop reply is at least `$S05#b8`.
const LEAST_STOP_REPLY: usize = 7;
/// `$OK#9a`.
const OK_REPLY: usize = 6;

/// What the connection guesses about the replies of the batch being read.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Until when reads wait for the bytes guessed that have not arrived yet.
    until: Option<Instant>,
    /// What the guess said, and what arrived, for the batch being read.
    guessed: usize,
    arrived: usize,
    /// The size on the wire of the last `g` reply: every thread's is the same.
    registers: Option<usize>,
    /// Batches still to send without a guess, and how many guesses were wrong.
    skip: u32,
    wrong: u32,
}

impl Batch {
    /// A batch of `packets` (behind an interrupt when `interrupt`; each packet acked by a `+`
    /// before its reply when `acks`) goes out now.
    pub(super) fn start(&mut self, packets: &[Vec<u8>], interrupt: bool, acks: bool) {
        self.arrived = 0;
        self.guessed = 0;
        self.until = None;
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        // Replies of other kinds are not guessed: waking early is all a guess too small costs.
        let replies: usize = packets.iter().filter_map(|p| self.reply_size(p)).sum();
        let acked = if acks { packets.len() } else { 0 };
        let guess = replies + acked + if interrupt { LEAST_STOP_REPLY } else { 0 };
        self.guessed = guess;
        self.until = Some(Instant::now() + PATIENCE);
    }

    /// The framed reply `packet` most likely gets, where a lower bound is known.
    fn reply_size(&self, packet: &[u8]) -> Option<usize> {
        match packet {
            [b'H', b'g', ..] => Some(OK_REPLY),
            b"g" => self.registers,
            [kind @ (b'm' | b'x'), rest @ ..] => {
                let len = std::str::from_utf8(rest).ok()?.split_once(',')?.1;
                let len = usize::from_str_radix(len, 16).ok()?;
                // Hex doubles every byte; binary escapes only add.
                Some(if *kind == b'm' { 2 * len } else { 1 + len } + 4)
            }
            _ => None,
        }
    }

    /// How many bytes the next read should wait for, and until when: 1 and no bound of its
    /// own once the guess is met or its patience has run out.
    pub(super) fn want(&mut self, now: Instant, most: usize) -> (usize, Option<Instant>) {
        match self.until {
            Some(until) if self.pending() > 0 && now < until => {
                (self.pending().min(most), Some(until))
            }
            _ => {
                self.until = None;
                (1, None)
            }
        }
    }

    /// Bytes guessed that have not arrived yet.
    fn pending(&self) -> usize {
        self.guessed.saturating_sub(self.arrived)
    }

    /// Reads stop waiting for the guess: its patience ran out.
    pub(super) fn give_up(&mut self) {
        self.until = None;
    }

    /// `n` bytes arrived.
    pub(super) fn arrived(&mut self, n: usize) {
        self.arrived += n;
    }

    /// A reply of `wire` bytes came for `packet`.
    pub(super) fn replied(&mut self, packet: &[u8], wire: usize) {
        if packet == b"g" {
            self.registers = Some(wire);
        }
    }

    /// The batch's replies are read: a guess larger than what came makes the next batches go
    /// without one (replies shorter than asked, errors, or run-length encoding).
    pub(super) fn end(&mut self) {
        if self.guessed > self.arrived {
            self.skip = BACKOFF << self.wrong.min(6);
            self.wrong += 1;
        }
        self.guessed = 0;
        self.until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_ok_registers_and_memory_replies() {
        let mut batch = Batch::default();
        let g = b"g".to_vec();
        batch.start(&[b"Hg1".to_vec(), g.clone()], true, false);
        // No `g` reply seen yet: the stop reply and the OK only.
        assert_eq!(batch.guessed, LEAST_STOP_REPLY + OK_REPLY);
        batch.replied(&g, 1124);
        batch.arrived(2000);
        batch.end();
        let packets = [g.clone(), b"m1000,80".to_vec(), b"x2000,10".to_vec()];
        batch.start(&packets, false, true);
        // A `+` before each reply.
        assert_eq!(batch.guessed, 1124 + (0x100 + 4) + (0x11 + 4) + 3);
        batch.arrived(batch.guessed);
        batch.end();
        batch.start(&packets, false, false);
        assert_eq!(batch.guessed, 1124 + (0x100 + 4) + (0x11 + 4));
        let now = Instant::now();
        assert_eq!(batch.want(now, 4096).0, batch.guessed);
        assert_eq!(batch.want(now, 100).0, 100);
        batch.arrived(1124);
        assert_eq!(batch.want(now, 4096).0, 0x104 + 0x15);
        batch.arrived(0x104 + 0x15);
        assert_eq!(batch.want(now, 4096), (1, None));
        batch.end();
        assert_eq!(batch.skip, 0);
    }

    #[test]
    fn a_wrong_guess_backs_off_and_patience_runs_out() {
        let mut batch = Batch::default();
        batch.start(&[b"m0,100".to_vec()], false, false);
        let late = Instant::now() + PATIENCE * 2;
        assert_eq!(batch.want(late, 4096), (1, None));
        batch.arrived(7);
        batch.end();
        assert_eq!(batch.skip, BACKOFF);
        for _ in 0..BACKOFF {
            batch.start(&[b"m0,100".to_vec()], false, false);
            assert_eq!(batch.want(Instant::now(), 4096), (1, None));
            batch.end();
        }
        batch.start(&[b"m0,100".to_vec()], false, false);
        batch.end();
        assert_eq!(batch.skip, 2 * BACKOFF);
    }
}
