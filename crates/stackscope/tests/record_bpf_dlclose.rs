//! Code that is unmapped before the recording ends is named as it was mapped when sampled: a
//! library opened with dlopen, where the program spends most of its time, and closed with
//! dlclose well before the end, with each backend; and with the eBPF backend across the
//! whole system (-a), the same program, which exits before the recording ends.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::Profile;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the library named by argv[1] for 1.5 s of CPU, closes it, checks it is gone from its
/// maps (exit 3 if not), then burns 0.4 s more in `after_close`.
const DLCLOSE_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
volatile unsigned long sink;
static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noipa)) void after_close(double secs) {
    double start = cpu();
    while (cpu() - start < secs) sink++;
}
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    unsigned long (*hot)(unsigned long, unsigned long) =
        (unsigned long (*)(unsigned long, unsigned long))dlsym(lib, "lib_hot_function");
    if (!hot) return 1;
    unsigned long s = 1;
    double start = cpu();
    while (cpu() - start < 1.5) s = hot(300000UL, s) + 1;
    sink = s;
    if (dlclose(lib)) return 1;
    char line[512];
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "libhot")) return 3;
    after_close(0.4);
    return 0;
}
"#;

fn dlclose_main(dir: &Path) -> PathBuf {
    stackscope_testkit::compile(
        "gcc",
        dir,
        ("dlclose_main.c", DLCLOSE_C),
        &["-O2", "-g"],
        &["-ldl"],
        "dlclose_main",
    )
}

/// Asserts the samples of `pid` (all, when `None`) name every frame in the closed library
/// (no `[unknown]` between the leaf and main), that the program ran on after closing it, and
/// that at least `whole` percent of them reach main.
fn assert_library_named(profile: &Profile, pid: Option<u32>, whole: u64) {
    let mine: Vec<_> = profile
        .samples
        .iter()
        .filter(|s| pid.is_none_or(|pid| profile.thread(s.thread).pid == pid))
        .map(|s| (profile.stack_frames(s.stack).collect::<Vec<_>>(), s.count))
        .collect();
    let total: u64 = mine.iter().map(|s| s.1).sum();
    let count = |pred: &dyn Fn(&[&stackscope_profile::Frame]) -> bool| -> u64 {
        mine.iter().filter(|s| pred(&s.0)).map(|s| s.1).sum()
    };
    let in_lib = count(&|frames| {
        frames
            .iter()
            .any(|f| f.name == "lib_hot_function" && f.module.as_deref() == Some("libhot.so"))
    });
    let unnamed = count(&|frames| {
        has_frame(frames, "main") && frames.iter().any(|f| f.name.contains("[unknown]"))
    });
    let closed = count(&|frames| has_frame(frames, "after_close"));
    let main = count(&|frames| has_frame(frames, "main"));
    let top = top_stacks(profile, 6);
    eprintln!("{total} samples: {in_lib} in the library, {closed} after closing it, {main} reach main, {unnamed} unnamed");
    assert!(total >= 400, "{total} samples of the program\n{top}");
    // 1.5 s of CPU in the library and 0.4 s after: about 79% and 21%.
    assert!(
        in_lib * 100 >= total * 60,
        "lib_hot_function (libhot.so) in {in_lib} of {total} samples\n{top}"
    );
    assert!(
        closed * 100 >= total * 8,
        "after_close in {closed} of {total}\n{top}"
    );
    assert!(
        unnamed * 200 <= total,
        "[unknown] under main in {unnamed} of {total}\n{top}"
    );
    assert!(
        main * 100 >= total * whole,
        "main in {main} of {total}\n{top}"
    );
}

#[test]
fn closed_library_is_named_with_each_backend() {
    let _serial = serial();
    let dir = tempdir();
    let prog = dlclose_main(dir.path());
    let lib = workload("libhot.so");
    for backend in ["perf", "bpf"] {
        let (_, profile) = record_json(
            dir.path(),
            &["--backend", backend],
            &[prog.as_os_str(), lib.as_os_str()],
        );
        eprintln!("--backend {backend}");
        assert_library_named(&profile, None, 99);
    }
}

#[test]
fn closed_library_of_an_exited_process_is_named_across_the_system() {
    let _serial = serial();
    let dir = tempdir();
    let prog = dlclose_main(dir.path());
    let lib = workload("libhot.so");
    let out = dir.path().join("system.json");
    let log = dir.path().join("stderr.txt");
    // Sampling starts before the program and ends after it has exited, at Ctrl-C.
    let mut recorder = record_command(dir.path(), &out, &["--backend", "bpf", "-a"], &[]);
    let recorder = recorder
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .expect("spawn stackscope");
    let recorder = Background(recorder);
    wait_until("stackscope to announce sampling", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("stackscope: sampling").then_some(())
    });
    let program = Command::new(&prog)
        .arg(&lib)
        .status()
        .expect("run the program");
    assert_eq!(program.code(), Some(0), "the program failed");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(recorder.pid() as i32, libc::SIGINT) };
    let mut recorder = recorder;
    // Naming the whole system's samples may take a while on a loaded machine.
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = recorder.0.try_wait().expect("wait for stackscope") {
            break status;
        }
        assert!(
            stopped.elapsed() < DEADLINE,
            "stackscope did not stop at Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "stackscope failed: {stderr}");
    let profile = read_json(&out);
    let pid = profile
        .threads
        .iter()
        .find(|t| t.comm == "dlclose_main")
        .map(|t| t.pid)
        .unwrap_or_else(|| panic!("no dlclose_main among the threads sampled\n{stderr}"));
    // A process met across the system is walked by frame pointers, which this program lacks,
    // until user space has loaded its tables, after those of every process sampled before
    // it: on a busy machine a good part of its samples stop short of main. Naming is what
    // this test is about.
    assert_library_named(&profile, Some(pid), 0);
}
