//! What can go wrong when setting up sampling, said in one line with its cause and its fix.

use std::io;

/// Why sampling could not be set up. Each message names the cause and, when there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("command not found: {0} (check the name and PATH)")]
    CommandNotFound(String),
    #[error("permission denied executing {0}: make it executable (chmod +x) or check that its filesystem is not mounted noexec")]
    NotExecutable(String),
    /// The command's exec would change privileges. The message says what to do in this
    /// crate's terms; a command line words it with its own flags.
    #[error("cannot profile {command}: it {why}, so its exec changes privileges and the kernel stops sampling it there (no samples); profile a copy without that (`cp {command} ./copy` drops setuid, setgid and capabilities), sample it as the user it runs as, or as root sample it with the eBPF source (its events belong to the CPUs, not to the process)")]
    PrivilegedExec { command: String, why: String },
    #[error("cannot execute {command}: {source}")]
    Exec { command: String, source: io::Error },
    #[error("no command given to run")]
    EmptyCommand,
    #[error("cannot launch {command}: {source}")]
    Launch { command: String, source: io::Error },
    #[error("no process with pid {0} (it may have exited; check with `ps -p {0}`)")]
    NoSuchProcess(u32),
    #[error("no thread with tid {0} (it may have exited; list threads with `ps -eL`)")]
    NoSuchThread(u32),
    #[error("{}", permission_message(.what, *.system, *.paranoid, *.euid))]
    PermissionDenied {
        /// What we tried to sample, e.g. "pid 1234".
        what: String,
        system: bool,
        /// Value of kernel.perf_event_paranoid, when readable.
        paranoid: Option<i32>,
        euid: u32,
    },
    #[error("cannot open the cpu-clock perf event for {what}: {source}{}", errno_hint(.source))]
    Perf { what: String, source: io::Error },
    #[error("CPU {cpu} is not online (online CPUs: {online})")]
    InvalidCpu { cpu: u32, online: String },
    #[error("sampling frequency {requested} Hz is above kernel.perf_event_max_sample_rate ({max}): lower the frequency, or raise the limit with `sysctl kernel.perf_event_max_sample_rate={requested}`")]
    FrequencyTooHigh { requested: u64, max: u64 },
    #[error("invalid sampling settings: {0}")]
    InvalidConfig(String),
    #[error("cannot map a {kib} KiB perf ring buffer: {source}; use a smaller buffer, or raise kernel.perf_event_mlock_kb or the locked-memory limit (ulimit -l)")]
    Mmap { kib: usize, source: io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

fn permission_message(what: &str, system: bool, paranoid: Option<i32>, euid: u32) -> String {
    let level = paranoid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
    let capability = "grant CAP_PERFMON (setcap cap_perfmon+ep on the stackscope binary)";
    if system {
        return format!(
            "system-wide sampling (-a) is not allowed: it needs kernel.perf_event_paranoid <= 0 \
             (it is {level}) or CAP_PERFMON; run as root, {capability}, or run \
             `sysctl kernel.perf_event_paranoid=0`"
        );
    }
    if euid == 0 {
        return format!(
            "perf_event_open was refused for {what} even as root (kernel.perf_event_paranoid is \
             {level}): a security policy (kernel lockdown, SELinux, or a container's seccomp \
             profile) blocks perf events; allow perf_event_open there"
        );
    }
    if paranoid.is_some_and(|p| p >= 3) {
        return format!(
            "perf events are disabled for unprivileged users (kernel.perf_event_paranoid is \
             {level}): run as root, {capability}, or run `sysctl kernel.perf_event_paranoid=2`"
        );
    }
    // Only the ptrace-style ownership check is left at levels below 3: no sysctl lifts it.
    format!(
        "not allowed to sample {what}: unprivileged users may only sample their own processes \
         (kernel.perf_event_paranoid is {level}); run as root or {capability}"
    )
}

fn errno_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => {
            " (this kernel does not support the cpu-clock software event with these settings)"
        }
        Some(libc::ENOSYS) => " (the kernel was built without perf events, CONFIG_PERF_EVENTS)",
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            " (too many open files: one event is needed per thread and CPU; raise the limit with `ulimit -n`)"
        }
        Some(libc::EINVAL) => {
            " (invalid event settings: check the frequency or period against kernel.perf_event_max_sample_rate)"
        }
        Some(libc::E2BIG) => " (the kernel is too old for the requested perf_event options)",
        Some(libc::ENODEV) => " (that CPU is not available)",
        Some(libc::EBUSY) => " (the event is in exclusive use by another tool)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_messages_are_one_line_and_name_the_fix() {
        let system = permission_message("all processes", true, Some(2), 1000);
        assert!(system.contains("kernel.perf_event_paranoid <= 0 (it is 2)"));
        assert!(system.contains("CAP_PERFMON"));
        let locked = permission_message("pid 7", false, Some(3), 1000);
        assert!(
            locked.contains("sysctl kernel.perf_event_paranoid=2"),
            "{locked}"
        );
        let other_user = permission_message("pid 1", false, Some(2), 1000);
        assert!(other_user.starts_with("not allowed to sample pid 1"));
        assert!(
            !other_user.contains("sysctl"),
            "no sysctl lifts the ownership check"
        );
        let root = permission_message("pid 1", false, Some(2), 0);
        assert!(root.contains("even as root"));
        for m in [system, locked, other_user, root] {
            assert!(!m.contains('\n'));
        }
    }
}
