//! Stopping while frames are named. The program's signal handler decides what a stop signal
//! means at each stage; this module holds what naming needs of that: whether sampling has
//! ended ([`sampling_ended`], said by the naming step when it begins its last round), and
//! whether naming was told to stop ([`stop_naming`]), which every long step of naming (a
//! module's symbols, a debug link's CRC, a decompression, a debuginfod download) asks through
//! [`interrupted`]. A
//! naming step that stops leaves what it has not named as module and address, and the profile
//! is written at once.

use std::sync::atomic::{AtomicBool, Ordering};

static SAMPLING_ENDED: AtomicBool = AtomicBool::new(false);
static NAMING_STOPPED: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// This thread names samples of a source that hands over to another, whose sampling goes on.
    static HANDS_OVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sampling has ended: what is named from now on is the profile's last naming. Said on a
/// thread that [`hands_over`], it is not: another source samples on.
pub fn sampling_ended() {
    if !HANDS_OVER.with(|hands_over| hands_over.get()) {
        SAMPLING_ENDED.store(true, Ordering::SeqCst);
    }
}

/// The source sampling on this thread hands over to another (the eBPF backend's first
/// samples, taken by the perf source): the end of its sampling is not the end of sampling.
pub fn hands_over() {
    HANDS_OVER.with(|hands_over| hands_over.set(true));
}

/// Whether sampling has ended. Only an atomic load: safe in a signal handler.
pub fn sampling_has_ended() -> bool {
    SAMPLING_ENDED.load(Ordering::SeqCst)
}

/// Tells naming to stop and keep what it has. Only an atomic store: safe in a signal handler.
pub fn stop_naming() {
    NAMING_STOPPED.store(true, Ordering::SeqCst);
}

/// True once naming was told to stop.
pub fn interrupted() -> bool {
    NAMING_STOPPED.load(Ordering::SeqCst)
}
