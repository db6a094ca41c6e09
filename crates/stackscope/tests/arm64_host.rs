//! stackscope on an aarch64 Linux host: Debian's own arm64 kernel booted under
//! `qemu-system-aarch64 -machine virt -cpu max` (software emulation), its initramfs made here
//! from Debian's arm64 packages (`tests/arm64/image.sh`), holding the cross-built stackscope
//! (`target/aarch64-unknown-linux-gnu/release/stackscope`, which .ci/run builds with
//! scripts/aarch64.sh before the tests) and the split workload cross-built without frame
//! pointers, once plain and once with pointer authentication (`-mbranch-protection=standard`:
//! its return addresses are signed, as `-cpu max` does, and its unwind rules say where).
//! Inside, `stackscope record` samples each with the perf source and with the eBPF backend
//! (its unwinder following the aarch64 rules built from `.eh_frame`), and counts the calls of a
//! function with a uprobe; what it printed, the profiles and what the workload measured of
//! itself come back over the serial console. Each profile must say which source sampled, hold
//! the split the program measured within its sample-count tolerance, and have at least 99% of
//! its stacks reach their entry, and of those in the workload's functions through `main`; the
//! uprobe's count must be the number of calls, each stack through `main`.

#![cfg(target_os = "linux")]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{read_json, share_of, top_stacks, workloads_src};
use stackscope_profile::{FrameKind, Profile};
use stackscope_stacks::table::ENTRY_POINTS;
use stackscope_testkit::truth::Truth;
use stackscope_testkit::{compile, run};

/// Rounds of the split workload and their mean slice: slices ten times its default, since
/// each reads the thread's CPU clock, a system call that emulation makes as slow as a short
/// slice; a fortieth of its rounds, so about a quarter of its work, which emulation slows
/// several times over.
const ROUNDS: &str = "50";
const SLICE: &str = "1500000";

/// The sampling rate in the guest: what an emulated CPU's stackscope keeps up with, so that no
/// sample is lost to a full ring buffer.
const RATE: &str = "250";

/// Calls of func_a the uprobe counts (the split workload's rounds), and their short slice.
const UPROBE_CALLS: &str = "300";
const UPROBE_SLICE: &str = "3000";

/// Booting and all recordings under software emulation on a loaded two-core machine; past
/// this the guest is taken as hung.
const DEADLINE: Duration = Duration::from_secs(900);

/// The workloads the guest records, each built by aarch64-linux-gnu-gcc with these flags.
const WORKLOADS: [(&str, &[&str]); 2] = [
    ("split", &["-O2", "-fomit-frame-pointer"]),
    (
        "split_pac",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-mbranch-protection=standard",
        ],
    ),
];

/// The cross-built stackscope, or a one-line reason the test cannot run.
fn cross_built_stackscope() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory holds tmp")
        .to_path_buf();
    let exe = target.join("aarch64-unknown-linux-gnu/release/stackscope");
    assert!(
        exe.is_file(),
        "no cross-built stackscope at {}: build it with scripts/check.sh's build-aarch64 step \
         (cargo build --release --target aarch64-unknown-linux-gnu -p stackscope --bin \
         stackscope, with the cross linker it names), as .ci/run does before the tests",
        exe.display()
    );
    exe
}

/// The kernel and base initramfs, made (or kept) by `tests/arm64/image.sh`.
fn base_image() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("arm64-host");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/arm64/image.sh");
    run(Command::new("bash").arg(script).arg(&dir));
    dir
}

/// The guest's init: records each workload and prints what came of it between markers.
fn init_script() -> String {
    let mut script = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         mount -t tmpfs tmp /tmp\n",
    );
    for (name, _) in WORKLOADS {
        script.push_str(&format!(
            "/stackscope record --backend perf -F {RATE} --format json -o /tmp/{name}.json -- \
             /{name} {ROUNDS} /tmp/{name}.truth {SLICE} >/tmp/{name}.log 2>&1\n\
             echo \"==status {name} $?\"\n\
             for part in log json truth; do\n\
             echo \"==begin {name}.$part\"; cat /tmp/{name}.$part; echo; echo \"==end\"\n\
             done\n"
        ));
    }
    script.push_str(&bpf_script());
    script.push_str("poweroff -f\n");
    script
}

/// The eBPF backend's part of the guest's init: each workload recorded by it (results as
/// `NAME.bpf.log` and so on), then func_a's calls counted by a uprobe (`uprobe.log`, ...).
fn bpf_script() -> String {
    let mut script = String::new();
    let mut record = |name: &str, run: String| {
        script.push_str(&format!(
            "{run} >/tmp/{name}.log 2>&1\n\
             echo \"==status {name} $?\"\n\
             for part in log json truth; do\n\
             echo \"==begin {name}.$part\"; cat /tmp/{name}.$part; echo; echo \"==end\"\n\
             done\n"
        ));
    };
    for (workload, _) in WORKLOADS {
        let name = format!("{workload}.bpf");
        record(
            &name,
            format!(
                "/stackscope record --backend bpf -F {RATE} --format json -o /tmp/{name}.json \
                 -- /{workload} {ROUNDS} /tmp/{name}.truth {SLICE}"
            ),
        );
    }
    record(
        "uprobe",
        format!(
            "/stackscope record --event uprobe:/split:func_a --format json -o /tmp/uprobe.json \
             -- /split {UPROBE_CALLS} /tmp/uprobe.truth {UPROBE_SLICE}"
        ),
    );
    script
}

/// The initramfs: the base, then a second archive (the kernel reads them one after the
/// other) holding stackscope, the workloads and the init script.
fn initramfs(dir: &Path, base: &Path) -> PathBuf {
    let extra = dir.join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    // Without its debug info: a quarter of the size, read into the guest's memory at boot.
    run(Command::new("aarch64-linux-gnu-strip")
        .arg("-o")
        .arg(extra.join("stackscope"))
        .arg(cross_built_stackscope()));
    let source = std::fs::read_to_string(workloads_src().join("split.c")).unwrap();
    for (name, flags) in WORKLOADS {
        let built = compile(
            "aarch64-linux-gnu-gcc",
            dir,
            ("split.c", &source),
            flags,
            &[],
            name,
        );
        std::fs::copy(built, extra.join(name)).unwrap();
    }
    let init = extra.join("init");
    std::fs::write(&init, init_script()).unwrap();
    run(Command::new("chmod").arg("755").arg(&init));
    let cpio = dir.join("extra.cpio");
    let listing = Command::new("sh")
        .arg("-c")
        .arg("find . | cpio -o -H newc --quiet")
        .current_dir(&extra)
        .output()
        .expect("cpio runs");
    assert!(listing.status.success(), "cpio failed");
    std::fs::write(&cpio, listing.stdout).unwrap();
    let mut whole = std::fs::read(base.join("base.cpio")).unwrap();
    whole.extend(std::fs::read(&cpio).unwrap());
    let initrd = dir.join("initrd");
    std::fs::write(&initrd, whole).unwrap();
    initrd
}

/// Boots the machine and returns what it wrote to its console until it powered off.
fn boot(base: &Path, initrd: &Path) -> String {
    let mut qemu = Command::new("qemu-system-aarch64")
        .args([
            "-machine",
            "virt",
            "-cpu",
            "max,pauth-impdef=on",
            "-smp",
            "2",
        ])
        .args(["-m", "1024", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(base.join("Image"))
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyAMA0 quiet panic=-1 kpti=off mitigations=off",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-aarch64 runs (apt qemu-system-arm)");
    let mut stdout = qemu.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stdout.read_to_end(&mut text);
        String::from_utf8_lossy(&text).replace('\r', "")
    });
    let start = Instant::now();
    while qemu.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            let _ = qemu.kill();
            let _ = qemu.wait();
            panic!(
                "the arm64 guest did not power off within {DEADLINE:?}:\n{}",
                reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    reader.join().unwrap()
}

/// The text between `==begin NAME` and the next `==end` in the console's output.
fn part<'a>(console: &'a str, name: &str) -> &'a str {
    let begin = format!("==begin {name}\n");
    let start = console
        .find(&begin)
        .unwrap_or_else(|| panic!("the guest printed no {name}:\n{console}"))
        + begin.len();
    let end = console[start..]
        .find("\n==end")
        .unwrap_or_else(|| panic!("{name} is cut short:\n{console}"));
    &console[start..start + end]
}

/// Of the user stacks in func_a or func_b, the share whose outermost frame is an entry and
/// that pass through main.
fn hot_through_main(profile: &Profile) -> f64 {
    let (mut hot, mut rooted) = (0, 0);
    for sample in &profile.samples {
        let frames: Vec<_> = profile.stack_frames(sample.stack).collect();
        if !frames
            .iter()
            .any(|f| f.name == "func_a" || f.name == "func_b")
        {
            continue;
        }
        hot += sample.count;
        let entry = frames[0].kind == FrameKind::User
            && ENTRY_POINTS.contains(&frames[0].name.as_str())
            && frames.iter().any(|f| f.name == "main");
        if entry {
            rooted += sample.count;
        }
    }
    rooted as f64 / hot.max(1) as f64
}

/// One recording of the split workload in the guest (its parts named `NAME.log` and so on):
/// recorded by the source `source` names, the split within its tolerance, whole stacks.
fn assert_split_recording(console: &str, dir: &Path, name: &str, source: &str) {
    let log = part(console, &format!("{name}.log"));
    assert!(
        console.contains(&format!("==status {name} 0\n")),
        "stackscope record of {name} failed in the guest:\n{log}"
    );
    assert!(
        log.contains(&format!("sampled with {source}")),
        "the summary does not say {source} sampled {name}:\n{log}"
    );
    let json = dir.join(format!("{name}.json"));
    std::fs::write(&json, part(console, &format!("{name}.json"))).unwrap();
    let profile = read_json(&json);
    let truth_file = dir.join(format!("{name}.truth"));
    std::fs::write(&truth_file, part(console, &format!("{name}.truth"))).unwrap();
    let truth = Truth::read(&truth_file);
    let total = profile.total_samples();
    assert!(total >= 200, "{name}: only {total} samples\n{log}");
    truth.assert_matches(
        total,
        |function| share_of(&profile, function),
        || format!("{name}:\n{log}\n{}", top_stacks(&profile, 6)),
    );
    // The walk's verdict: the dynamic loader's samples before main (slow under emulation)
    // end at its stripped entry, named by address; the workload's own reach main.
    let unwind = &profile.meta.unwind;
    let whole = unwind.complete as f64 / unwind.user_stacks.max(1) as f64;
    let hot = hot_through_main(&profile);
    assert!(
        whole >= 0.99 && hot >= 0.99,
        "{name}: {:.1}% of stacks reach their entry, {:.1}% of those in func_a and func_b \
         through main\n{log}\n{}",
        whole * 100.0,
        hot * 100.0,
        top_stacks(&profile, 6)
    );
}

/// The uprobe on func_a counted each of its calls, each stack from func_a's first
/// instruction (its return address still in x30) through main to an entry.
fn assert_uprobe_count(console: &str, dir: &Path) {
    let log = part(console, "uprobe.log");
    assert!(
        console.contains("==status uprobe 0\n"),
        "stackscope record --event uprobe failed in the guest:\n{log}"
    );
    let json = dir.join("uprobe.json");
    std::fs::write(&json, part(console, "uprobe.json")).unwrap();
    let profile = read_json(&json);
    let calls: u64 = UPROBE_CALLS.parse().unwrap();
    assert_eq!(
        profile.total_samples(),
        calls,
        "func_a's calls counted by the uprobe:\n{log}\n{}",
        top_stacks(&profile, 6)
    );
    assert_eq!(
        hot_through_main(&profile),
        1.0,
        "every hit of func_a reaches an entry through main:\n{}",
        top_stacks(&profile, 6)
    );
}

#[test]
fn record_on_an_arm64_kernel_gives_the_split_and_whole_stacks_with_each_backend_also_through_pac_signed_code(
) {
    // First, so that a missing build is the one line said.
    cross_built_stackscope();
    let dir = tempfile::tempdir().unwrap();
    let base = base_image();
    let initrd = initramfs(dir.path(), &base);
    let console = boot(&base, &initrd);
    for (name, _) in WORKLOADS {
        assert_split_recording(&console, dir.path(), name, "perf_event");
        assert_split_recording(&console, dir.path(), &format!("{name}.bpf"), "eBPF");
    }
    assert_uprobe_count(&console, dir.path());
}
