//! What this user and this machine allow: `stackscope doctor` run for real as root and as an
//! unprivileged user, a setuid program the kernel will not let that user profile, and errors
//! about permissions that point to `doctor`.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An unprivileged user (nobody) for [`as_nobody`].
const NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

/// Runs stackscope with `args` as nobody, in `/`.
fn as_nobody<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let mut cmd = Command::new("setpriv");
    cmd.current_dir("/")
        .args(NOBODY)
        .arg(stackscope_bin())
        .args(args);
    run_with_deadline(cmd)
}

/// A directory the unprivileged user can reach and write.
fn open_dir() -> tempfile::TempDir {
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o777)).unwrap();
    dir
}

/// A root-owned setuid copy of the spin workload in `dir`.
fn setuid_spin(dir: &Path) -> PathBuf {
    let copy = dir.join("spin-setuid");
    std::fs::copy(workload("spin"), &copy).unwrap();
    std::fs::set_permissions(&copy, PermissionsExt::from_mode(0o4755)).unwrap();
    copy
}

/// The report line about `what` (the first line containing it).
fn line<'a>(run: &'a Run, what: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line about {what}:\n{}", run.stdout))
}

#[test]
fn doctor_as_root_passes_and_reads_a_programs_unwind_sources() {
    let _serial = serial();
    let dir = tempdir();
    let run = stackscope(dir.path(), ["doctor"]);
    run.assert_exit(0, "nothing recording needs fails as root");
    for what in [
        "kernel.perf_event_paranoid",
        "kernel.kptr_restrict",
        "cpu-clock",
        "capabilities",
    ] {
        assert!(line(&run, what).starts_with("ok "), "{}", run.stdout);
    }
    assert!(line(&run, "CAP_PERFMON").contains("CAP_SYS_ADMIN"));
    assert!(line(&run, "bpf backend").contains("6."), "{}", run.stdout);

    let fp = workload("split_fp");
    let nofp = workload("split_nofp");
    let run = stackscope(dir.path(), [os("doctor"), os("--"), fp.as_os_str()]);
    run.assert_exit(0, "an ordinary program with debug info");
    assert!(line(&run, "debug info (.debug_info)").starts_with("ok "));
    let unwind = line(&run, "unwind tables");
    assert!(unwind.contains(".eh_frame"), "{unwind}");
    assert!(unwind.contains("frame pointers kept"), "{unwind}");
    let run = stackscope(dir.path(), [os("doctor"), os("--"), nofp.as_os_str()]);
    let unwind = line(&run, "unwind tables");
    assert!(unwind.contains("frame pointers omitted"), "{unwind}");
    assert!(unwind.contains("--unwind fp would break"), "{unwind}");

    let run = stackscope(dir.path(), ["doctor", "--", "/nonexistent/program"]);
    run.assert_exit(1, "a program that does not exist fails");
    assert!(line(&run, "/nonexistent/program").starts_with("fail "));
}

#[test]
fn doctor_as_an_unprivileged_user_says_what_is_missing() {
    let _serial = serial();
    let run = as_nobody(&["doctor"]);
    let capabilities = line(&run, "capabilities");
    assert!(
        capabilities.starts_with("warn ") && capabilities.contains("effective: none"),
        "{}",
        run.stdout
    );
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap();
    let paranoid: i32 = paranoid.trim().parse().unwrap();
    let clock = line(&run, "cpu-clock");
    if paranoid >= 2 {
        assert!(clock.contains("user space only"), "{}", run.stdout);
        assert!(run
            .stdout
            .contains("fix: `sysctl kernel.perf_event_paranoid=1`"));
    }
    assert!(line(&run, "bpf backend").starts_with("warn "));
    assert!(line(&run, "bpf backend").contains("CAP_BPF"));
    run.assert_exit(0, "profiling one's own processes works at paranoid <= 2");
}

#[test]
fn setuid_program_run_by_an_unprivileged_user_is_refused_with_the_reason() {
    let _serial = serial();
    let dir = open_dir();
    let program = setuid_spin(dir.path());
    let out = dir.path().join("out.json");
    let run = as_nobody(&record_args(&out, &[], &[program.as_os_str(), os("2")]));
    run.assert_one_line_error(&[
        program.to_str().unwrap(),
        "setuid",
        "cp ",
        "stackscope doctor",
    ]);
    assert!(!out.exists());

    let run = as_nobody(&[os("doctor"), os("--"), program.as_os_str()]);
    run.assert_exit(1, "the program cannot be profiled by this user");
    assert!(
        line(&run, "setuid to uid 0").starts_with("fail "),
        "{}",
        run.stdout
    );

    // Root runs it with its own privileges: nothing changes at exec, and it is profiled.
    let (run, profile) = record_json(dir.path(), &[], &[program.as_os_str(), os("2")]);
    run.assert_ok();
    assert_min_samples(&profile, 100);

    // Setuid to another user: the kernel drops even root's perf events at that exec.
    std::os::unix::fs::chown(&program, Some(65534), None).unwrap();
    std::fs::set_permissions(&program, PermissionsExt::from_mode(0o4755)).unwrap();
    let run = record(
        dir.path(),
        &out,
        &["--backend", "perf"],
        &[program.as_os_str(), os("2")],
    );
    run.assert_one_line_error(&["setuid to uid 65534", "--backend bpf"]);
    // The bpf backend, root's default, samples CPUs, so it profiles the program anyway.
    let run = record(dir.path(), &out, &[], &[program.as_os_str(), os("2")]);
    run.assert_ok();
    assert_min_samples(&read_json(&out), 100);
}

#[test]
fn refused_whole_system_recording_points_to_doctor() {
    let _serial = serial();
    let dir = open_dir();
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap();
    if paranoid.trim().parse::<i32>().unwrap() < 1 {
        // -a is allowed to everyone here; nothing to refuse.
        return;
    }
    let out = dir.path().join("out.json");
    let run = as_nobody(&record_args(&out, &["-a", "-d", "1"], &[]));
    run.assert_one_line_error(&["perf_event_paranoid", "run `stackscope doctor`"]);
}

#[test]
fn an_unprivileged_user_gets_the_perf_backend_and_one_line_saying_why() {
    let _serial = serial();
    let dir = open_dir();
    let out = dir.path().join("out.folded");
    let spin = workload("spin");
    let run = as_nobody(&record_args(&out, &[], &[spin.as_os_str(), os("1")]));
    run.assert_ok();
    let said: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("sampled with"))
        .collect();
    assert_eq!(said.len(), 1, "{}", run.stderr);
    for what in ["perf_event", "eBPF unavailable", "CAP_BPF"] {
        assert!(said[0].contains(what), "{what}: {}", said[0]);
    }
    assert!(std::fs::read_to_string(&out).unwrap().contains("spin_work"));

    // Root, on this machine where eBPF runs, gets it without asking.
    let run = record(dir.path(), &out, &[], &[spin.as_os_str(), os("1")]);
    run.assert_ok();
    assert!(
        run.stderr.contains("sampled with eBPF") && run.stderr.contains("the default"),
        "{}",
        run.stderr
    );
}
