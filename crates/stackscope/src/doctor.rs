//! `stackscope doctor`: what recording needs on this machine, checked in one run, each check
//! with its verdict and its fix; given a program, what it offers for unwinding and whether
//! this user can profile it at all.

use std::fmt;
use std::io;
use std::path::Path;

use anyhow::Result;
use stackscope_bpf::BpfError;
use stackscope_perf_event::sampler::probe_cpu_clock;
use stackscope_process::kernel::read_sysctl;
use stackscope_process::target::{own_capabilities, privileged_exec, resolve_command};
use stackscope_process::SampleError;
use stackscope_symbols::{unwind_sources, FramePointers, UnwindSources};

use crate::cli::DoctorArgs;
use crate::hint::{BUILD_WITH_DEBUG_INFO, INSTALL_DEBUG_INFO};

/// Said after errors about permissions or the machine.
pub(crate) const HINT: &str = "run `stackscope doctor` to check what this machine allows";

/// Words a source's error with the flags that fix it, and adds [`HINT`] to one that comes from
/// what the machine or the user is allowed.
pub(crate) fn point_to(e: anyhow::Error) -> anyhow::Error {
    let about_machine = e.chain().any(|cause| {
        cause.downcast_ref::<SampleError>().is_some_and(machine_limit)
            || matches!(
                cause.downcast_ref::<BpfError>(),
                Some(BpfError::NotPermitted { .. } | BpfError::NoBtf | BpfError::Verifier { .. })
            )
            || matches!(cause.downcast_ref::<BpfError>(), Some(BpfError::Sample(e)) if machine_limit(e))
    });
    match (in_flags(&e), about_machine) {
        (Some(text), true) => anyhow::anyhow!("{text}; {HINT}"),
        (Some(text), false) => anyhow::anyhow!(text),
        (None, true) => anyhow::anyhow!("{e:#}; {HINT}"),
        (None, false) => e,
    }
}

/// The errors whose fix is one of our flags, in the command line's words; `None` for the
/// others, said as the sources say them.
fn in_flags(e: &anyhow::Error) -> Option<String> {
    if let Some(BpfError::NoBtf) = e.downcast_ref() {
        return Some(
            "this kernel has no BTF type information (/sys/kernel/btf/vmlinux is missing), which \
             the BPF program needs: use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or the \
             perf_event backend (`stackscope record` without --backend bpf)"
                .to_string(),
        );
    }
    let sample = match e.downcast_ref() {
        Some(BpfError::Sample(sample)) => sample,
        _ => e.downcast_ref::<SampleError>()?,
    };
    Some(match sample {
        SampleError::PrivilegedExec { command, why } => format!(
            "cannot profile {command}: it {why}, so its exec changes privileges and the kernel \
             stops sampling it there (no samples); profile a copy without that (`cp {command} \
             ./copy` drops setuid, setgid and capabilities), run stackscope as the user it runs \
             as, or as root record it with --backend bpf (its events belong to the CPUs, not to \
             the process); `stackscope doctor -- {command}` checks"
        ),
        SampleError::FrequencyTooHigh { requested, max } => format!(
            "sampling frequency {requested} Hz is above kernel.perf_event_max_sample_rate \
             ({max}): lower -F, or raise the limit with `sysctl \
             kernel.perf_event_max_sample_rate={requested}`"
        ),
        _ => return None,
    })
}

/// Errors that say what this user or this kernel does not allow.
fn machine_limit(e: &SampleError) -> bool {
    matches!(
        e,
        SampleError::PermissionDenied { .. }
            | SampleError::Perf { .. }
            | SampleError::Mmap { .. }
            | SampleError::FrequencyTooHigh { .. }
    )
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        })
    }
}

/// One line of the report, and the fix under it.
struct Check {
    verdict: Verdict,
    what: String,
    fix: Option<String>,
}

fn check(verdict: Verdict, what: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        verdict,
        what: what.into(),
        fix: fix.map(str::to_string),
    }
}

/// Capability numbers, as in linux/capability.h.
const CAPABILITIES: [(&str, u32); 4] = [
    ("CAP_PERFMON", 38),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_BPF", 39),
    ("CAP_SYS_PTRACE", 19),
];

/// Whether this process holds capability `name` (one of [`CAPABILITIES`]) in `effective`.
fn holds(effective: u64, name: &str) -> bool {
    CAPABILITIES
        .iter()
        .any(|&(n, bit)| n == name && effective & (1 << bit) != 0)
}

pub fn run(args: DoctorArgs) -> Result<i32> {
    let effective = own_capabilities("CapEff").unwrap_or(0);
    let perfmon = holds(effective, "CAP_PERFMON") || holds(effective, "CAP_SYS_ADMIN");
    let mut checks = vec![
        capabilities(effective),
        paranoid(perfmon),
        cpu_clock(),
        kptr_restrict(),
        bpf(),
    ];
    if let Some(program) = args.program.first() {
        checks.extend(program_checks(program));
    }
    let mut worst = Verdict::Ok;
    for c in &checks {
        println!("{:<4}  {}", c.verdict, c.what);
        if let Some(fix) = &c.fix {
            println!("      fix: {fix}");
        }
        worst = worst.max(c.verdict);
    }
    Ok(if worst == Verdict::Fail { 1 } else { 0 })
}

fn capabilities(effective: u64) -> Check {
    let held: Vec<&str> = CAPABILITIES
        .iter()
        .filter(|&&(_, bit)| effective & (1 << bit) != 0)
        .map(|&(name, _)| name)
        .collect();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if held.len() == CAPABILITIES.len() {
        return check(
            Verdict::Ok,
            format!(
                "capabilities: uid {euid}, holds {} (effective)",
                held.join(", ")
            ),
            None,
        );
    }
    let held = if held.is_empty() {
        "none".to_string()
    } else {
        held.join(", ")
    };
    check(
        Verdict::Warn,
        format!(
            "capabilities: uid {euid}, effective: {held} of CAP_PERFMON (any process, kernel \
             stacks, -a), CAP_BPF (the bpf backend, with CAP_PERFMON), CAP_SYS_PTRACE (other \
             users' processes); without them kernel.perf_event_paranoid decides"
        ),
        Some("run as root, or `setcap cap_perfmon,cap_bpf,cap_sys_ptrace+ep` on the stackscope binary"),
    )
}

fn paranoid(privileged: bool) -> Check {
    let Some(level) = read_sysctl("perf_event_paranoid") else {
        return check(
            Verdict::Warn,
            "kernel.perf_event_paranoid: unreadable (/proc/sys/kernel/perf_event_paranoid)",
            None,
        );
    };
    if privileged {
        return check(
            Verdict::Ok,
            format!("kernel.perf_event_paranoid = {level}: no limit for you (CAP_PERFMON or CAP_SYS_ADMIN)"),
            None,
        );
    }
    match level {
        i64::MIN..=0 => check(
            Verdict::Ok,
            format!("kernel.perf_event_paranoid = {level}: any of your processes, kernel stacks, and -a"),
            None,
        ),
        1 => check(
            Verdict::Warn,
            "kernel.perf_event_paranoid = 1: your own processes with kernel stacks; not -a",
            Some("`sysctl kernel.perf_event_paranoid=0` for -a, or grant CAP_PERFMON"),
        ),
        2 => check(
            Verdict::Warn,
            "kernel.perf_event_paranoid = 2: your own processes, user space only (no kernel stacks, no -a)",
            Some("`sysctl kernel.perf_event_paranoid=1` for kernel stacks (0 for -a), or grant CAP_PERFMON"),
        ),
        // Debian's and Android's kernels close perf events to unprivileged users from 3;
        // upstream treats it as 2. The cpu-clock check tells which.
        _ => check(
            Verdict::Warn,
            format!("kernel.perf_event_paranoid = {level}: at most your own processes, user space only; closed to you on kernels that patch in level 3"),
            Some("`sysctl kernel.perf_event_paranoid=2` (or lower), run as root, or grant CAP_PERFMON"),
        ),
    }
}

fn cpu_clock() -> Check {
    let describe = |e: io::Error| e.to_string();
    match (probe_cpu_clock(true), probe_cpu_clock(false)) {
        (Ok(()), _) => check(
            Verdict::Ok,
            "cpu-clock: a sampling event opens on this process, kernel side included",
            None,
        ),
        (Err(_), Ok(())) => check(
            Verdict::Warn,
            "cpu-clock: opens for user space only (kernel stacks refused)",
            Some("`sysctl kernel.perf_event_paranoid=1`, or grant CAP_PERFMON"),
        ),
        (Err(_), Err(e)) => check(
            Verdict::Fail,
            format!("cpu-clock: the kernel refuses a sampling event on this process: {}", describe(e)),
            Some("lower kernel.perf_event_paranoid (2 lets you profile your own processes), run as root, or grant CAP_PERFMON"),
        ),
    }
}

fn kptr_restrict() -> Check {
    let level = read_sysctl("kptr_restrict")
        .map(|l| l.to_string())
        .unwrap_or_else(|| "unreadable".into());
    // What counts is whether this user sees addresses: zeroes mean kernel frames go unnamed.
    let visible = std::fs::read_to_string("/proc/kallsyms")
        .ok()
        .and_then(|text| {
            let first = text.lines().next()?.split_whitespace().next()?.to_string();
            Some(first.chars().any(|c| c != '0'))
        });
    match visible {
        Some(true) => check(
            Verdict::Ok,
            format!("kernel.kptr_restrict = {level}: kernel symbols readable (/proc/kallsyms)"),
            None,
        ),
        _ => check(
            Verdict::Warn,
            format!("kernel.kptr_restrict = {level}: /proc/kallsyms shows no addresses to you, so kernel frames stay unnamed"),
            Some("`sysctl kernel.kptr_restrict=0`, or run as root (or with CAP_SYSLOG) when kptr_restrict is 1"),
        ),
    }
}

/// What the bpf backend (`profile`, `record --backend bpf`, record's default) lacks on this
/// machine for this user: BTF, kernel 5.17+, CAP_BPF+CAP_PERFMON; with the kernel's release.
/// Empty when it can run.
pub(crate) fn bpf_missing() -> (String, Vec<&'static str>) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    let effective = own_capabilities("CapEff").unwrap_or(0);
    let admin = holds(effective, "CAP_SYS_ADMIN");
    let cap_bpf = admin || holds(effective, "CAP_BPF");
    let perfmon = admin || holds(effective, "CAP_PERFMON");
    let mut missing = Vec::new();
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        missing.push(
            "an x86-64 or aarch64 host: the eBPF unwinder has their rules only so far (the perf source walks this architecture)",
        );
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        missing
            .push("no BTF (/sys/kernel/btf/vmlinux): a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    if version < (5, 17) {
        missing.push("kernel older than 5.17 (its BPF walk needs bpf_loop): a newer kernel");
    }
    if !(cap_bpf && perfmon) {
        missing.push("CAP_BPF and CAP_PERFMON: run as root or setcap them");
    }
    (release, missing)
}

/// The bpf backend's check: [`bpf_missing`] in a line.
fn bpf() -> Check {
    let (release, missing) = bpf_missing();
    if missing.is_empty() {
        check(
            Verdict::Ok,
            format!("bpf backend: kernel {release} with BTF, and the capabilities it needs"),
            None,
        )
    } else {
        check(
            Verdict::Warn,
            format!(
                "bpf backend (profile, record --backend bpf) unavailable on kernel {release}: {}",
                missing.join("; ")
            ),
            Some("the perf backend (`record --backend perf`, record's fallback) does not need it"),
        )
    }
}

fn program_checks(program: &std::ffi::OsStr) -> Vec<Check> {
    let shown = program.to_string_lossy();
    let path = match resolve_command(program) {
        Ok(path) => path,
        Err(e) => return vec![check(Verdict::Fail, format!("{shown}: {e}"), None)],
    };
    let name = path.display().to_string();
    if let Err(e) = std::fs::metadata(&path) {
        return vec![check(Verdict::Fail, format!("{name}: {e}"), None)];
    }
    let mut checks = Vec::new();
    checks.push(match privileged_exec(&path) {
        Some(why) => check(
            Verdict::Fail,
            format!("{name}: it {why}, so its exec changes privileges and the kernel stops profiling it there"),
            Some(&format!("profile a copy without that (`cp {name} ./copy`), run stackscope as the user it runs as, or as root use --backend bpf")),
        ),
        None => check(
            Verdict::Ok,
            format!("{name}: runs with your privileges, so it can be profiled when launched"),
            None,
        ),
    });
    match unwind_sources(&path) {
        Ok(sources) => checks.extend([debug_info(&name, &sources), unwinding(&name, &sources)]),
        Err(e) => checks.push(check(Verdict::Fail, format!("{name}: {e}"), None)),
    }
    checks
}

/// Whether the program's frames can be named with inlined functions and lines.
fn debug_info(name: &str, sources: &UnwindSources) -> Check {
    if sources.debug_info {
        check(
            Verdict::Ok,
            format!(
                "{name}: debug info (.debug_info): inlined functions, files and lines are named"
            ),
            None,
        )
    } else {
        check(
            Verdict::Warn,
            format!("{name}: no debug info: frames are named from the symbol table, without inlined functions or lines (a separate debug file under /usr/lib/debug is used when present)"),
            Some(&format!(
                "for a program of your own, {BUILD_WITH_DEBUG_INFO}; for a distribution's, {INSTALL_DEBUG_INFO}"
            )),
        )
    }
}

/// Whether the program's stacks unwind whole, by tables or by frame pointers.
fn unwinding(name: &str, sources: &UnwindSources) -> Check {
    let tables: Vec<&str> = [
        (sources.eh_frame, ".eh_frame"),
        (sources.debug_frame, ".debug_frame"),
    ]
    .iter()
    .filter(|(has, _)| *has)
    .map(|&(_, name)| name)
    .collect();
    let fp = match sources.frame_pointers {
        FramePointers::Kept { with, checked } => {
            format!("frame pointers kept ({with} of {checked} functions open with push %rbp; mov %rsp,%rbp)")
        }
        FramePointers::Omitted { with, checked } => format!(
            "frame pointers omitted ({with} of {checked} functions open with push %rbp; mov %rsp,%rbp)"
        ),
        FramePointers::Unknown => "frame pointers unknown (no function symbols, or not x86-64)".to_string(),
    };
    let fp_kept = matches!(sources.frame_pointers, FramePointers::Kept { .. });
    if !tables.is_empty() {
        let fp_note = if fp_kept {
            ""
        } else {
            "; --unwind fp would break here"
        };
        check(
            Verdict::Ok,
            format!(
                "{name}: unwind tables {}: whole stacks with --unwind dwarf (the default); {fp}{fp_note}",
                tables.join(" and ")
            ),
            None,
        )
    } else if fp_kept {
        check(
            Verdict::Ok,
            format!("{name}: no unwind tables, but {fp}: stacks unwind by frame pointers"),
            None,
        )
    } else {
        check(
            Verdict::Warn,
            format!("{name}: no unwind tables (.eh_frame/.debug_frame) and {fp}: its stacks will be cut short"),
            Some("build with unwind tables (gcc's default; not -fno-asynchronous-unwind-tables) or with -fno-omit-frame-pointer (Rust: -C force-frame-pointers=yes)"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_worded_with_our_flags_whichever_source_returned_them() {
        let too_high = || SampleError::FrequencyTooHigh {
            requested: 100_000,
            max: 1000,
        };
        for e in [
            anyhow::Error::from(too_high()),
            anyhow::Error::from(BpfError::Sample(too_high())),
        ] {
            let text = point_to(e).to_string();
            assert!(text.contains("lower -F"), "{text}");
            assert!(text.ends_with(HINT), "{text}");
        }
        let text = point_to(BpfError::NoBtf.into()).to_string();
        assert!(text.contains("without --backend bpf"), "{text}");
        assert!(text.ends_with(HINT), "{text}");
        let text = point_to(SampleError::NoSuchProcess(7).into()).to_string();
        assert_eq!(text, SampleError::NoSuchProcess(7).to_string());
    }
}
