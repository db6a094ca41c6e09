//! `stackscope gdb` against a real QEMU: the x86-64 test kernel in `tests/guest/` boots with
//! two vCPUs, each spinning in `spin_a` (about 30% of its time) and `spin_b` under
//! `work_loop`, entered through `kmain` (vCPU 0) or `ap_main` (vCPU 1) from `start64`. The
//! kernel measures the time each function really takes (with the TSC) and prints it on COM1:
//! that is the split the samples must show, over the time they were taken. The kernel is built
//! with frame pointers and no unwind tables, and without frame pointers with `.eh_frame`, so
//! each unwinding method is the only one that works on one of the builds.

#![cfg(target_os = "linux")]

mod common;
mod qemu;

use common::*;
use qemu::{assert_split, count, describe, vcpus_of_folded, Kernel, Qemu, Stacks, Stub, Window};
use stackscope_profile::Profile;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Stacks that must reach the entry (`start64` → `kmain`/`ap_main`); under software
/// emulation a vCPU stops only between translation blocks, never mid-prologue, but a stop on
/// a function's first instruction can still hide its caller from the frame chain.
const MIN_COMPLETE: f64 = 0.95;
/// The moderate rate, and how long each rate samples: a duration, not a number of rounds, since
/// on a loaded host stopping the guest can take milliseconds (QEMU waits for every vCPU
/// thread to get a CPU and stop); the tolerance follows from the looks counted. Looks at a
/// vCPU that the host left without time since the round before are not counted, so that the
/// looks left are fresh ones.
const HZ: &str = "200";
const SECS: &str = "10";

/// The entry function of each vCPU's stacks.
fn entry_of(cpu: u32) -> &'static str {
    if cpu == 0 {
        "kmain"
    } else {
        "ap_main"
    }
}

/// Asserts the split (against the kernel's measure in `window`) and the complete stacks of
/// vCPU `cpu`, of at most `rounds` looks.
fn assert_vcpu(cpu: u32, stacks: &Stacks, rounds: u64, window: &Window) {
    let total = count(stacks, |_| true);
    assert!(
        total > 0 && total <= rounds,
        "vCPU {cpu}: one look per round at most\n{}",
        describe(stacks)
    );
    assert_split(&format!("vCPU {cpu}"), stacks, &window.truth(&[cpu]));
    let entry = entry_of(cpu);
    let complete = count(stacks, |f| {
        f.len() >= 3 && f[0] == "start64" && f[1] == entry && f.iter().any(|n| n == "work_loop")
    });
    assert!(
        complete as f64 >= MIN_COMPLETE * total as f64,
        "vCPU {cpu}: only {complete} of {total} stacks go start64;{entry};work_loop;...\n{}",
        describe(stacks)
    );
}

/// Each vCPU's stacks from a stackscope JSON profile, keyed by the vCPU's thread.
fn vcpus_of_profile(profile: &Profile) -> BTreeMap<u32, Stacks> {
    let mut by_cpu: BTreeMap<u32, Stacks> = BTreeMap::new();
    for s in &profile.samples {
        let thread = profile.thread(s.thread);
        assert_eq!(
            thread.comm,
            format!("cpu{}", thread.tid),
            "each vCPU is a thread named cpuN"
        );
        assert_eq!(s.cpu, Some(thread.tid), "a vCPU's samples carry its index");
        let frames = profile
            .stack_frames(s.stack)
            .map(|f| f.name.clone())
            .collect();
        by_cpu
            .entry(thread.tid)
            .or_default()
            .push((frames, s.count));
    }
    by_cpu
}

/// Each vCPU's stacks from the OSDK's JSON: one map per round from the vCPU index to its
/// frames, leaf first.
fn vcpus_of_osdk(text: &str) -> BTreeMap<u32, Stacks> {
    let value: serde_json::Value = serde_json::from_str(text).expect("OSDK JSON parses");
    let rounds = value["stack_traces"]
        .as_array()
        .expect("OSDK JSON has stack_traces");
    let mut by_cpu: BTreeMap<u32, Stacks> = BTreeMap::new();
    for round in rounds {
        for (cpu, frames) in round.as_object().expect("a round is a map of vCPUs") {
            let mut frames: Vec<String> = frames
                .as_array()
                .expect("a vCPU's stack is a list")
                .iter()
                .map(|f| f.as_str().expect("frame names are strings").to_string())
                .collect();
            frames.reverse();
            by_cpu
                .entry(cpu.parse().expect("vCPU keys are numbers"))
                .or_default()
                .push((frames, 1));
        }
    }
    by_cpu
}

/// `stackscope gdb --remote REMOTE --kernel KERNEL ARGS...` in `dir`, to its end.
fn gdb(dir: &Path, qemu: &Qemu, kernel: Kernel, args: &[&str]) -> Run {
    let kernel = kernel.path();
    // What these tests check is what is sampled at a set rate, not the pacing: no slowdown
    // limit, so that a loaded host's pauses do not refuse their rates.
    let mut all = vec![
        "gdb",
        "--remote",
        &qemu.remote,
        "--max-slowdown",
        "100",
        "--kernel",
    ];
    let kernel = kernel.to_str().expect("UTF-8 path");
    all.push(kernel);
    all.extend_from_slice(args);
    stackscope(dir, &all)
}

/// The rounds, stacks and median pause of stackscope's summary line.
fn summary(run: &Run) -> (u64, u64, f64) {
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(" rounds, ") && l.contains("guest paused per round"))
        .unwrap_or_else(|| panic!("no summary line on stderr:\n{}", run.stderr));
    let number_before = |word: &str| -> f64 {
        let head = &line[..line
            .find(word)
            .unwrap_or_else(|| panic!("{word:?} not in {line}"))];
        let token = head.split_whitespace().last().expect("a number");
        token
            .parse()
            .unwrap_or_else(|_| panic!("{token:?} before {word:?} is not a number: {line}"))
    };
    let median = line
        .split("median ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no median pause in {line}"));
    (
        number_before(" rounds,") as u64,
        number_before(" stacks in") as u64,
        median,
    )
}

/// How fast to sample.
#[derive(Clone, Copy)]
enum Rate {
    /// [`HZ`] rounds a second for [`SECS`].
    Moderate,
    /// As often as the guest allows without a slowdown limit (it runs as long as a typical
    /// round stopped it), for [`SECS`].
    Highest,
}

impl Rate {
    fn args(self) -> Vec<String> {
        let args = match self {
            Rate::Moderate => ["-F", HZ, "-d", SECS].map(String::from),
            Rate::Highest => ["--interval", "0", "-d", SECS].map(String::from),
        };
        args.to_vec()
    }
}

/// A run of `stackscope gdb` against the two-vCPU guest, with the kernel's measure of the
/// time it covered.
struct Sampled {
    run: Run,
    /// The profile written.
    text: String,
    window: Window,
}

/// Boots `kernel` (on a TCP stub, or `socket`) and samples it at `rate` into `out_name`.
fn sample_kernel(kernel: Kernel, rate: Rate, out_name: &str, extra: &[&str]) -> Sampled {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot(kernel, 2, Stub::Tcp, dir.path());
    let out = dir.path().join(out_name);
    let rate = rate.args();
    let mut args: Vec<&str> = rate.iter().map(String::as_str).collect();
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let mut window = Window::open(&qemu.serial, 2);
    let run = gdb(dir.path(), &qemu, kernel, &args);
    run.assert_ok();
    window.close();
    let text = std::fs::read_to_string(&out)
        .unwrap_or_else(|e| panic!("{} was not written: {e}", out.display()));
    Sampled { run, text, window }
}

/// Asserts both vCPUs' splits and stacks, and that every round's looks were counted or left
/// out as stale.
fn assert_two_vcpus(vcpus: &BTreeMap<u32, Stacks>, run: &Run, window: &Window) {
    let (rounds, stacks, _) = summary(run);
    let cpus: Vec<u32> = vcpus.keys().copied().collect();
    assert_eq!(cpus, [0, 1], "one thread per vCPU");
    for (cpu, stacks) in vcpus {
        assert_vcpu(*cpu, stacks, rounds, window);
    }
    let both: Stacks = vcpus.values().flatten().cloned().collect();
    let counted = count(&both, |_| true);
    assert_eq!(counted, stacks, "{}", run.stderr);
    assert_eq!(counted + gdb_stale_looks(run), 2 * rounds, "{}", run.stderr);
    assert_split("both vCPUs", &both, &window.truth(&cpus));
}

#[test]
fn frame_pointer_kernel_split_per_vcpu() {
    let sampled = sample_kernel(Kernel::FramePointers, Rate::Moderate, "guest.json", &[]);
    let profile = stackscope_profile::format::read(sampled.text.as_bytes())
        .unwrap_or_else(|e| panic!("the JSON profile does not read back: {e}"));
    assert_eq!(profile.meta.source, "gdb");
    let run = &sampled.run;
    assert_two_vcpus(&vcpus_of_profile(&profile), run, &sampled.window);
    let (rounds, _, median_pause) = summary(run);
    assert!(rounds > 0, "{}", run.stderr);
    assert!(median_pause > 0.0, "a round stops the guest for some time");
}

#[test]
fn cfi_kernel_split_per_vcpu_folded() {
    let sampled = sample_kernel(Kernel::Cfi, Rate::Moderate, "guest.folded", &[]);
    let vcpus = vcpus_of_folded(&sampled.text);
    assert_two_vcpus(&vcpus, &sampled.run, &sampled.window);
}

#[test]
fn cfi_kernel_split_at_the_highest_rate() {
    let sampled = sample_kernel(Kernel::Cfi, Rate::Highest, "guest.folded", &[]);
    let vcpus = vcpus_of_folded(&sampled.text);
    assert_two_vcpus(&vcpus, &sampled.run, &sampled.window);
}

#[test]
fn frame_pointer_kernel_split_at_the_highest_rate() {
    let sampled = sample_kernel(Kernel::FramePointers, Rate::Highest, "guest.folded", &[]);
    let vcpus = vcpus_of_folded(&sampled.text);
    assert_two_vcpus(&vcpus, &sampled.run, &sampled.window);
}

#[test]
fn unix_socket_stub_osdk_json() {
    let _serial = serial();
    let dir = tempdir();
    let socket = dir.path().join("gdb.sock");
    let qemu = Qemu::boot(Kernel::Cfi, 2, Stub::Unix(socket), dir.path());
    let out = dir.path().join("guest.json");
    let mut args: Vec<String> = Rate::Moderate.args();
    args.extend(["--format", "osdk", "-o", out.to_str().unwrap()].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut window = Window::open(&qemu.serial, 2);
    let run = gdb(dir.path(), &qemu, Kernel::Cfi, &args);
    run.assert_ok();
    window.close();
    let text = std::fs::read_to_string(&out).expect("OSDK JSON written");
    assert_two_vcpus(&vcpus_of_osdk(&text), &run, &window);
}

#[test]
fn cpu_mask_selects_vcpu0() {
    let sampled = sample_kernel(
        Kernel::FramePointers,
        Rate::Moderate,
        "guest.folded",
        &["--cpu-mask", "0x1"],
    );
    let vcpus = vcpus_of_folded(&sampled.text);
    assert_eq!(
        vcpus.keys().copied().collect::<Vec<_>>(),
        [0],
        "only vCPU 0 is sampled"
    );
    let run = &sampled.run;
    let (rounds, _, _) = summary(run);
    let counted = count(&vcpus[&0], |_| true);
    assert_eq!(counted + gdb_stale_looks(run), rounds, "{}", run.stderr);
    assert_vcpu(0, &vcpus[&0], rounds, &sampled.window);
}

#[test]
fn qemu_killed_mid_run_keeps_the_profile_so_far() {
    let _serial = serial();
    let dir = tempdir();
    let mut qemu = Qemu::boot(Kernel::Cfi, 2, Stub::Tcp, dir.path());
    let out = dir.path().join("guest.folded");
    let kernel = Kernel::Cfi.path();
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args(["gdb", "--remote", &qemu.remote, "--kernel"])
        .arg(&kernel)
        .args([
            "-F",
            "100",
            "--max-slowdown",
            "100",
            "--samples",
            "100000",
            "-o",
        ])
        .arg(&out);
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    // Kill the guest once sampling is well under way (connecting takes a fraction of this).
    std::thread::sleep(Duration::from_secs(5));
    qemu.kill();
    let run = wait_output(child, start);
    run.assert_ok();
    let lower = run.stderr.to_lowercase();
    assert!(
        lower.contains("connection") && (lower.contains("closed") || lower.contains("dropped")),
        "stackscope does not say that the connection dropped:\n{}",
        run.stderr
    );
    let text = std::fs::read_to_string(&out)
        .unwrap_or_else(|e| panic!("the profile so far was not written: {e}\n{}", run.stderr));
    let vcpus = vcpus_of_folded(&text);
    assert!(
        !vcpus.is_empty() && vcpus.values().all(|s| !s.is_empty()),
        "no samples before QEMU was killed:\n{}",
        run.stderr
    );
}
