//! What a source samples, in the same words on every system: each source decides how it
//! launches, attaches and follows.

use std::ffi::OsString;

/// What to sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Launch this command (argv[0] looked up in PATH), held before it runs until sampling has
    /// begun, then followed into every thread (and, where the source can, every child).
    Command(Vec<OsString>),
    /// Attach to running processes: all their current threads, and new threads/children.
    Pids(Vec<u32>),
    /// Only these threads.
    Tids(Vec<u32>),
    /// Every process on the machine.
    System,
}
