//! How stackscope ends: Ctrl-C stops a recording, and a command's result becomes the exit
//! status.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;

/// Ctrl-C (and SIGTERM) set the returned flag, which stops the recording; one that arrives
/// after sampling ended stops naming instead, and the profile is written with the names it
/// has ([`stackscope_symbols::interrupt`]); a second one ends stackscope at once.
pub(crate) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
        // SAFETY: the action is one atomic add, which is safe in a signal handler.
        unsafe {
            signal_hook::low_level::register(signal, stackscope_symbols::interrupt::signal_arrived)
        }?;
    }
    Ok(stop)
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
