//! The `stackscope` commands, as a library so that the `stackscope` binary and the drop-in
//! shims (`stackscope-perf`, `stackscope-dtrace`) share one implementation of each.
//!
//! The modules are layered, each using only those below it: `cli` (every flag and default);
//! `hint` (the sources' hints in the flags' words); `debuginfod` (where debug info may be
//! fetched from); `sink`, `output` (where and in which
//! format), `input`, `status` (signals, exit status), `summary` (the end of every recording)
//! and `source_bpf`, `source_etw`; `platform` (what is Linux-only, refused elsewhere); `doctor`, to which the recording commands point errors about the
//! machine; `backend` (which source `record` samples with, and why); the other commands
//! (`record`, `profile`, `gdb`, `report`, `diff`), and `top`, the live view over `record`'s
//! start-up and sampling; then the shims
//! over `record`, and `cargo stackscope` (`cargo`), which builds a target and records it.

#[cfg(target_os = "linux")]
mod backend;
pub mod cargo;
pub mod cli;
mod debuginfod;
mod diff;
#[cfg(target_os = "linux")]
mod doctor;
mod gdb;
mod hint;
mod input;
mod output;
#[cfg(any(test, not(target_os = "linux")))]
mod platform;
#[cfg(target_os = "linux")]
mod profile;
mod record;
mod report;
pub mod shim;
#[cfg_attr(windows, path = "sink/windows.rs")]
mod sink;
#[cfg(target_os = "linux")]
mod source_bpf;
#[cfg(windows)]
mod source_etw;
mod status;
mod summary;
#[cfg(target_os = "linux")]
mod top;

pub use status::exit;

/// Runs the `stackscope` command line and exits with its status.
pub fn main() -> ! {
    let cli: cli::Cli = cli::parse(std::env::args_os().collect());
    let result = match cli.command {
        cli::Command::Record(args) => record::run(args),
        cli::Command::Report(args) => report::run(args),
        #[cfg(target_os = "linux")]
        cli::Command::Profile(args) => profile::run(args),
        #[cfg(not(target_os = "linux"))]
        cli::Command::Profile(_) => platform::refuse("stackscope profile (bcc's profile, on eBPF)"),
        #[cfg(target_os = "linux")]
        cli::Command::Top(args) => top::run(args),
        #[cfg(not(target_os = "linux"))]
        cli::Command::Top(_) => platform::refuse("stackscope top (perf_event sampling, live)"),
        cli::Command::Gdb(args) => gdb::run(args),
        cli::Command::Diff(args) => diff::run(args),
        #[cfg(target_os = "linux")]
        cli::Command::Doctor(args) => doctor::run(args),
        #[cfg(not(target_os = "linux"))]
        cli::Command::Doctor(_) => {
            platform::refuse("stackscope doctor (it checks what perf_event and eBPF need)")
        }
    };
    exit(result)
}
