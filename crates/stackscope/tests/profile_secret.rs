//! No stack memory of a profiled program reaches stackscope with the eBPF source. secret.c
//! keeps 24 random bytes (made by this test, handed over on its stdin, never on a command
//! line) in a buffer in every frame of the stack it burns CPU on. stackscope `profile` and
//! `record --backend bpf` run on it writing every output format; the secret, raw or as hex,
//! must be in none of them, nor in stackscope's stdout and stderr, nor in anything stackscope
//! reads: its read(2), pread64(2) and process_vm_readv(2) data and bpf(2) calls, as strace
//! prints them (every byte escaped as `\xNN`).
//!
//! The check can fail: the workload itself runs under the same strace settings, and its read
//! of the secret from stdin must show up in its trace in the form searched for. (The perf
//! backend does copy the secret: `--unwind dwarf` copies 32 KiB of stack per sample; but it
//! arrives through the mmapped ring buffer, which no system call shows, so a trace of it
//! proves nothing either way.)

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const STRACE: [&str; 6] = [
    "-f",
    "-xx",
    "-s",
    "65535",
    "-e",
    "trace=read,pread64,preadv,readv,process_vm_readv,bpf",
];

/// `\xNN` for every byte, as `strace -xx` prints data.
fn escaped(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\x{b:02x}")).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Needles(Vec<(String, Vec<u8>)>);

impl Needles {
    fn new(secret: &[u8]) -> Self {
        let h = hex(secret);
        Needles(vec![
            ("raw secret".into(), secret.to_vec()),
            ("secret as hex".into(), h.clone().into_bytes()),
            ("secret as HEX".into(), h.to_uppercase().into_bytes()),
            ("escaped raw secret".into(), escaped(secret).into_bytes()),
            (
                "escaped hex secret".into(),
                escaped(h.as_bytes()).into_bytes(),
            ),
            // Half of it is enough to leak; 12 random bytes never occur by chance.
            ("raw half secret".into(), secret[..12].to_vec()),
            ("raw second half".into(), secret[12..].to_vec()),
        ])
    }

    /// The first needle found in `haystack`.
    fn find(&self, haystack: &[u8]) -> Option<&str> {
        self.0
            .iter()
            .find(|(_, n)| haystack.windows(n.len()).any(|w| w == n.as_slice()))
            .map(|(what, _)| what.as_str())
    }

    fn assert_absent(&self, what: &str, haystack: &[u8]) {
        if let Some(found) = self.find(haystack) {
            panic!("the {found} appears in {what}");
        }
    }
}

/// Runs `stackscope ARGS` under strace into `trace`, returning the run.
fn traced(dir: &Path, trace: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new("strace");
    cmd.current_dir(dir)
        .args(STRACE)
        .arg("-o")
        .arg(trace)
        .arg(stackscope_bin())
        .args(args);
    run_with_deadline(cmd)
}

#[test]
fn no_stack_memory_leaves_the_kernel() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let mut secret = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .expect("read /dev/urandom");
    let needles = Needles::new(&secret);

    // The workload, under strace itself: its trace is the positive control.
    let prog = workload("secret");
    let wl_trace = d.join("workload.trace");
    let mut strace = Command::new("strace");
    strace
        .args(STRACE)
        .arg("-o")
        .arg(&wl_trace)
        .arg(&prog)
        .arg("240")
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut target = Background(strace.spawn().expect("spawn strace"));
    let mut stdin = target.0.stdin.take().expect("stdin piped");
    writeln!(stdin, "{}", hex(&secret)).expect("hand the secret over");
    drop(stdin);
    let strace_pid = target.pid();
    let pid: u32 = wait_until("secret never started under strace", || {
        let children =
            std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children"))
                .ok()?;
        let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        maps.contains("secret").then_some(pid)
    });
    wait_until(
        "the workload's trace never showed its read of the secret",
        || {
            let trace = std::fs::read(&wl_trace).ok()?;
            (needles.find(&trace) == Some("escaped hex secret")).then_some(())
        },
    );
    let _workload = KillOnDrop(pid);
    let pid = pid.to_string();

    let mut outputs: Vec<std::path::PathBuf> = Vec::new();
    let check_run = |name: &str, args: &[&str]| {
        let trace = d.join(format!("{name}.trace"));
        let run = traced(d, &trace, args);
        run.assert_ok();
        needles.assert_absent(&format!("{name}: stdout"), run.stdout.as_bytes());
        needles.assert_absent(&format!("{name}: stderr"), run.stderr.as_bytes());
        let trace_bytes = std::fs::read(&trace).expect("strace wrote its trace");
        assert!(
            trace_bytes.windows(5).any(|w| w == b"bpf(B"),
            "{name}: the trace shows no bpf() call, so it did not trace stackscope"
        );
        needles.assert_absent(&format!("{name}: what stackscope read"), &trace_bytes);
        run
    };

    // bcc text and folded on stdout, then every file format.
    let run = check_run("profile-text", &["profile", "-F", "999", "-p", &pid, "1"]);
    assert!(
        run.stdout.contains("    burn\n"),
        "the profile shows the workload:\n{}",
        run.stdout
    );
    check_run(
        "profile-folded",
        &["profile", "-adf", "-F", "999", "-p", &pid, "1"],
    );
    for ext in ["json", "svg", "txt", "folded"] {
        let out = d.join(format!("profile.{ext}"));
        let args = [
            "profile",
            "-F",
            "999",
            "-p",
            &pid,
            "-o",
            out.to_str().unwrap(),
            "1",
        ];
        check_run(&format!("profile-{ext}"), &args);
        outputs.push(out);
    }
    for ext in ["json", "svg", "txt", "folded"] {
        let out = d.join(format!("record.{ext}"));
        let args = [
            "record",
            "--backend",
            "bpf",
            "-F",
            "999",
            "-p",
            &pid,
            "-d",
            "2",
            "-o",
            out.to_str().unwrap(),
        ];
        check_run(&format!("record-{ext}"), &args);
        outputs.push(out);
    }
    for out in &outputs {
        let bytes =
            std::fs::read(out).unwrap_or_else(|e| panic!("{} not written: {e}", out.display()));
        assert!(
            String::from_utf8_lossy(&bytes).contains("burn"),
            "{} does not show the workload",
            out.display()
        );
        needles.assert_absent(&out.display().to_string(), &bytes);
    }
    drop(target);
}

/// Kills the workload (traced, so not our child) when the test ends, however it ends.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory effects; the pid is the workload's.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}
