//! Why an ETW recording could not start, in one line each: the Windows error codes a user
//! meets (no administrator rights, ETW stubbed out, a session of ours left running) said in
//! words, the others with the call that failed.

use std::fmt;

/// The name of the trace session stackscope starts.
pub const SESSION_NAME: &str = "stackscope";

const ERROR_ACCESS_DENIED: u32 = 5;
const ERROR_NOT_SUPPORTED: u32 = 50;
const ERROR_CALL_NOT_IMPLEMENTED: u32 = 120;
const ERROR_ALREADY_EXISTS: u32 = 183;
const ERROR_PRIVILEGE_NOT_HELD: u32 = 1314;
const ERROR_NOT_ALL_ASSIGNED: u32 = 1300;

#[derive(Debug)]
pub enum Error {
    /// The process lacks administrator rights (or the profiling privilege they carry).
    NotElevated,
    /// This system does not implement the kernel trace (Wine stubs it).
    Unavailable { call: &'static str, code: u32 },
    /// A session of our name already runs.
    SessionExists,
    /// Another failure of an ETW or process call.
    Call { call: &'static str, code: u32 },
    /// The command could not be started.
    Launch {
        command: String,
        error: std::io::Error,
    },
    /// A process given with -p does not exist (or cannot be waited for).
    NoProcess(u32),
    /// The session started but delivered nothing within this many seconds.
    Silent(u64),
}

impl Error {
    /// The error of a failed `call` that returned (or left in GetLastError) `code`.
    pub fn from_code(call: &'static str, code: u32) -> Error {
        match code {
            ERROR_ACCESS_DENIED | ERROR_PRIVILEGE_NOT_HELD | ERROR_NOT_ALL_ASSIGNED => {
                Error::NotElevated
            }
            ERROR_CALL_NOT_IMPLEMENTED | ERROR_NOT_SUPPORTED => Error::Unavailable { call, code },
            ERROR_ALREADY_EXISTS => Error::SessionExists,
            code => Error::Call { call, code },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotElevated => write!(
                f,
                "sampling with ETW needs administrator rights: run stackscope from an elevated prompt (Run as administrator)"
            ),
            Error::Unavailable { call, code } => write!(
                f,
                "ETW kernel tracing is not available on this system: {call} is not implemented (error {code}), as under Wine"
            ),
            Error::SessionExists => write!(
                f,
                "an ETW session named \"{SESSION_NAME}\" is already running (another stackscope, or one that was killed): stop it with `logman stop {SESSION_NAME} -ets`"
            ),
            Error::Call { call, code } => write!(f, "{call} failed with Windows error {code}"),
            Error::Launch { command, error } => write!(f, "cannot start {command}: {error}"),
            Error::NoProcess(pid) => write!(f, "no process with pid {pid} to attach to"),
            Error::Silent(secs) => write!(
                f,
                "the ETW session delivered no event within {secs} s of starting"
            ),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_users_meet_are_said_in_words() {
        let said = |call, code| Error::from_code(call, code).to_string();
        assert!(said("StartTraceW", 5).contains("administrator rights"));
        assert!(said("AdjustTokenPrivileges", 1300).contains("administrator rights"));
        let wine = said("TraceSetInformation", 120);
        assert!(
            wine.starts_with("ETW kernel tracing is not available"),
            "{wine}"
        );
        assert!(wine.contains("TraceSetInformation"));
        assert!(said("StartTraceW", 183).contains("logman stop stackscope -ets"));
        assert_eq!(
            said("OpenTraceW", 1168),
            "OpenTraceW failed with Windows error 1168"
        );
        for code in [5, 50, 120, 183, 1168, 1300] {
            assert!(!said("X", code).contains('\n'), "one line for {code}");
        }
    }
}
