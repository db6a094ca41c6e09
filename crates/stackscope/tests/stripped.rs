//! Programs as distributions ship them: `stackscope record` on stripped programs built here,
//! whose names come only from MiniDebugInfo, a debug link or a build-id directory, and on a
//! stripped library whose static functions no source names, which come out as two
//! `module+address` frames in every output and in `report perf.data`.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::{Frame, FrameKind, Profile, UNKNOWN};
use stackscope_testkit::shipped::{
    add_debug_link, add_mini_debuginfo, build_id_path, function_address, keep_debug, strip,
};
use std::path::{Path, PathBuf};
use std::process::Command;

const BUILD_ID: &str = "5eed0000aabbccddeeff00112233445566778899";
/// About a second of work on an idle machine.
const ROUNDS: &str = "1500";

/// two_hot.c built with debug info (and `flags`) into `dir/out`.
fn build(dir: &Path, flags: &[&str], out: &str) -> PathBuf {
    let source = std::fs::read_to_string(workloads_src().join("two_hot.c")).unwrap();
    let build_id = format!("-Wl,--build-id=0x{BUILD_ID}");
    let args = [
        &["-O2", "-g", "-fomit-frame-pointer", build_id.as_str()],
        flags,
    ]
    .concat();
    stackscope_testkit::compile("gcc", dir, ("two_hot.c", &source), &args, &[], out)
}

/// The program built, and a stripped copy of it in `dir/bin/two_hot`.
fn stripped_program(dir: &Path) -> (PathBuf, PathBuf) {
    let prog = build(dir, &[], "two_hot-full");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stripped = bin.join("two_hot");
    strip("--strip-all", &prog, &stripped);
    (prog, stripped)
}

/// Records `prog ROUNDS` into JSON with the debug directories `debug_dirs` only.
fn record_stripped(dir: &Path, prog: &Path, debug_dirs: &Path) -> (Run, Profile) {
    let out = dir.join("profile.json");
    let mut cmd = record_command(dir, &out, &[], &[prog.as_os_str(), os(ROUNDS)]);
    cmd.env("STACKSCOPE_DEBUG_FILE_DIRECTORY", debug_dirs);
    let run = run_with_deadline(cmd);
    run.assert_ok();
    (run, read_json(&out))
}

/// Asserts both hot static functions are named leaves of the program's samples, with source
/// lines when `lines`.
fn assert_hot_functions_named(profile: &Profile, lines: bool) {
    for name in ["hot_alpha", "hot_beta"] {
        let leaf = share(profile, |frames| {
            frames.last().is_some_and(|f| f.name == name)
        });
        assert!(leaf > 0.0, "{name} is no leaf\n{}", top_stacks(profile, 6));
        let frame = frame_named(profile, name);
        assert_eq!(frame.module.as_deref(), Some("two_hot"), "{frame:?}");
        if lines {
            frame_with_source(profile, name, "two_hot", "two_hot.c");
        } else {
            assert_eq!(frame.line, None, "{frame:?}");
        }
    }
    assert_no_unknown_user_frames(profile);
}

/// No user frame is `[unknown]`: every address of these programs lies in a known mapping.
fn assert_no_unknown_user_frames(profile: &Profile) {
    let unknown = share(profile, |frames| {
        frames
            .iter()
            .any(|f| f.kind == FrameKind::User && f.name == UNKNOWN)
    });
    assert_eq!(
        unknown,
        0.0,
        "[unknown] user frames\n{}",
        top_stacks(profile, 6)
    );
    assert_eq!(
        profile.meta.unwind.with_unknown, 0,
        "{:?}",
        profile.meta.unwind
    );
}

#[test]
fn symbols_only_in_mini_debuginfo() {
    let _serial = serial();
    let dir = tempdir();
    let (prog, stripped) = stripped_program(dir.path());
    add_mini_debuginfo(&prog, &stripped);
    let (_, profile) = record_stripped(dir.path(), &stripped, &dir.path().join("none"));
    assert_hot_functions_named(&profile, false);
}

#[test]
fn debug_info_only_through_a_debug_link() {
    let _serial = serial();
    let dir = tempdir();
    let (prog, stripped) = stripped_program(dir.path());
    let debug = dir.path().join("bin/two_hot.debug");
    keep_debug(&prog, &debug);
    add_debug_link(&stripped, &debug);
    let (_, profile) = record_stripped(dir.path(), &stripped, &dir.path().join("none"));
    assert_hot_functions_named(&profile, true);
}

#[test]
fn debug_info_only_under_a_build_id_directory() {
    let _serial = serial();
    let dir = tempdir();
    let (prog, stripped) = stripped_program(dir.path());
    let debug_dir = dir.path().join("debug");
    let place = build_id_path(&debug_dir, BUILD_ID);
    std::fs::create_dir_all(place.parent().unwrap()).unwrap();
    keep_debug(&prog, &place);
    // Listed second, as a user adds a directory to the one the system has.
    let dirs = std::env::join_paths([dir.path().join("none"), debug_dir]).unwrap();
    let (_, profile) = record_stripped(dir.path(), &stripped, Path::new(&dirs));
    assert_hot_functions_named(&profile, true);
}

/// The distinct leaf frames of `profile` in `module` that no symbol names, in stacks through main.
fn unnamed_leaves_in<'a>(profile: &'a Profile, module: &str) -> Vec<&'a Frame> {
    let mut leaves: Vec<&Frame> = profile
        .samples
        .iter()
        // The workload's own samples, through main: a sample in the library's start-up or
        // exit code (its constructors and destructors) is not what is asked about.
        .filter(|s| profile.stack_frames(s.stack).any(|f| f.name == "main"))
        .filter_map(|s| profile.stack_frames(s.stack).last())
        .filter(|f| f.module.as_deref() == Some(module))
        .filter(|f| f.name.starts_with(&format!("{module}+0x")))
        .collect();
    leaves.sort_by(|a, b| a.name.cmp(&b.name));
    leaves.dedup();
    leaves
}

#[test]
fn a_stripped_librarys_static_functions_are_two_module_address_frames() {
    let _serial = serial();
    let dir = tempdir();
    let lib = build(
        dir.path(),
        &["-shared", "-fPIC", "-DLIBRARY"],
        "libtwo_hot-full.so",
    );
    let lib_dir = dir.path().join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    strip("--strip-all", &lib, &lib_dir.join("libtwo_hot.so"));
    let main_src = std::fs::read_to_string(workloads_src().join("two_hot_main.c")).unwrap();
    let rpath = format!("-Wl,-rpath,{}", lib_dir.display());
    let libs = [format!("-L{}", lib_dir.display()), "-ltwo_hot".to_string()];
    let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
    let main = stackscope_testkit::compile(
        "gcc",
        dir.path(),
        ("two_hot_main.c", &main_src),
        &["-O2", &rpath],
        &libs,
        "two_hot_main",
    );
    let (run, profile) = record_stripped(dir.path(), &main, &dir.path().join("none"));

    let expected: Vec<String> = ["hot_alpha", "hot_beta"]
        .iter()
        .map(|f| format!("libtwo_hot.so+{:#x}", function_address(&lib, f)))
        .collect();
    let leaves: Vec<&str> = unnamed_leaves_in(&profile, "libtwo_hot.so")
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(leaves, expected, "\n{}", top_stacks(&profile, 6));
    assert_no_unknown_user_frames(&profile);
    let unnamed = profile.meta.unwind.with_unnamed;
    assert!(unnamed > 0, "{:?}", profile.meta.unwind);
    assert!(
        run.stderr
            .contains("with functions named by module+address"),
        "{}",
        run.stderr
    );

    // The same names in another writer, and from perf's recording of the same program.
    let folded = dir.path().join("profile.folded");
    report(dir.path(), &dir.path().join("profile.json"), &folded).assert_ok();
    let text = std::fs::read_to_string(&folded).unwrap();
    for name in &expected {
        assert!(
            text.contains(&format!(";{name} ")),
            "{name} not a leaf in\n{text}"
        );
    }
    let data = perf_record(
        dir.path(),
        &["-F", "999", "--call-graph", "dwarf"],
        &[main.as_os_str(), os("500")],
    );
    let from_perf = dir.path().join("perf.json");
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .env("STACKSCOPE_DEBUG_FILE_DIRECTORY", dir.path().join("none"))
        .args([
            os("report"),
            data.as_os_str(),
            os("-o"),
            from_perf.as_os_str(),
        ]);
    run_with_deadline(cmd).assert_ok();
    let perf_profile = read_json(&from_perf);
    let leaves: Vec<&str> = unnamed_leaves_in(&perf_profile, "libtwo_hot.so")
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(leaves, expected, "\n{}", top_stacks(&perf_profile, 6));
}

/// The entry point `binary`'s ELF header states, as `readelf -h` prints it.
fn entry_point(binary: &Path) -> u64 {
    let out = Command::new("readelf")
        .arg("-h")
        .arg(binary)
        .output()
        .expect("run readelf");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let address = line.trim().strip_prefix("Entry point address:")?.trim();
            u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()
        })
        .unwrap_or_else(|| panic!("no entry point in {}", binary.display()))
}

#[test]
fn a_stripped_programs_stacks_are_whole_from_its_entry_point_with_each_backend() {
    let _serial = serial();
    let dir = tempdir();
    let (_, stripped) = stripped_program(dir.path());
    // No symbol names the program's own functions, `_start` among them: its frame is
    // `two_hot+ENTRY`, which is where every stack of the program starts.
    let start = format!("two_hot+{:#x}", entry_point(&stripped));
    for backend in ["perf", "bpf"] {
        let out = dir.path().join(format!("{backend}.json"));
        let mut cmd = record_command(
            dir.path(),
            &out,
            &["--backend", backend],
            &[stripped.as_os_str(), os(ROUNDS)],
        );
        cmd.env("STACKSCOPE_DEBUG_FILE_DIRECTORY", dir.path().join("none"));
        let run = run_with_deadline(cmd);
        run.assert_ok();
        let profile = read_json(&out);
        let unwind = &profile.meta.unwind;
        let from_start = profile
            .samples
            .iter()
            .filter(|s| {
                let mut user = profile
                    .stack_frames(s.stack)
                    .filter(|f| f.kind == FrameKind::User);
                user.next().is_some_and(|f| f.name == start)
            })
            .map(|s| s.count)
            .sum::<u64>();
        assert!(
            unwind.user_stacks > 0 && from_start as f64 >= 0.99 * unwind.user_stacks as f64,
            "{backend}: {from_start} of {} stacks start at {start}\n{}",
            unwind.user_stacks,
            top_stacks(&profile, 6)
        );
        assert!(
            unwind.complete >= from_start,
            "{backend}: stacks from {start} ({from_start}) not counted complete: {unwind:?}\n{}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("broke off"),
            "{backend}: {}",
            run.stderr
        );
    }
}
