//! Stopping stackscope as users and supervisors do: a Ctrl-C that arrives twice within
//! milliseconds (a terminal's reaches the whole process group), SIGINT then SIGTERM, SIGHUP,
//! GNU `timeout -s INT`, with `record` and `profile`. The first stop always ends with the
//! profile written and the launched program no longer running; a deliberate second stop a
//! second later still writes the profile, its frames named by module and address.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Sends each `(delay, signal)` in turn to `pid`, each delay counted from the last.
fn send(pid: u32, signals: &[(u64, libc::c_int)]) {
    for &(delay, signal) in signals {
        std::thread::sleep(Duration::from_millis(delay));
        // SAFETY: a signal to our own child.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }
}

/// The pid the spin workload runs as, found among `parent`'s children (whichever of its
/// threads started it).
fn child_of(parent: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).ok()?;
    tasks.flatten().find_map(|task| {
        let children = std::fs::read_to_string(task.path().join("children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    })
}

/// `record -o OUT -- spin 30` started; the spin workload's pid once it runs.
fn start_recording(dir: &Path, out: &Path) -> (Child, u32, Instant) {
    let spin = workload("spin");
    let start = Instant::now();
    let child = spawn_piped(&mut record_command(
        dir,
        out,
        &[],
        &[spin.as_os_str(), os("30")],
    ));
    let recorder = child.id();
    let program = wait_until("the program to start", || child_of(recorder));
    (child, program, start)
}

/// Asserts the recording ended in time with its profile written and the program gone.
fn assert_written_and_program_gone(run: &Run, out: &Path, program: u32) {
    assert!(
        run.wall < Duration::from_secs(30),
        "took {:?}\n{}",
        run.wall,
        run.stderr
    );
    assert!(
        run.stderr.contains("stackscope: wrote "),
        "the profile was not written: {:?}\n{}",
        run.status,
        run.stderr
    );
    let profile = read_json(out);
    assert_min_samples(&profile, 100);
    assert!(
        !Path::new(&format!("/proc/{program}")).exists(),
        "the program (pid {program}) still runs after stackscope ended"
    );
}

#[test]
fn two_ctrl_cs_50_ms_apart_are_one_stop_and_the_profile_is_written() {
    let _serial = serial();
    for second in [libc::SIGINT, libc::SIGTERM] {
        let dir = tempdir();
        let out = dir.path().join("profile.json");
        let (child, program, start) = start_recording(dir.path(), &out);
        send(child.id(), &[(1000, libc::SIGINT), (50, second)]);
        let run = wait_output(child, start);
        assert_written_and_program_gone(&run, &out, program);
        // Named in full: the copy did not stop naming.
        let profile = read_json(&out);
        assert_share_at_least(&profile, "spin_work", 0.9);
    }
}

#[test]
fn sighup_stops_the_recording_and_the_profile_is_written() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("profile.json");
    let (child, program, start) = start_recording(dir.path(), &out);
    send(child.id(), &[(1000, libc::SIGHUP)]);
    let run = wait_output(child, start);
    assert_written_and_program_gone(&run, &out, program);
}

#[test]
fn a_second_stop_a_second_later_still_writes_the_profile() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("profile.json");
    let (child, program, start) = start_recording(dir.path(), &out);
    // The second comes while the program is being ended or the frames named: naming stops,
    // the profile is written with what it has.
    send(child.id(), &[(1000, libc::SIGINT), (1100, libc::SIGINT)]);
    let run = wait_output(child, start);
    assert_written_and_program_gone(&run, &out, program);
}

#[test]
fn gnu_timeout_with_sigint_keeps_the_profile_every_time() {
    let _serial = serial();
    let spin = workload("spin");
    for round in 0..5 {
        let dir = tempdir();
        let out = dir.path().join("p.json");
        let mut cmd = Command::new("timeout");
        cmd.current_dir(dir.path())
            .args(["-s", "INT", "2", stackscope_bin(), "record", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&spin)
            .arg("30");
        let run = run_with_deadline(cmd);
        assert!(
            run.stderr.contains("stackscope: wrote "),
            "round {round}: the profile was not written: {:?}\n{}",
            run.status,
            run.stderr
        );
        assert_min_samples(&read_json(&out), 100);
    }
    // No spin workload of these rounds is left running.
    let left = Command::new("pgrep")
        .arg("-f")
        .arg(spin.as_os_str())
        .output()
        .expect("run pgrep");
    assert!(
        left.stdout.is_empty(),
        "spin still running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn profile_keeps_its_output_through_two_ctrl_cs() {
    let _serial = serial();
    let dir = tempdir();
    let spin = start_workload("spin", &["30"], None);
    let start = Instant::now();
    let child = spawn_piped(
        Command::new(stackscope_bin())
            .current_dir(dir.path())
            .args(["profile", "-p", &spin.pid().to_string(), "-f", "30"]),
    );
    send(child.id(), &[(1500, libc::SIGINT), (50, libc::SIGINT)]);
    let run = wait_output(child, start);
    assert!(
        run.stdout.lines().any(|l| l.contains("spin_work")),
        "no spin_work stack in profile's output ({:?}):\n{}\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
}
