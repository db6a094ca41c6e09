//! Ctrl-C (or SIGTERM) while frames are named. The first signal of a run stops sampling and
//! the profile is named in full; a signal that arrives once sampling has ended stops naming
//! instead, so that the profile is written at once with the names it has (the program's
//! second signal, if the first stopped sampling, ends it at once: that is the program's
//! choice, not this module's).
//!
//! The program counts signals ([`signal_arrived`], from its handler); the naming step says
//! when sampling ended ([`sampling_ended`]); every long step of naming (a module's symbols, a
//! debug link's CRC, a decompression) asks [`interrupted`].

use std::sync::atomic::{AtomicUsize, Ordering};

/// Signals that asked stackscope to stop, so far.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// [`SIGNALS`] when sampling ended; `usize::MAX` while it goes on.
static ENDED_AT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Counts a signal asking stackscope to stop. Only an atomic add: safe in a signal handler.
pub fn signal_arrived() {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Sampling has ended: the signals that arrive from now on interrupt naming. Only the first
/// call counts.
pub fn sampling_ended() {
    let now = SIGNALS.load(Ordering::SeqCst);
    let _ = ENDED_AT.compare_exchange(usize::MAX, now, Ordering::SeqCst, Ordering::SeqCst);
}

/// True once a signal arrived after sampling ended: naming gives up, keeping what it has.
pub fn interrupted() -> bool {
    let ended_at = ENDED_AT.load(Ordering::SeqCst);
    ended_at != usize::MAX && SIGNALS.load(Ordering::SeqCst) > ended_at
}
