//! `cargo stackscope` on small cargo projects written into temporary directories (no
//! dependencies, offline, their own target directory): what it builds, what it profiles,
//! what it writes, and what reaches the program and comes back from it.
//!
//! Each program burns a fixed amount of its own thread's CPU time (the scheduler's count in
//! /proc/thread-self/schedstat) in a named function, so the function's samples do not depend
//! on how loaded the machine is; the checks are that it is named and holds most samples.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// CPU time each program burns in its named function.
const BURN_MS: u64 = 300;

/// A program whose `burner` runs until its thread has used [`BURN_MS`] of CPU, through an
/// always-inlined `mix` (a frame of its own only where debug info describes the inlining).
/// It prints its arguments joined by `|` and exits with the number after `--exit`, if any.
fn program(burner: &str) -> String {
    format!(
        r#"use std::hint::black_box;

fn cpu_ns() -> u64 {{
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    stat.split_whitespace().next().unwrap().parse().unwrap()
}}

#[inline(always)]
fn mix(x: u64, i: u64) -> u64 {{
    (x ^ (x >> 7)).wrapping_mul(6364136223846793005).wrapping_add(i)
}}

#[inline(never)]
fn {burner}(until_ns: u64) -> u64 {{
    let mut x = 1u64;
    while cpu_ns() < until_ns {{
        for i in 0..100_000u64 {{
            x = black_box(mix(x, i));
        }}
    }}
    x
}}

fn main() {{
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("args: {{}}", args.join("|"));
    black_box({burner}(cpu_ns() + {BURN_MS}_000_000));
    let code = args.iter().position(|a| a == "--exit").map_or(0, |i| args[i + 1].parse().unwrap());
    std::process::exit(code);
}}
"#
    )
}

/// A package named `name` in a fresh temporary directory: its manifest (with `manifest_extra`
/// appended) and `files` (path, content).
fn project(name: &str, manifest_extra: &str, files: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempdir();
    let manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n{manifest_extra}"
    );
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    for (path, content) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    dir
}

/// `cargo stackscope ARGS` in `project`, called as cargo calls it, building into the
/// project's own target directory without the network.
fn cargo_stackscope(project: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cargo-stackscope"));
    cmd.arg("stackscope")
        .args(args)
        .current_dir(project)
        .env("CARGO_TARGET_DIR", project.join("target"))
        .env("CARGO_NET_OFFLINE", "true");
    run_with_deadline(cmd)
}

/// Samples the flamegraph gives `name` (summed over its boxes), and all its samples.
fn svg_samples(svg: &Path, name: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(svg)
        .unwrap_or_else(|e| panic!("{} was not written: {e}", svg.display()));
    let titles: Vec<(&str, u64)> = text
        .split("<title>")
        .skip(1)
        .filter_map(|t| {
            let (frame, rest) = t.split_once(" (")?;
            Some((frame, rest.split_once(" samples")?.0.parse().ok()?))
        })
        .collect();
    let all = titles.iter().find(|(f, _)| *f == "all").map(|t| t.1);
    let named = titles.iter().filter(|(f, _)| *f == name).map(|t| t.1).sum();
    (named, all.expect("the flamegraph has no `all` box"))
}

/// Asserts that `name` holds at least `min` of the flamegraph's samples.
fn assert_svg_share(svg: &Path, name: &str, min: f64) {
    let (named, all) = svg_samples(svg, name);
    assert!(
        all > 0 && named as f64 >= min * all as f64,
        "{name} holds {named} of {all} samples in {}, expected at least {:.0}%",
        svg.display(),
        min * 100.0
    );
}

#[test]
fn release_by_default_with_debug_info_into_flame_svg_as_record_names_it() {
    // strip = true would leave no names at all: cargo stackscope must undo it for the build.
    let manifest_extra = "[profile.release]\nstrip = true\n";
    let dir = project("demo", manifest_extra, &[("src/main.rs", program("burn"))]);
    let manifest = std::fs::read(dir.path().join("Cargo.toml")).unwrap();

    let run = cargo_stackscope(dir.path(), &[]);
    run.assert_ok();
    assert!(
        run.stderr.contains("/target/release/demo"),
        "not the release build was profiled:\n{}",
        run.stderr
    );
    let svg = dir.path().join("flame.svg");
    // Each burn round is almost all of the program's CPU time; the inlined helper is named
    // only from the debug info cargo stackscope asked for.
    assert_svg_share(&svg, "demo::burn", 0.8);
    assert_svg_share(&svg, "demo::main", 0.8);
    assert_svg_share(&svg, "demo::mix", 0.3);
    assert_eq!(
        std::fs::read(dir.path().join("Cargo.toml")).unwrap(),
        manifest,
        "the manifest was edited"
    );
}

#[test]
fn dev_profile_and_output_path() {
    let dir = project("demo", "", &[("src/main.rs", program("burn_dev"))]);
    let run = cargo_stackscope(dir.path(), &["--dev", "-o", "dev.svg"]);
    run.assert_ok();
    assert!(
        run.stderr.contains("/target/debug/demo"),
        "not the dev build was profiled:\n{}",
        run.stderr
    );
    assert_svg_share(&dir.path().join("dev.svg"), "demo::burn_dev", 0.8);
    assert!(!dir.path().join("flame.svg").exists());
}

/// A package `pair` with two binaries, `alpha` and `beta`, each burning in its own function.
fn pair(manifest_extra: &str) -> tempfile::TempDir {
    let files = [
        ("src/bin/alpha.rs", program("alpha_burn")),
        ("src/bin/beta.rs", program("beta_burn")),
    ];
    project("pair", manifest_extra, &files)
}

/// Asserts that the flamegraph at `svg` is of `beta` alone.
fn assert_beta_alone(svg: &Path) {
    assert_svg_share(svg, "beta::beta_burn", 0.8);
    assert_eq!(svg_samples(svg, "alpha::alpha_burn").0, 0);
}

#[test]
fn several_binaries_need_bin_and_get_the_one_chosen() {
    let dir = pair("");

    let run = cargo_stackscope(dir.path(), &[]);
    assert_eq!(run.code(), Some(1), "stderr:\n{}", run.stderr);
    let last = run.stderr_lines().last().copied().unwrap_or_default();
    assert!(
        last.starts_with("stackscope: error: ")
            && last.contains("--bin")
            && last.contains("alpha, beta"),
        "expected one line listing the binaries, got:\n{}",
        run.stderr
    );
    assert!(!dir.path().join("flame.svg").exists());

    cargo_stackscope(dir.path(), &["--bin", "beta"]).assert_ok();
    assert_beta_alone(&dir.path().join("flame.svg"));
}

#[test]
fn example_target() {
    let files = [
        ("src/main.rs", program("main_burn")),
        ("examples/walkthrough.rs", program("example_burn")),
    ];
    let dir = project("demo", "", &files);
    let run = cargo_stackscope(dir.path(), &["--example", "walkthrough", "-o", "ex.svg"]);
    run.assert_ok();
    let svg = dir.path().join("ex.svg");
    assert_svg_share(&svg, "walkthrough::example_burn", 0.8);
    assert_eq!(svg_samples(&svg, "demo::main_burn").0, 0);
}

#[test]
fn build_error_is_cargos_and_nothing_is_profiled() {
    let broken = "fn main() {\n    let n: u32 = \"not a number\";\n    println!(\"{n}\");\n}\n";
    let dir = project("broken", "", &[("src/main.rs", broken.to_string())]);
    let run = cargo_stackscope(dir.path(), &[]);
    assert!(
        !run.status.success() && run.stderr.contains("error[E0308]"),
        "expected cargo's type error and a failure, got {:?}:\n{}",
        run.status,
        run.stderr
    );
    assert!(
        run.stderr.contains("nothing was profiled"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("sampling"), "{}", run.stderr);
    assert!(!dir.path().join("flame.svg").exists());
}

#[test]
fn program_arguments_reach_it_and_its_exit_code_comes_back() {
    let dir = project("demo", "", &[("src/main.rs", program("burn"))]);
    let run = cargo_stackscope(
        dir.path(),
        &["-F", "499", "--", "--exit", "7", "two words", "-o", "x"],
    );
    run.assert_exit(7, "the program's own");
    assert!(
        run.stdout.contains("args: --exit|7|two words|-o|x\n"),
        "the program's arguments did not reach it:\n{}",
        run.stdout
    );
    assert_svg_share(&dir.path().join("flame.svg"), "demo::burn", 0.8);
}

#[test]
fn default_run_picks_among_several_binaries() {
    let dir = pair("default-run = \"beta\"\n");
    cargo_stackscope(dir.path(), &[]).assert_ok();
    assert_beta_alone(&dir.path().join("flame.svg"));
}

#[test]
fn bench_target_runs_with_bench_as_cargo_bench_runs_it() {
    let files = [
        ("src/main.rs", program("main_burn")),
        ("benches/throughput.rs", program("bench_burn")),
    ];
    let manifest_extra = "[[bench]]\nname = \"throughput\"\nharness = false\n";
    let dir = project("demo", manifest_extra, &files);
    let run = cargo_stackscope(dir.path(), &["--bench", "throughput", "--", "large"]);
    run.assert_ok();
    assert!(
        run.stdout.contains("args: --bench|large\n"),
        "the bench did not get --bench before its arguments:\n{}",
        run.stdout
    );
    assert_svg_share(&dir.path().join("flame.svg"), "throughput::bench_burn", 0.8);
}
