//! How stackscope ends: the one policy for stop signals (Ctrl-C's SIGINT, SIGTERM, SIGHUP), and
//! a command's result as the exit status.
//!
//! A stop signal and the copies of it that arrive within [`COPIES`] after it (a terminal's
//! Ctrl-C reaches the whole process group, GNU `timeout` signals the command and its group)
//! are one stop. While sampling, the first stop ends sampling and the profile is named and
//! written in full; a second one, deliberate, stops naming too, so the profile is written at
//! once with its frames named by module and address. Once sampling has ended, the first stop
//! stops naming in the same way, and a stop after that ends stackscope at once, saying that
//! the profile was not written. While a regular file is written through its temporary, the
//! writer's own handler ([`crate::sink`]) removes the temporary and ends stackscope at the
//! first stop that is not a copy. Sampling is never cut short: a launched program is ended
//! by the source, never left running behind stackscope.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;
use stackscope_symbols::interrupt;

/// How long after a stop signal the same signal counts as a copy of it.
pub(crate) const COPIES: u64 = 1_000_000_000;

/// The signals a user (or a supervisor) sends to stop a command.
#[cfg(unix)]
pub(crate) const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
#[cfg(not(unix))]
pub(crate) const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// CLOCK_MONOTONIC in nanoseconds at the last stop that was not a copy; 0 for none yet.
static LAST_STOP: AtomicU64 = AtomicU64::new(0);

/// Whether a stop signal arriving now is a copy of the last one; if not, it becomes the last.
/// Only clock_gettime and atomics: safe in a signal handler.
pub(crate) fn is_copy_of_last_stop() -> bool {
    let now = monotonic_ns().max(1);
    let last = LAST_STOP.load(Ordering::SeqCst);
    if last != 0 && now.saturating_sub(last) < COPIES {
        return true;
    }
    LAST_STOP.store(now, Ordering::SeqCst);
    false
}

#[cfg(unix)]
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Windows runs console handlers on a thread of their own, where std's clock may be used.
#[cfg(not(unix))]
fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}

/// Writes `message` to standard error with one write(2): safe in a signal handler.
#[cfg(unix)]
pub(crate) fn say_from_handler(message: &[u8]) {
    // SAFETY: write is async-signal-safe; the buffer outlives the call.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

#[cfg(not(unix))]
pub(crate) fn say_from_handler(message: &[u8]) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(message);
}

/// Ends stackscope at once with 130, as a shell reports an interrupted command.
#[cfg(unix)]
fn exit_at_once() -> ! {
    // SAFETY: _exit is async-signal-safe; nothing is left half-done that a normal exit would
    // finish (the writer removes its own temporary).
    unsafe { libc::_exit(130) }
}

#[cfg(not(unix))]
fn exit_at_once() -> ! {
    std::process::exit(130)
}

/// Installs the stop policy; the returned flag, set at the first stop, stops the recording.
pub(crate) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in STOP_SIGNALS {
        let stop = Arc::clone(&stop);
        // SAFETY: the action only uses atomics, clock_gettime, write and _exit, all safe in a
        // signal handler.
        unsafe { signal_hook::low_level::register(signal, move || on_stop(&stop)) }?;
    }
    Ok(stop)
}

fn on_stop(stop: &AtomicBool) {
    if is_copy_of_last_stop() {
        return;
    }
    if !interrupt::sampling_has_ended() {
        if stop.swap(true, Ordering::SeqCst) {
            interrupt::stop_naming();
        }
        return;
    }
    if !interrupt::interrupted() {
        stop.store(true, Ordering::SeqCst);
        // Fetching debug info is a step of naming: it stops here too.
        interrupt::stop_naming();
        return;
    }
    say_from_handler(
        b"\nstackscope: stopped at once by another stop signal; the profile was not written\n",
    );
    exit_at_once();
}

/// Exits with the command's status, or prints its error in one line and exits with 1.
pub fn exit(result: Result<i32>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stackscope: error: {e:#}");
            std::process::exit(1);
        }
    }
}
