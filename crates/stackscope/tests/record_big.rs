//! Whole stacks on a large program, with each backend: `big_deep` (a Rust program, 205
//! levels of recursion of 8 KiB frames on a thread with a 64 MiB stack, far more than any
//! stack copy holds) calls every level through a generated shared object with thousands of
//! functions and a large `.eh_frame`. At least 99% of the stacks must reach their thread's
//! entry, and the summary must call complete exactly the stacks whose outermost frame is an
//! entry, as read back from the written profile.

#![cfg(target_os = "linux")]

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use stackscope_profile::{FrameKind, Profile};
use stackscope_stacks::table::ENTRY_POINTS;

/// Functions of the generated shared object.
const FUNCTIONS: usize = 12_000;

/// C source of `libbigeh.so`: `FUNCTIONS` functions that each call `next` back with a level
/// and a seed mixed its own way (so each is code of its own, with an unwind entry of its
/// own), and `bigeh_pass(level)`, which picks one per level.
fn bigeh_source() -> String {
    let mut c = String::from(
        "typedef unsigned long (*next_fn)(long, unsigned long);\n\
         typedef unsigned long (*pass_fn)(next_fn, long, unsigned long);\n",
    );
    for k in 0..FUNCTIONS {
        // `volatile` keeps a stack slot, so each function has a frame and the CFI for it;
        // using the result after the call keeps the call from being a tail call.
        let _ = writeln!(
            c,
            "__attribute__((noinline)) unsigned long bigeh_{k}(next_fn next, long level, unsigned long seed) \
             {{ volatile unsigned long mix = seed * {m}UL + {k}UL; unsigned long r = next(level + 1, mix); \
             return r ^ (mix >> {s}); }}",
            m = 2 * k + 1,
            s = k % 13 + 1,
        );
    }
    c.push_str("static const pass_fn passes[] = {\n");
    for k in 0..FUNCTIONS {
        let _ = writeln!(c, "bigeh_{k},");
    }
    c.push_str(
        "};\n\
         pass_fn bigeh_pass(long level) { return passes[(level * 7919) % (long)(sizeof passes / sizeof passes[0])]; }\n",
    );
    c
}

/// Size in bytes of `section` in the ELF file `path`, from binutils' `size -A`.
fn section_size(path: &Path, section: &str) -> u64 {
    let out = Command::new("size")
        .arg("-A")
        .arg(path)
        .output()
        .expect("run size -A");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(section)).then(|| fields.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {section} in {}:\n{text}", path.display()))
}

/// `big_deep`, built once for every test of this file (the library's 12,000 functions take
/// gcc a while), under the target directory's scratch space.
fn big_deep() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("record-big");
        std::fs::create_dir_all(&dir).expect("create the build directory");
        build(&dir)
    })
}

/// Builds `libbigeh.so` and `big_deep` into `dir`; returns the program.
fn build(dir: &Path) -> PathBuf {
    let lib = stackscope_testkit::compile(
        "gcc",
        dir,
        ("bigeh.c", &bigeh_source()),
        &["-O2", "-g", "-shared", "-fPIC", "-fomit-frame-pointer"],
        &[],
        "libbigeh.so",
    );
    let eh_frame = section_size(&lib, ".eh_frame");
    assert!(
        eh_frame >= 256 << 10,
        "libbigeh.so's .eh_frame is only {eh_frame} bytes"
    );
    let exe = dir.join("big_deep");
    stackscope_testkit::run(
        Command::new("rustc")
            .args(["-C", "opt-level=3", "-C", "debuginfo=1"])
            .args(["-C", "force-frame-pointers=no"])
            .arg("-L")
            .arg(dir)
            .arg(format!("-Clink-args=-Wl,-rpath,{}", dir.display()))
            .arg(workloads_src().join("big_deep.rs"))
            .arg("-o")
            .arg(&exe),
    );
    exe
}

/// Samples with a user stack, and those whose outermost frame is an entry, read from the
/// profile's stacks.
fn rooted(profile: &Profile) -> (u64, u64) {
    let (mut user, mut rooted) = (0, 0);
    for sample in &profile.samples {
        let frames: Vec<_> = profile.stack_frames(sample.stack).collect();
        if !frames.iter().any(|f| f.kind != FrameKind::Kernel) {
            continue;
        }
        user += sample.count;
        let root = frames[0];
        if root.kind == FrameKind::User && ENTRY_POINTS.contains(&root.name.as_str()) {
            rooted += sample.count;
        }
    }
    (user, rooted)
}

/// Records `big_deep` with `options`, checks its stacks; returns stackscope's stderr.
fn whole_stacks_with(options: &[&str]) -> String {
    let _serial = serial();
    let exe = big_deep();
    let dir = tempdir();
    let (run, profile) = record_json(dir.path(), options, &[exe.as_os_str(), os("25")]);
    eprintln!("{}", run.stderr);
    assert_min_samples(&profile, 1000);

    let (user, rooted) = rooted(&profile);
    let unwind = &profile.meta.unwind;
    assert_eq!(
        (unwind.user_stacks, unwind.complete),
        (user, rooted),
        "the summary's user stacks and complete ones differ from the profile's stacks and \
         those whose outermost frame is an entry\n{}",
        top_stacks(&profile, 4)
    );
    let share = rooted as f64 / user as f64;
    assert!(
        share >= 0.99,
        "only {:.1}% of stacks reach their entry\n{}",
        share * 100.0,
        top_stacks(&profile, 4)
    );
    // The stacks are as deep as the program makes them: some pass every level.
    let deepest = profile
        .samples
        .iter()
        .map(|s| {
            profile
                .stack_frames(s.stack)
                .filter(|f| f.name == "big_deep::descend")
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        deepest > 200,
        "the deepest stack holds {deepest} levels of descend"
    );
    let through_lib = share_of_module(&profile, "libbigeh.so");
    assert!(
        through_lib >= 0.9,
        "only {:.1}% of stacks pass through libbigeh.so",
        through_lib * 100.0
    );
    run.stderr
}

/// Share of samples with a frame of `module`.
fn share_of_module(profile: &Profile, module: &str) -> f64 {
    share(profile, |frames| {
        frames.iter().any(|f| f.module.as_deref() == Some(module))
    })
}

#[test]
fn deep_stacks_of_big_frames_reach_their_entry_with_the_perf_source() {
    whole_stacks_with(&["--backend", "perf"]);
}

#[test]
fn deep_stacks_of_big_frames_reach_their_entry_reading_on_the_live_stack() {
    let stderr = whole_stacks_with(&["--read-stack-on"]);
    let read_on: u64 = stderr
        .split(" were walked on over the live thread's stack")
        .next()
        .and_then(|head| head.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        read_on > 0,
        "no stack was walked on over the live thread's memory:\n{stderr}"
    );
}

#[test]
fn deep_stacks_of_big_frames_reach_their_entry_with_the_bpf_backend() {
    whole_stacks_with(&["--backend", "bpf"]);
}
