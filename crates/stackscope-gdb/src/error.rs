//! What can go wrong talking to a stub. Every protocol error names the packet that was sent and
//! what came back, so a user can tell a misbehaving stub from a dead connection.

use std::io;

/// An error of the GDB remote client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Could not reach the stub at all.
    #[error("cannot connect to the GDB stub at {remote}: {error}{hint}")]
    Connect {
        remote: String,
        error: io::Error,
        hint: &'static str,
    },
    /// Reading or writing the connection failed.
    #[error("connection to {peer} failed after sending {sent}: {error}")]
    Io {
        peer: String,
        sent: String,
        error: io::Error,
    },
    /// The stub closed or reset the connection.
    #[error("{peer} closed the connection (it exited or was killed?) after {sent} (received so far: {got})")]
    Closed {
        peer: String,
        sent: String,
        got: String,
    },
    /// No (complete) reply in time.
    #[error("no reply from {peer} to {sent} within {secs} s (received so far: {got})")]
    Timeout {
        peer: String,
        sent: String,
        got: String,
        secs: f64,
    },
    /// The recording's time ran out while a reply was still coming.
    #[error("the recording's duration ended while waiting for {peer} to answer {sent} (received so far: {got})")]
    Cut {
        peer: String,
        sent: String,
        got: String,
    },
    /// A packet longer than the stub's stated packet size (or the ceiling put on it).
    #[error(
        "{peer} sent a packet longer than {max} bytes in reply to {sent} (received so far: {got})"
    )]
    TooLong {
        peer: String,
        sent: String,
        max: usize,
        got: String,
    },
    /// The stub went past another bound put on what it may send: threads, console output,
    /// retransmissions, the size of an object.
    #[error("{peer} {what} (last packet sent: {sent})")]
    Excess {
        peer: String,
        sent: String,
        what: String,
    },
    /// Ctrl-C while a reply of many packets was coming.
    #[error("stopped while reading the {what} from {peer}")]
    Stopped { peer: String, what: String },
    /// A reply that is not what the packet calls for.
    #[error("unexpected reply from {peer} to {sent}: {got} ({why})")]
    Malformed {
        peer: String,
        sent: String,
        got: String,
        why: &'static str,
    },
    /// The stub answered `E NN`.
    #[error("{peer} refused {sent}: error {code}")]
    Stub {
        peer: String,
        sent: String,
        code: String,
    },
    /// `--cpu-mask` selects none of the target's vCPUs.
    #[error("the target has {vcpus} vCPU(s), none of which the CPU mask {mask:#x} selects")]
    NoVcpu { vcpus: usize, mask: u128 },
    /// The ELF file is built for another architecture than the stub runs.
    #[error("{file} is built for {arch}, but {peer} runs {described} (its target description says so): give the ELF file of what runs there")]
    Architecture {
        file: String,
        arch: &'static str,
        peer: String,
        described: String,
    },
    /// The stub never stopped the target after an interrupt.
    #[error("{peer} did not stop the target within {secs} s of an interrupt (\\x03): it ignores interrupts, as QEMU's user-mode stub (qemu-x86_64 -g) does; sample a program under gdbserver, or a guest under QEMU system emulation")]
    NoStop { peer: String, secs: f64 },
    /// The target exited or was killed (`W`/`X` stop reply).
    #[error("the target {0}")]
    Exited(String),
    /// Rounds as often as asked would stop the target more than the share of the time it may
    /// be stopped: what the first rounds' pause allows instead.
    #[error("a round every {:.3} ms would stop the target {:.1}% of the time, more than the {:.1}% allowed: a round pauses it {:.3} ms here (median of the first {rounds}), so at most one every {:.3} ms", ms(*interval), pause.as_secs_f64() / interval.as_secs_f64() * 100.0, share * 100.0, ms(*pause), ms(*least_interval))]
    TooFrequent {
        interval: std::time::Duration,
        least_interval: std::time::Duration,
        pause: std::time::Duration,
        share: f64,
        rounds: usize,
    },
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Error {
    /// True when the target is gone (exited, killed, or the stub hung up): what was collected
    /// so far is all there will be.
    pub fn is_end_of_target(&self) -> bool {
        matches!(self, Error::Exited(_) | Error::Closed { .. })
    }
}

/// How many bytes of a packet an error message shows.
pub(crate) const SHOWN_MAX: usize = 80;

/// Bytes as they would appear on the wire, shortened: for error messages.
pub(crate) fn shown(bytes: &[u8]) -> String {
    shown_part(bytes, bytes.len())
}

/// The first of `total` bytes as they would appear on the wire, shortened.
pub(crate) fn shown_part(bytes: &[u8], total: usize) -> String {
    let mut s = String::from("`");
    for &b in bytes.iter().take(SHOWN_MAX) {
        s.extend(std::ascii::escape_default(b).map(char::from));
    }
    if total > SHOWN_MAX {
        s.push_str(&format!("...` ({total} bytes)"));
    } else {
        s.push('`');
    }
    s
}
