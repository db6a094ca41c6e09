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
    #[error("connection to the GDB stub failed after sending {sent}: {error}")]
    Io { sent: String, error: io::Error },
    /// The stub closed or reset the connection.
    #[error("the GDB stub closed the connection (it exited or was killed?) after {sent} (received so far: {got})")]
    Closed { sent: String, got: String },
    /// No (complete) reply in time.
    #[error("no reply from the GDB stub to {sent} within {secs} s (received so far: {got})")]
    Timeout {
        sent: String,
        got: String,
        secs: f64,
    },
    /// A reply that is not what the packet calls for.
    #[error("unexpected reply from the GDB stub to {sent}: {got} ({why})")]
    Malformed {
        sent: String,
        got: String,
        why: &'static str,
    },
    /// The stub answered `E NN`.
    #[error("the GDB stub refused {sent}: error {code}")]
    Stub { sent: String, code: String },
    /// `--cpu-mask` selects none of the target's vCPUs.
    #[error("the target has {vcpus} vCPU(s), none of which the CPU mask {mask:#x} selects")]
    NoVcpu { vcpus: usize, mask: u128 },
    /// The target exited or was killed (`W`/`X` stop reply).
    #[error("the target {0}")]
    Exited(String),
}

impl Error {
    /// True when the target is gone (exited, killed, or the stub hung up): what was collected
    /// so far is all there will be.
    pub fn is_end_of_target(&self) -> bool {
        matches!(self, Error::Exited(_) | Error::Closed { .. })
    }
}

/// Bytes as they would appear on the wire, shortened: for error messages.
pub(crate) fn shown(bytes: &[u8]) -> String {
    const MAX: usize = 80;
    let mut s = String::from("`");
    for &b in bytes.iter().take(MAX) {
        s.extend(std::ascii::escape_default(b).map(char::from));
    }
    if bytes.len() > MAX {
        s.push_str(&format!("...` ({} bytes)", bytes.len()));
    } else {
        s.push('`');
    }
    s
}
