//! Events put back in the order they were logged. A real-time session delivers each CPU's
//! buffers as they fill or flush, so an event logged on one CPU can arrive before an earlier
//! one logged on another: a sample's user stack, logged where its thread returned to user
//! mode, before the sample itself. Events wait here until none older can still come (the
//! newest seen is a window later), then leave in timestamp order.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::event::Header;

/// Events waiting for their turn, oldest first out.
#[derive(Default)]
pub struct Reorder {
    /// How far behind the newest event one may be logged and still arrive, in the events'
    /// timestamp units; 0 passes events on as they come.
    window: u64,
    waiting: BinaryHeap<Reverse<Waiting>>,
    arrivals: u64,
    newest: u64,
}

struct Waiting {
    header: Header,
    payload: Vec<u8>,
    /// Arrival order, which keeps events of the same timestamp in the order they came.
    arrival: u64,
}

impl Waiting {
    fn key(&self) -> (u64, u64) {
        (self.header.timestamp, self.arrival)
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl Reorder {
    pub fn new(window: u64) -> Self {
        Reorder {
            window,
            ..Reorder::default()
        }
    }

    /// Takes an event, and hands `out` every event whose turn has come.
    pub fn push(&mut self, header: Header, payload: Vec<u8>, out: &mut impl FnMut(&Header, &[u8])) {
        self.newest = self.newest.max(header.timestamp);
        self.waiting.push(Reverse(Waiting {
            header,
            payload,
            arrival: self.arrivals,
        }));
        self.arrivals += 1;
        let due = self.newest.saturating_sub(self.window);
        while let Some(Reverse(oldest)) = self.waiting.peek() {
            if oldest.header.timestamp > due {
                break;
            }
            let Some(Reverse(event)) = self.waiting.pop() else {
                break;
            };
            out(&event.header, &event.payload);
        }
    }

    /// Hands `out` every waiting event, in order: no more will come.
    pub fn flush(&mut self, out: &mut impl FnMut(&Header, &[u8])) {
        while let Some(Reverse(event)) = self.waiting.pop() {
            out(&event.header, &event.payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload;

    #[test]
    fn events_leave_in_logged_order_once_the_window_has_passed() {
        let mut order = Reorder::new(100);
        let mut seen = Vec::new();
        let mut out = |h: &Header, _: &[u8]| seen.push(h.timestamp);
        for ts in [1000, 1050, 1020, 1100, 1130, 1300] {
            let (header, bytes) = payload::sampled_profile(ts, 1, 1);
            order.push(header, bytes, &mut out);
        }
        // 1300 arrived: everything up to 1200 is due.
        assert_eq!(seen, [1000, 1020, 1050, 1100, 1130]);
        let mut rest = Vec::new();
        order.flush(&mut |h: &Header, _: &[u8]| rest.push(h.timestamp));
        assert_eq!(rest, [1300]);
    }

    #[test]
    fn without_a_window_events_pass_as_they_come() {
        let mut order = Reorder::new(0);
        let mut seen = Vec::new();
        for ts in [5, 5, 3] {
            let (header, bytes) = payload::sampled_profile(ts, 1, 1);
            order.push(header, bytes, &mut |h: &Header, _: &[u8]| {
                seen.push(h.timestamp)
            });
        }
        assert_eq!(seen, [5, 5, 3]);
    }
}
