//! The BPF source end to end on real programs (needs root, BTF and kernel >= 5.17): a C program
//! without frame pointers launched by the recorder, and a syscall-heavy one for kernel stacks.

#![cfg(target_os = "linux")]

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

use stackscope_bpf::{record, BpfConfig, Rate};
use stackscope_process::target::Target;
use stackscope_profile::{FrameKind, Profile};
use stackscope_stacks::{Recording, SourceFigures};
use stackscope_testkit::truth::Truth;

/// One BPF recording at a time: they share the machine's CPUs and the tests count samples.
static SERIAL: Mutex<()> = Mutex::new(());

/// stackscope's split workload: func_a and func_b burn CPU about 30/70 under main, and
/// measure the CPU time each takes (`split [ROUNDS [TRUTH_FILE]]`).
const SPLIT_C: &str = include_str!("../../stackscope/tests/workloads/split.c");

/// write(2) to /dev/null in a loop: most time is in the kernel.
const WRITER_C: &str = r#"
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
int main(void) {
    int fd = open("/dev/null", O_WRONLY);
    static char buf[65536];
    time_t start = time(0);
    while (time(0) - start < 2) write(fd, buf, sizeof buf);
    return 0;
}
"#;

/// A library the program opens with dlopen once it runs, and calls into for most of its time.
const HOT_LIB_C: &str = r#"
volatile unsigned long hot_sink;
__attribute__((noinline)) static unsigned long churn(unsigned long x) {
    for (int i = 0; i < 5000; i++) x = x * 2862933555777941757UL + 3037000493UL;
    return x;
}
void hot(unsigned long n) {
    unsigned long x = n;
    for (unsigned long i = 0; i < n; i++) x = churn(x);
    hot_sink = x;
}
"#;

const DLOPEN_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*hot)(unsigned long) = (void (*)(unsigned long))dlsym(lib, "hot");
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        hot(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 2);
    return 0;
}
"#;

/// Waits for a line on stdin, then forks a child that burns CPU while the parent waits.
const FORKER_C: &str = r#"
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void child_work(void) {
    time_t start = time(0);
    unsigned long x = 1;
    while (time(0) - start < 2)
        for (int i = 0; i < 100000; i++) x = x * 6364136223846793005UL + 1;
    sink = x;
}
int main(void) {
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 1;
    pid_t pid = fork();
    if (pid == 0) { child_work(); return 0; }
    int status;
    waitpid(pid, &status, 0);
    return 0;
}
"#;

fn build(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    stackscope_testkit::compile(
        "gcc",
        dir,
        (&format!("{name}.c"), text),
        &["-O2", "-g", "-fomit-frame-pointer"],
        &[],
        name,
    )
}

fn run(config: BpfConfig) -> Recording {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let stop = AtomicBool::new(false);
    record(config, &stop, || {}).expect("BPF recording failed")
}

/// Records as [`run`] does a command that `config` launches, which must exit 0.
fn run_launched(config: BpfConfig) -> Recording {
    let rec = run(config);
    assert!(
        rec.exit_status.is_some_and(|s| s.success()),
        "the launched command did not exit 0: {:?}",
        rec.exit_status
    );
    rec
}

/// Samples whose stack holds a frame for which `pred` holds.
fn samples_with(profile: &Profile, pred: impl Fn(&stackscope_profile::Frame) -> bool) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| {
            profile
                .stack(s.stack)
                .frames
                .iter()
                .any(|&f| pred(profile.frame(f)))
        })
        .map(|s| s.count)
        .sum()
}

/// The most sampled stacks, root first, for failure messages.
fn top_stacks(profile: &Profile) -> String {
    let mut samples: Vec<_> = profile.samples.iter().collect();
    samples.sort_by_key(|s| std::cmp::Reverse(s.count));
    samples
        .iter()
        .take(6)
        .map(|s| {
            let names: Vec<&str> = profile
                .stack(s.stack)
                .frames
                .iter()
                .map(|&f| profile.frame(f).name.as_str())
                .collect();
            format!("\n  {} {}", names.join(";"), s.count)
        })
        .collect()
}

fn total(profile: &Profile) -> u64 {
    profile.samples.iter().map(|s| s.count).sum()
}

#[test]
fn launched_command_without_frame_pointers_unwinds_to_main() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "split", SPLIT_C);
    let truth_file = dir.path().join("split.truth");
    let config = BpfConfig::new(
        Target::Command(vec![exe.into(), "4000".into(), truth_file.clone().into()]),
        Rate::Frequency(499),
    );
    let rec = run_launched(config);
    let profile = &rec.profile;
    let all = total(profile);
    assert!(all >= 200, "only {all} samples in 2 s of CPU at 499 Hz");
    let in_split = samples_with(profile, |f| f.name == "func_a" || f.name == "func_b");
    assert!(
        in_split * 10 >= all * 8,
        "{in_split} of {all} samples in func_a/func_b:{}",
        top_stacks(profile)
    );
    let main = samples_with(profile, |f| f.name == "main");
    assert!(
        main * 100 >= in_split * 99,
        "{main} of {in_split} samples in func_a/func_b unwound to main:{}",
        top_stacks(profile)
    );
    let missed = match &rec.figures {
        Some(SourceFigures::Bpf(figures)) => Some(figures.storage.missed_stacks),
        _ => None,
    };
    assert_eq!(missed, Some(0));
    Truth::read(&truth_file).assert_matches(
        all,
        |name| samples_with(profile, |f| f.name == name) as f64 / all as f64,
        || top_stacks(profile),
    );
}

#[test]
fn syscall_heavy_workload_has_kernel_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "writer", WRITER_C);
    let mut config = BpfConfig::new(Target::Command(vec![exe.into()]), Rate::Frequency(499));
    config.duration = Some(Duration::from_secs(30));
    let rec = run(config);
    let profile = &rec.profile;
    let all = total(profile);
    assert!(all >= 100, "only {all} samples");
    let kernel = samples_with(profile, |f| f.kind == FrameKind::Kernel);
    assert!(
        kernel * 2 >= all,
        "{kernel} of {all} samples have kernel frames:{}",
        top_stacks(profile)
    );
    let write = samples_with(profile, |f| {
        f.kind == FrameKind::Kernel && f.name.contains("write")
    });
    // Much of a write(2) to /dev/null is syscall entry and exit, outside any write function.
    assert!(
        write * 10 >= all,
        "{write} of {all} samples in a kernel write function:{}",
        top_stacks(profile)
    );
    // The user side of those samples still reaches main.
    let main = samples_with(profile, |f| f.name == "main");
    assert!(main * 10 >= all * 9, "{main} of {all} samples reach main");
    assert!(profile.threads.iter().all(|t| t.comm == "writer"));
}

#[test]
fn library_opened_later_is_unwound_from_its_first_samples() {
    let dir = tempfile::tempdir().unwrap();
    let lib = stackscope_testkit::compile(
        "gcc",
        dir.path(),
        ("hot.c", HOT_LIB_C),
        &["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC"],
        &[],
        "libhot.so",
    );
    let exe = stackscope_testkit::compile(
        "gcc",
        dir.path(),
        ("dlopen.c", DLOPEN_C),
        &["-O2", "-g", "-fomit-frame-pointer"],
        &["-ldl"],
        "dlopener",
    );
    let config = BpfConfig::new(
        Target::Command(vec![exe.into(), lib.into()]),
        Rate::Frequency(499),
    );
    let rec = run_launched(config);
    let profile = &rec.profile;
    let hot = samples_with(profile, |f| f.name == "churn" || f.name == "hot");
    assert!(
        hot >= 200,
        "only {hot} samples in the library:{}",
        top_stacks(profile)
    );
    let whole = samples_with(profile, |f| f.name == "main");
    let all = total(profile);
    assert!(
        whole * 100 >= all * 99,
        "{whole} of {all} samples unwound to main:{}",
        top_stacks(profile)
    );
}

#[test]
fn tables_the_kernel_cannot_hold_are_said_with_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "split", SPLIT_C);
    // Room for one file's tables: the program's own (mapped lowest, loaded first), not
    // libc's, the dynamic loader's nor the vDSO's.
    let config = BpfConfig {
        table_files: 1,
        ..BpfConfig::new(
            Target::Command(vec![exe.into(), "300".into()]),
            Rate::Frequency(499),
        )
    };
    let rec = run_launched(config);
    let said: Vec<&str> = rec
        .hints
        .iter()
        .filter_map(|h| match h {
            stackscope_stacks::Hint::Said(s) if s.contains("unwind tables of") => Some(s.as_str()),
            _ => None,
        })
        .collect();
    let [hint] = said[..] else {
        panic!("no one hint on tables left out: {:?}", rec.hints);
    };
    // "the unwind tables of N files (M rows) could not be loaded into the kernel (...)".
    let number_after = |word: &str| -> usize {
        let at = hint
            .find(word)
            .unwrap_or_else(|| panic!("no {word:?} in {hint}"))
            + word.len();
        hint[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count after {word:?} in {hint}"))
    };
    assert!(number_after("unwind tables of ") >= 2, "{hint}");
    assert!(
        number_after("files (") > 1000,
        "libc alone has thousands of rows: {hint}"
    );
    assert!(hint.contains("at most 1 files"), "{hint}");
    assert!(hint.contains("libc"), "{hint}");
}

#[test]
fn attached_process_is_followed_into_the_children_it_forks() {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "forker", FORKER_C);
    let mut parent = Command::new(&exe)
        .stdin(Stdio::piped())
        .spawn()
        .expect("cannot start the test program");
    let parent_pid = parent.id();
    let mut stdin = parent.stdin.take().unwrap();
    let mut config = BpfConfig::new(Target::Pids(vec![parent_pid]), Rate::Frequency(499));
    config.duration = Some(Duration::from_secs(60));
    // The fork happens only once sampling runs.
    let rec = {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let stop = AtomicBool::new(false);
        record(config, &stop, || {
            stdin.write_all(b"go\n").unwrap();
        })
    };
    let status = parent.wait().unwrap();
    let rec = rec.expect("BPF recording failed");
    assert!(status.success());
    let profile = &rec.profile;
    let in_child: u64 = profile
        .samples
        .iter()
        .filter(|s| profile.threads[s.thread as usize].pid != parent_pid)
        .map(|s| s.count)
        .sum();
    let work = samples_with(profile, |f| f.name == "child_work");
    assert!(
        in_child >= 200,
        "{in_child} samples of the child:{}",
        top_stacks(profile)
    );
    assert!(
        work * 10 >= in_child * 9,
        "{work} of {in_child} child samples in child_work"
    );
    let whole = samples_with(profile, |f| f.name == "main");
    assert!(
        whole * 100 >= total(profile) * 95,
        "{whole} of {} samples reach main:{}",
        total(profile),
        top_stacks(profile)
    );
}
