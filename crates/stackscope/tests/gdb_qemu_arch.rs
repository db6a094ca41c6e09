//! `stackscope gdb` against real QEMU guests of the other architectures: the test kernel in
//! `tests/guest/` (the x86-64 tests' own) boots on riscv64 (`-machine virt -bios none`) and
//! aarch64 (`-machine virt -cpu cortex-a57`) with two vCPUs, each spinning in `spin_a` and
//! `spin_b` under `work_loop`, entered through `kmain` (vCPU 0) or `ap_main` (vCPU 1) from
//! `_start`. The kernel measures the time each function really takes and prints it on its
//! serial port: that is the split the samples must show, within the binomial tolerance of
//! their count. Each architecture's kernel is built with frame pointers and no unwind tables,
//! and without frame pointers with `.eh_frame`, so each unwinding method is the only one that
//! works on one of the builds. Beside them: the ELF file of another architecture than the
//! stub's, and a stub that ignores interrupts.

#![cfg(target_os = "linux")]

mod common;
mod qemu;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use common::*;
use qemu::{
    assert_split, count, describe, vcpus_of_folded, Arch, Kernel, Qemu, Stacks, Stub, Window,
};

/// Stacks that must reach the entry (`_start` → `kmain`/`ap_main` → `work_loop`); a stop
/// on a function's first instructions can still hide a caller from a frame-pointer walk.
const MIN_COMPLETE: f64 = 0.95;
/// Rounds per run, and their rate.
const ROUNDS: u64 = 1500;
const HZ: &str = "150";

/// Samples vCPUs `cpus` of the `kernel` build of `arch` for [`ROUNDS`] rounds into folded
/// stacks; returns each vCPU's stacks (root first, without the vCPU), the kernel's measure
/// over the same time, and the looks left out as stale (a vCPU the host left without time
/// since the round before).
fn sample(arch: Arch, kernel: Kernel, cpus: &[u32]) -> (BTreeMap<u32, Stacks>, Window, u64) {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot_arch(arch, kernel, 2, Stub::Tcp, dir.path());
    let path = kernel.path_for(arch);
    let mut window = Window::open(&qemu.serial, 2);
    let out = dir.path().join("guest.folded");
    let rounds = ROUNDS.to_string();
    let mask = format!("{:#x}", cpus.iter().map(|c| 1u32 << c).sum::<u32>());
    let run = stackscope(
        dir.path(),
        [
            "gdb",
            "--remote",
            &qemu.remote,
            "--kernel",
            path.to_str().unwrap(),
            "--samples",
            &rounds,
            "-F",
            HZ,
            // The split at a set rate is checked here, not the pacing: no slowdown limit,
            // so that a loaded host's pauses do not refuse the rate.
            "--max-slowdown",
            "100",
            "--cpu-mask",
            &mask,
            "-o",
            out.to_str().unwrap(),
        ],
    );
    run.assert_ok();
    window.close();
    let text = std::fs::read_to_string(&out).expect("the profile was written");
    (vcpus_of_folded(&text), window, gdb_stale_looks(&run))
}

/// Samples vCPUs `cpus` of `kernel` of `arch` and checks the split against the kernel's
/// measure, and that the stacks reach each vCPU's entry.
fn assert_split_and_stacks(arch: Arch, kernel: Kernel, cpus: &[u32]) {
    let (vcpus, window, stale) = sample(arch, kernel, cpus);
    assert_eq!(
        vcpus.keys().copied().collect::<Vec<_>>(),
        cpus,
        "one thread per vCPU"
    );
    for (cpu, stacks) in &vcpus {
        let total = count(stacks, |_| true);
        assert!(total <= ROUNDS, "vCPU {cpu}: at most one sample per round");
        let entry = if *cpu == 0 { "kmain" } else { "ap_main" };
        let complete = count(stacks, |f| {
            f.len() >= 3 && f[0] == "_start" && f[1] == entry && f.iter().any(|n| n == "work_loop")
        });
        assert!(
            complete as f64 >= MIN_COMPLETE * total as f64,
            "{arch:?} {kernel:?} vCPU {cpu}: only {complete} of {total} stacks go _start;{entry};work_loop\n{}",
            describe(stacks)
        );
    }
    let all: Stacks = vcpus.values().flatten().cloned().collect();
    assert_eq!(
        count(&all, |_| true) + stale,
        ROUNDS * cpus.len() as u64,
        "each round's look at each vCPU was counted or left out as stale"
    );
    assert_split(&format!("{arch:?} {kernel:?}"), &all, &window.truth(cpus));
}

#[test]
fn riscv64_frame_pointer_kernel() {
    assert_split_and_stacks(Arch::Riscv64, Kernel::FramePointers, &[0, 1]);
}

#[test]
fn riscv64_cfi_kernel() {
    assert_split_and_stacks(Arch::Riscv64, Kernel::Cfi, &[0, 1]);
}

#[test]
fn aarch64_frame_pointer_kernel() {
    assert_split_and_stacks(Arch::Aarch64, Kernel::FramePointers, &[0, 1]);
}

#[test]
fn aarch64_cfi_kernel() {
    assert_split_and_stacks(Arch::Aarch64, Kernel::Cfi, &[0, 1]);
}

#[test]
fn aarch64_cpu_mask_selects_vcpu1() {
    assert_split_and_stacks(Arch::Aarch64, Kernel::Cfi, &[1]);
}

#[test]
fn an_elf_file_of_another_architecture_is_one_clear_error() {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot_arch(Arch::Riscv64, Kernel::Cfi, 2, Stub::Tcp, dir.path());
    let x86 = Kernel::Cfi.path_for(Arch::X86_64);
    let out = dir.path().join("guest.folded");
    let run = stackscope(
        dir.path(),
        [
            "gdb",
            "--remote",
            &qemu.remote,
            "--kernel",
            x86.to_str().unwrap(),
            "--samples",
            "10",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        !run.status.success(),
        "stackscope sampled a riscv64 guest with an x86-64 ELF file"
    );
    let errors: Vec<&str> = run.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{}", run.stderr);
    for part in ["x86-64", "riscv:rv64", &qemu.remote] {
        assert!(
            errors[0].contains(part),
            "the error does not name {part}: {}",
            errors[0]
        );
    }
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn an_elf_file_of_an_unknown_architecture_is_one_clear_error() {
    let dir = tempdir();
    let source = dir.path().join("f.c");
    std::fs::write(&source, "int f(void) { return 1; }\n").unwrap();
    let object = dir.path().join("f.o");
    stackscope_testkit::run(
        Command::new("clang")
            .args(["--target=powerpc64le-linux-gnu", "-c", "-o"])
            .arg(&object)
            .arg(&source),
    );
    // Refused before any stub is asked: nothing listens on port 1.
    let run = stackscope(
        dir.path(),
        [
            "gdb",
            "--remote",
            "127.0.0.1:1",
            "--kernel",
            object.to_str().unwrap(),
        ],
    );
    assert!(!run.status.success());
    let line = run.stderr.trim();
    assert!(
        !line.contains('\n')
            && line.contains("ppc64")
            && line.contains("x86-64, riscv64 and aarch64"),
        "one line naming the file's architecture and the known ones:\n{}",
        run.stderr
    );
}

#[test]
fn a_stub_that_ignores_interrupts_is_said_to() {
    let _serial = serial();
    let dir = tempdir();
    let program = workload("spin");
    // QEMU's user-mode stub runs the program on `c` and never answers an interrupt.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let stub = Command::new("qemu-x86_64")
        .args(["-g", &port.to_string()])
        .arg(&program)
        .stdout(Stdio::null())
        .spawn()
        .expect("cannot start qemu-x86_64 (scripts/install-deps.sh installs qemu-user)");
    let _stub = stackscope_testkit::Running(stub);
    let remote = format!("127.0.0.1:{port}");
    // Not by connecting: the stub serves one connection only.
    wait_until("qemu-x86_64 listens", || listening(port).then_some(()));
    let out = dir.path().join("prog.folded");
    let run = stackscope(
        dir.path(),
        [
            "gdb",
            "--remote",
            &remote,
            "--kernel",
            program.to_str().unwrap(),
            "--timeout",
            "2",
            "-d",
            "10",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        !run.status.success(),
        "an empty profile is a failure:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("did not stop the target within")
            && run.stderr.contains("ignores interrupts"),
        "stackscope does not say that the stub ignores interrupts:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("within 2 s"),
        "the wait is bounded by --timeout (2 s), not the duration (10 s):\n{}",
        run.stderr
    );
}

/// True when a socket listens on loopback TCP `port` (a `0A` state in /proc/net/tcp).
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "0A"
    })
}
