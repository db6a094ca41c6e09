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
//!
//! `stackscope profile -adf` (bcc's whole-system folded text, counted in the kernel) samples
//! the split workload for a window whose split the program measured, and `record --off-cpu`
//! times the blocking workload's sleeps, each stack through main into the kernel's scheduler.
//!
//! In the same boot Debian's arm64 `perf record --call-graph dwarf` (user registers and stack
//! copies) records the PAC-signed split, and stackscope reports that perf.data inside; the
//! file, the folded stacks and the binaries perf kept in its build-id cache come back, and this
//! host's stackscope must read the same folded stacks from the file, with the split and whole
//! stacks: the file's registers, not the host, say how to walk it.

#![cfg(target_os = "linux")]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    account_pairs, assert_split_folded, counts_where, parse_folded, read_json, run_with_deadline,
    share_of, stackscope_bin, top_folded, top_stacks, user_names, workloads_src,
};
use stackscope_profile::{Frame, FrameKind, Profile};
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

/// The sampling window of `profile -adf`, in seconds, and the split's rounds: more than it
/// runs in the window and the eBPF program's load before it, so that it is killed after.
const PROFILE_SECS: &str = "12";
const PROFILE_ROUNDS: &str = "1000";

/// The blocking workload's rounds of `record --off-cpu`: each five sleeps of 100 µs in
/// short_nap() and one of 30 ms in long_nap().
const OFF_CPU_ROUNDS: &str = "10";

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
    script.push_str(&profile_and_off_cpu_commands());
    script.push_str(&perf_data_commands());
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

/// The guest's commands for `profile -adf` and `record --off-cpu`. The split runs while
/// bcc's command line samples the whole system; its truth file is read just before stackscope
/// starts and just after it ends (`profile.before`, `profile.after`). The blocking workload
/// prints its own account of its sleeps (`offcpu.out`).
fn profile_and_off_cpu_commands() -> String {
    format!(
        "/split {PROFILE_ROUNDS} /tmp/profile.truth {SLICE} >/dev/null &
         split=$!
         while [ ! -s /tmp/profile.truth ]; do sleep 1; done
         cp /tmp/profile.truth /tmp/profile.before
         /stackscope profile -adf -F {RATE} {PROFILE_SECS} >/tmp/profile.folded 2>/tmp/profile.log
         echo \"==status profile $?\"
         cp /tmp/profile.truth /tmp/profile.after
         kill $split; wait $split
         for part in log folded before after; do
         echo \"==begin profile.$part\"; cat /tmp/profile.$part; echo; echo \"==end\"
         done
         /stackscope record --off-cpu --format json -o /tmp/offcpu.json --          /blocking blocks {OFF_CPU_ROUNDS} 100 30000 5000 >/tmp/offcpu.out 2>/tmp/offcpu.log
         echo \"==status offcpu $?\"
         for part in log json out; do
         echo \"==begin offcpu.$part\"; cat /tmp/offcpu.$part; echo; echo \"==end\"
         done
"
    )
}

/// The initramfs: the base and perf, then an archive (the kernel reads them one after the
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
    let source = std::fs::read_to_string(workloads_src().join("blocking.c")).unwrap();
    let flags = ["-O2", "-fomit-frame-pointer"];
    let built = compile(
        "aarch64-linux-gnu-gcc",
        dir,
        ("blocking.c", &source),
        &flags,
        &[],
        "blocking",
    );
    std::fs::copy(built, extra.join("blocking")).unwrap();
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
    whole.extend(std::fs::read(base.join("perf.cpio")).unwrap());
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

/// What one boot of the guest left: the directory its inputs were made in (kept for the
/// checks' files) and its console's output.
struct GuestRun {
    dir: PathBuf,
    console: String,
}

/// The one boot every check of this file reads, made by the first that asks; a boot that
/// failed is that failure for each.
fn guest_run() -> &'static GuestRun {
    static RUN: OnceLock<Result<GuestRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::panic::catch_unwind(|| {
            // First, so that a missing build is the one line said.
            cross_built_stackscope();
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("arm64-host-run");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let base = base_image();
            let initrd = initramfs(&dir, &base);
            let console = boot(&base, &initrd);
            GuestRun { dir, console }
        })
        .map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the guest run panicked".into())
        })
    });
    match run {
        Ok(run) => run,
        Err(why) => panic!("{why}"),
    }
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
    let GuestRun { dir, console } = guest_run();
    for (name, _) in WORKLOADS {
        assert_split_recording(console, dir, name, "perf_event");
        assert_split_recording(console, dir, &format!("{name}.bpf"), "eBPF");
    }
    assert_uprobe_count(console, dir);
}

#[test]
fn profile_adf_on_an_arm64_kernel_gives_the_split_with_kernel_frames_annotated_and_delimited() {
    let GuestRun { dir, console } = guest_run();
    let log = part(console, "profile.log");
    assert!(
        console.contains("==status profile 0\n"),
        "stackscope profile -adf failed in the guest:\n{log}"
    );
    let folded = part(console, "profile.folded");
    let lines: Vec<(Vec<String>, u64)> = parse_folded(folded)
        .into_iter()
        .filter(|(frames, _)| frames[0] == "split")
        .collect();
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        total >= 200,
        "only {total} samples of split:\n{log}\n{folded}"
    );
    let (before, after) = (dir.join("profile.before"), dir.join("profile.after"));
    std::fs::write(&before, part(console, "profile.before")).unwrap();
    std::fs::write(&after, part(console, "profile.after")).unwrap();
    let truth = Truth::read(&after).since(&Truth::read(&before));
    assert_split_folded(&lines, &truth);
    // For the whole system, a process's tables go into the kernel once it is first sampled
    // without them; its samples until then are walked by frame pointers, which this workload
    // does not keep: from func_a or func_b straight to the caller of main that keeps them.
    // Those are the only stacks allowed to miss main, and they end early in the window: a
    // tenth of a second on a quiet host, half a second under load (emulation slows with it),
    // so at most a tenth of the window's samples.
    let frame_pointer_chain = |frames: &[String]| {
        let root: Vec<&str> = frames[1..].iter().take(3).map(String::as_str).collect();
        root == ["_start", "__libc_start_main", "func_a"]
            || root == ["_start", "__libc_start_main", "func_b"]
    };
    let (mut through_main, mut chains) = (0, 0);
    for (frames, count) in &lines {
        if frames.iter().any(|f| f == "main") {
            through_main += count;
        } else if frame_pointer_chain(frames) {
            chains += count;
        }
    }
    assert!(
        through_main + chains == total && chains * 10 <= total,
        "{through_main} of split's {total} stacks pass through main, {chains} are walked by \
         frame pointers before its tables were in (at most a tenth allowed)\n{}",
        top_folded(&lines, 8)
    );
    // -a marks kernel frames `_[k]`; -d puts `-` between the user and the kernel frames of a
    // stack that has both: a stack with one kind only has no delimiter.
    for (frames, _) in parse_folded(folded) {
        let kernel = |f: &[String]| f.iter().filter(|f| f.ends_with("_[k]")).count();
        let stack = &frames[1..];
        let laid_out = match stack.iter().position(|f| f == "-") {
            Some(d) => kernel(&stack[..d]) == 0 && kernel(&stack[d + 1..]) == stack.len() - d - 1,
            None => kernel(stack) == 0 || kernel(stack) == stack.len(),
        };
        assert!(
            laid_out,
            "kernel frames are not after the one delimiter, each annotated: {}",
            frames.join(";")
        );
    }
    assert!(
        folded
            .lines()
            .any(|l| l.contains(";-;") && l.contains("_[k]")),
        "no stack of the whole system holds kernel frames after the delimiter:\n{folded}"
    );
}

#[test]
fn off_cpu_on_an_arm64_kernel_times_each_sleep_through_main_into_the_scheduler() {
    let GuestRun { dir, console } = guest_run();
    let log = part(console, "offcpu.log");
    assert!(
        console.contains("==status offcpu 0\n"),
        "stackscope record --off-cpu failed in the guest:\n{log}"
    );
    let json = dir.join("offcpu.json");
    std::fs::write(&json, part(console, "offcpu.json")).unwrap();
    let profile = read_json(&json);
    let top = top_stacks(&profile, 6);
    assert_eq!(profile.meta.event, "off-cpu", "{log}");
    let out = part(console, "offcpu.out");
    let measured_us = account_pairs(out.trim().lines().last().unwrap_or_default())
        .into_iter()
        .find(|(name, _)| name == "long")
        .unwrap_or_else(|| panic!("blocking printed no account of its long sleeps: {out:?}"))
        .1
        / 1000;
    let micros = |pred: &dyn Fn(&[&Frame]) -> bool| counts_where(&profile, pred);
    let long = micros(&|f| user_names(f).contains(&"long_nap"));
    let whole = micros(&|f| {
        user_names(f).windows(2).any(|w| w == ["main", "long_nap"])
            && f.iter()
                .any(|f| f.kind == FrameKind::Kernel && f.name == "schedule")
    });
    assert!(long > 0, "no time off the CPU in long_nap:\n{log}\n{top}");
    assert_eq!(
        whole, long,
        "long_nap's time is under main and the sleep's call into the scheduler:\n{top}"
    );
    assert!(
        long <= measured_us + 1000 && long * 10 >= measured_us * 9,
        "long_nap off the CPU {long} µs, the program measured {measured_us} µs asleep:\n{top}"
    );
}

/// The workload perf records in the guest: PAC-signed, so the host's walk of the file meets
/// signed return addresses and the rules that say where they are signed.
const PERF_WORKLOAD: &str = "split_pac";

/// The guest's commands for the perf.data check: Debian's perf records the workload on its
/// default event, the emulated CPU's `cycles`, with DWARF call graphs (perf's default copy of
/// 8192 stack bytes a sample). Not `cpu-clock`: on a CPU with SVE (`-cpu max`) perf 6.1 asks
/// for the VG register with the user registers, which only the CPU's own PMU gives, and the
/// kernel refuses a software event that (EOPNOTSUPP). perf keeps the binaries
/// its samples hit in its build-id cache as it does on any machine (`$HOME/.debug`, less the
/// copy of the kernel's symbols, which this check does not read); stackscope reports the file
/// to folded stacks there. The file and the cache come back gzipped in base64.
fn perf_data_commands() -> String {
    format!(
        "mkdir -p /tmp/home\n\
         HOME=/tmp/home /usr/bin/perf record -F {RATE} --call-graph dwarf -o /tmp/perf.data \
         -- /{PERF_WORKLOAD} {ROUNDS} /tmp/perf.truth {SLICE} >/tmp/perf.log 2>&1\n\
         echo \"==status perf $?\"\n\
         /stackscope report /tmp/perf.data --annotate-kernel --no-debuginfod -o /tmp/perf.folded \
         >>/tmp/perf.log 2>&1\n\
         echo \"==status perf-report $?\"\n\
         rm -rf '/tmp/home/.debug/[kernel.kallsyms]'\n\
         for part in log truth folded; do\n\
         echo \"==begin perf.$part\"; cat /tmp/perf.$part; echo; echo \"==end\"\n\
         done\n\
         echo '==begin perf.data'; gzip -c /tmp/perf.data | base64; echo '==end'\n\
         echo '==begin perf.cache'; tar -cz -C /tmp/home .debug | base64; echo '==end'\n"
    )
}

/// Writes the base64 text of part `name` of the console, gunzipped, to `out`.
fn unpack_part(console: &str, name: &str, out: &Path) {
    let encoded = out.with_extension("b64");
    std::fs::write(&encoded, part(console, name)).unwrap();
    run(Command::new("sh")
        .arg("-c")
        .arg("base64 -d \"$0\" | gzip -d > \"$1\"")
        .arg(&encoded)
        .arg(out));
}

/// Folded lines with kernel frames (`_[k]`, from `--annotate-kernel`) left out, by stack: a
/// kernel's frames are named from the running kernel, which on this host is not the guest's.
fn user_folded(text: &str) -> BTreeMap<String, u64> {
    let mut stacks = BTreeMap::new();
    for (frames, count) in parse_folded(text) {
        let user: Vec<&str> = frames
            .iter()
            .map(String::as_str)
            .filter(|f| !f.ends_with("_[k]"))
            .collect();
        *stacks.entry(user.join(";")).or_default() += count;
    }
    stacks
}

/// The lines of two foldings that differ, each with its count on either side.
fn folded_difference(inside: &BTreeMap<String, u64>, here: &BTreeMap<String, u64>) -> String {
    let mut text = String::new();
    for stack in inside
        .keys()
        .chain(here.keys().filter(|k| !inside.contains_key(*k)))
    {
        let (a, b) = (inside.get(stack), here.get(stack));
        if a != b {
            text.push_str(&format!("  guest {a:?} here {b:?}: {stack}\n"));
        }
    }
    text
}

#[test]
fn perf_data_recorded_on_arm64_reads_on_this_host_as_inside_the_guest() {
    let GuestRun { dir, console } = guest_run();
    let log = part(console, "perf.log");
    assert!(
        console.contains("==status perf 0\n"),
        "perf record failed in the guest:\n{log}"
    );
    assert!(
        console.contains("==status perf-report 0\n"),
        "stackscope report of perf's file failed in the guest:\n{log}"
    );
    let data = dir.join("perf.data");
    unpack_part(console, "perf.data", &data);
    let cache = dir.join("perf-cache.tar");
    unpack_part(console, "perf.cache", &cache);
    // perf's build-id cache, as `perf archive` carries it to another machine: the guest's
    // binaries are found there by the build-ids the file's header lists.
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&cache)
        .arg("-C")
        .arg(&home));
    let report = |out: &str| {
        let out = dir.join(out);
        let mut cmd = Command::new(stackscope_bin());
        cmd.env("HOME", &home)
            .arg("report")
            .arg(&data)
            .args(["--annotate-kernel", "--no-debuginfod", "-o"])
            .arg(&out);
        run_with_deadline(cmd).assert_ok();
        out
    };
    let inside = part(console, "perf.folded");
    let here = std::fs::read_to_string(report("perf.folded")).unwrap();
    let (inside, here) = (user_folded(inside), user_folded(&here));
    assert!(
        inside == here,
        "the folded stacks read here differ from those read in the guest:\n{}",
        folded_difference(&inside, &here)
    );
    let lines: Vec<(Vec<String>, u64)> = here
        .iter()
        .filter(|(stack, _)| stack.starts_with(&format!("{PERF_WORKLOAD};")))
        .map(|(stack, count)| (stack.split(';').map(str::to_string).collect(), *count))
        .collect();
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        total >= 200,
        "only {total} samples of {PERF_WORKLOAD}\n{log}"
    );
    let truth_file = dir.join("perf.truth");
    std::fs::write(&truth_file, part(console, "perf.truth")).unwrap();
    assert_split_folded(&lines, &Truth::read(&truth_file));
    let profile = read_json(&report("perf.json"));
    // Of the stacks the kernel copied: it copies none of perf's child in execve, before the
    // workload runs (`perf-exec`, its stack already gone).
    let unwind = &profile.meta.unwind;
    let copied = unwind.user_stacks - unwind.unreadable;
    let whole = unwind.complete as f64 / copied.max(1) as f64;
    let hot = hot_through_main(&profile);
    assert!(
        whole >= 0.99 && hot >= 0.99,
        "{:.1}% of the file's copied stacks reach their entry, {:.1}% of those in func_a and \
         func_b through main\n{log}\n{}",
        whole * 100.0,
        hot * 100.0,
        top_folded(&lines, 8)
    );
}
