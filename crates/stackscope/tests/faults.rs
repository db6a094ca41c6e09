//! Failures and interruptions: a command that cannot start, a pid that does not exist, bad
//! report input, a target that crashes, Ctrl-C, and an unprivileged user asking for the
//! whole system. Each error is one `stackscope: error:` line on stderr and exit code 1.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn missing_command_is_a_one_line_error_and_writes_nothing() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("out.svg");
    for missing in ["/nonexistent/missing-program", "stackscope-no-such-command"] {
        let run = record(dir.path(), &out, &[], &[os(missing)]);
        run.assert_one_line_error(&[missing]);
        assert!(!out.exists(), "output written although {missing} never ran");
    }
}

#[test]
fn nonexistent_pid_is_a_clear_error() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("out.json");
    // Above any pid_max the kernel allows.
    let above_max = "4194303".to_string();
    // A pid that existed a moment ago and has been reaped.
    let mut child = Command::new("true").spawn().expect("run true");
    let reaped = child.id().to_string();
    child.wait().unwrap();
    for pid in [above_max, reaped] {
        let run = record(dir.path(), &out, &["-p", &pid, "-d", "1"], &[]);
        run.assert_one_line_error(&[&pid]);
        assert!(!out.exists(), "output written for nonexistent pid {pid}");
    }
}

#[test]
fn corrupt_report_input_is_a_clear_error() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let cases: [(&str, &[u8]); 4] = [
        ("truncated.json", br#"{"format":"stackscope","version":1,"profile":{"frames":["#),
        ("garbage.bin", &[0xff, 0xfe, 0x00, 0x13, 0x37, 0x80, 0x81, 0x0a, 0x00]),
        (
            "bad_index.json",
            br#"{"format":"stackscope","version":1,"profile":{"frames":[],"stacks":[{"frames":[7]}],"threads":[{"pid":1,"tid":1,"comm":"x"}],"samples":[{"thread":0,"stack":0,"count":1}],"meta":{"source":"perf_event","event":"cpu-clock","duration_secs":1.0,"lost_samples":0}}}"#,
        ),
        ("bad_count.folded", b"prog;main;work notanumber\n"),
    ];
    for (name, bytes) in cases {
        let input = d.join(name);
        std::fs::write(&input, bytes).unwrap();
        let out = d.join(format!("{name}.out.folded"));
        let run = stackscope(
            d,
            [os("report"), input.as_os_str(), os("-o"), out.as_os_str()],
        );
        run.assert_one_line_error(&[]);
        assert!(!out.exists(), "output written from corrupt {name}");
    }
    let missing = d.join("no-such-input.json");
    let run = stackscope(
        d,
        [
            os("report"),
            missing.as_os_str(),
            os("-o"),
            d.join("x.svg").as_os_str(),
        ],
    );
    run.assert_one_line_error(&["no-such-input.json"]);
}

#[test]
fn command_exit_code_is_passed_through() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("out.json");
    let run = record(dir.path(), &out, &[], &[os("sh"), os("-c"), os("exit 3")]);
    run.assert_exit(3, "the command's");
}

#[test]
fn crashing_target_still_gives_a_profile_and_exit_139() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("crasher");
    let out = dir.path().join("profile.json");
    let run = record(dir.path(), &out, &[], &[prog.as_os_str()]);
    run.assert_exit(139, "128 + SIGSEGV");
    let profile = read_json(&out);
    assert_min_samples(&profile, 300);
    assert_share_at_least(&profile, "crash_work", 0.95);
    assert_share_at_least(&profile, "main", 0.95);
}

#[test]
fn ctrl_c_writes_the_profile_taken_so_far() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let out = dir.path().join("profile.json");
    let start = Instant::now();
    // Its own process group, so the signal reaches stackscope and the workload together,
    // as Ctrl-C in a terminal does.
    let child = spawn_piped(
        record_command(dir.path(), &out, &[], &[spin.as_os_str(), os("30")]).process_group(0),
    );
    let pgid = child.id() as i32;
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) with a negative pid signals our own child's process group.
    let rc = unsafe { libc::kill(-pgid, libc::SIGINT) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    let run = wait_output(child, start);

    assert!(
        run.wall < Duration::from_secs(20),
        "stackscope took {:?} to stop after SIGINT",
        run.wall
    );
    run.assert_exit(130, "128 + SIGINT");
    let profile = read_json(&out);
    assert_min_samples(&profile, 300);
    assert_share_at_least(&profile, "spin_work", 0.99);
}

/// Sets /proc/sys/kernel/perf_event_paranoid to at least `min` and restores it on drop.
struct Paranoid {
    original: Option<String>,
}

const PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

impl Paranoid {
    fn at_least(min: i32) -> Self {
        let current = std::fs::read_to_string(PARANOID).expect("read perf_event_paranoid");
        let value: i32 = current
            .trim()
            .parse()
            .expect("perf_event_paranoid is a number");
        if value >= min {
            return Paranoid { original: None };
        }
        std::fs::write(PARANOID, min.to_string()).expect("raise perf_event_paranoid");
        Paranoid {
            original: Some(current),
        }
    }
}

impl Drop for Paranoid {
    fn drop(&mut self) {
        if let Some(original) = &self.original {
            let _ = std::fs::write(PARANOID, original.trim());
        }
    }
}

#[test]
fn unprivileged_whole_system_names_perf_event_paranoid() {
    let _serial = serial();
    let dir = tempdir();
    // The unprivileged user must reach the binary and the output directory.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let _paranoid = Paranoid::at_least(1);
    let out = dir.path().join("out.json");
    let mut cmd = Command::new("setpriv");
    cmd.current_dir(dir.path())
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(stackscope_bin())
        .args(record_args(&out, &["-a", "-d", "1"], &[]));
    let run = run_with_deadline(cmd);
    run.assert_one_line_error(&["perf_event_paranoid"]);
    assert!(
        !out.exists(),
        "output written although sampling was refused"
    );
}
