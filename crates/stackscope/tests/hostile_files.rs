//! Files that a profiled process (or any local user) points stackscope at, made hostile: a
//! FIFO, a device or a huge sparse file where a perf map, a debug link's file or a library is
//! expected, and a MiniDebugInfo section that decompresses to far more than any symbol table.
//! stackscope runs as root here, as `record -a` usually does. Each run must end in time with
//! the profile written and its memory bounded, saying in one line what it left unread; and a
//! Ctrl-C while naming must write the profile at once.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_testkit::shipped::{add_debug_link, keep_debug, strip};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Longer than any of these runs takes when nothing hangs (about a second of sampling and
/// its naming), far shorter than a hang or a read of gigabytes.
const IN_TIME: Duration = Duration::from_secs(30);

/// Far above what naming these small programs takes (tens of MiB), far below what reading
/// the hostile files whole would.
const MEMORY: u64 = 512 << 20;

/// Asserts the run ended well and in time, within [`MEMORY`], and that one warning line names
/// `path` as left unread.
fn assert_left_unread(run: &Run, path: &Path) {
    run.assert_ok();
    assert!(run.wall < IN_TIME, "took {:?}\n{}", run.wall, run.stderr);
    assert!(run.peak_kib > 0, "no peak memory measured");
    let peak = run.peak_kib * 1024;
    assert!(peak < MEMORY, "peak RSS {peak} bytes\n{}", run.stderr);
    let name = path.to_string_lossy();
    let warnings: Vec<&str> = run
        .stderr_lines()
        .into_iter()
        .filter(|l| l.starts_with("stackscope: warning: left ") && l.contains(&*name))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "expected one warning naming {name}:\n{}",
        run.stderr
    );
}

#[test]
fn a_perf_map_that_is_a_fifo_a_device_or_huge_is_left_unread_and_the_profile_written() {
    let _serial = serial();
    let prog = workload("jit");
    for instead in ["fifo", "zero", "sparse"] {
        let dir = tempdir();
        let out = dir.path().join("profile.json");
        let run = record(
            dir.path(),
            &out,
            &[],
            &[prog.as_os_str(), os("1500"), os(instead)],
        );
        let pid = run.printed_pid("pid ");
        let map = PerfMap(pid.map(|p| format!("/tmp/perf-{p}.map").into()));
        let path = map.0.clone().expect("the workload printed its pid");
        assert_left_unread(&run, &path);
        let profile = read_json(&out);
        assert_min_samples(&profile, 100);
        // Its JIT code is unnamed, but the program's own frames are.
        assert_share_at_least(&profile, "run_jit", 0.9);
    }
}

/// two_hot.c built with debug info and a build-id, and a stripped copy in `dir/bin/two_hot`.
fn stripped_two_hot(dir: &Path) -> (PathBuf, PathBuf) {
    let source = std::fs::read_to_string(workloads_src().join("two_hot.c")).unwrap();
    let prog = stackscope_testkit::compile(
        "gcc",
        dir,
        ("two_hot.c", &source),
        &["-O2", "-g", "-fomit-frame-pointer", "-Wl,--build-id"],
        &[],
        "two_hot-full",
    );
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stripped = bin.join("two_hot");
    strip("--strip-all", &prog, &stripped);
    (prog, stripped)
}

/// [`stripped_two_hot`] with a debug link to its debug file, which is in the second place gdb
/// looks (`.debug/` beside the binary); and the first place, left empty for the test.
fn stripped_two_hot_with_debug_link(dir: &Path) -> (PathBuf, PathBuf) {
    let (prog, stripped) = stripped_two_hot(dir);
    let real = dir.join("bin/.debug/two_hot.debug");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    keep_debug(&prog, &real);
    add_debug_link(&stripped, &real);
    (stripped, dir.join("bin/two_hot.debug"))
}

/// `stackscope record` of `prog` (about a second of work) into `dir/profile.json`, with no
/// debug directory but the program's own, and `env` set.
fn record_stripped(dir: &Path, prog: &Path, env: &[(&str, &str)]) -> Run {
    let out = dir.join("profile.json");
    let mut cmd = record_command(dir, &out, &[], &[prog.as_os_str(), os("1500")]);
    cmd.env("STACKSCOPE_DEBUG_FILE_DIRECTORY", dir.join("none"));
    cmd.envs(env.iter().copied());
    run_with_deadline(cmd)
}

fn mkfifo(path: &Path) {
    stackscope_testkit::run(Command::new("mkfifo").arg(path));
}

#[test]
fn a_fifo_where_a_debug_link_points_is_passed_over_for_the_next_place() {
    let _serial = serial();
    let dir = tempdir();
    let (stripped, first_place) = stripped_two_hot_with_debug_link(dir.path());
    let fifo = first_place;
    mkfifo(&fifo);

    let run = record_stripped(dir.path(), &stripped, &[]);
    assert_left_unread(&run, &fifo);
    let profile = read_json(&dir.path().join("profile.json"));
    frame_with_source(&profile, "hot_alpha", "two_hot", "two_hot.c");
    frame_with_source(&profile, "hot_beta", "two_hot", "two_hot.c");
}

/// A sparse file of `size` bytes at `path`.
fn sparse(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

#[test]
fn a_huge_sparse_debug_link_candidate_is_refused_by_its_size_not_read() {
    let _serial = serial();
    let dir = tempdir();
    let (stripped, huge) = stripped_two_hot_with_debug_link(dir.path());
    sparse(&huge, 8 << 30);

    let run = record_stripped(dir.path(), &stripped, &[]);
    assert_left_unread(&run, &huge);
    assert!(
        run.stderr.contains("STACKSCOPE_MAX_BINARY_SIZE"),
        "the warning names the variable that allows more:\n{}",
        run.stderr
    );
    let profile = read_json(&dir.path().join("profile.json"));
    frame_with_source(&profile, "hot_alpha", "two_hot", "two_hot.c");
}

#[test]
fn a_minidebuginfo_bomb_is_refused_before_it_is_decompressed() {
    let _serial = serial();
    let dir = tempdir();
    let (_, stripped) = stripped_two_hot(dir.path());
    // 512 MiB of zeros, xz-compressed to some 80 KB: twice the default bound.
    let bomb = dir.path().join("bomb.xz");
    stackscope_testkit::run(Command::new("sh").arg("-c").arg(format!(
        "head -c 512M /dev/zero | xz -0 -T1 > {}",
        bomb.display()
    )));
    stackscope_testkit::run(
        Command::new("objcopy")
            .arg(format!("--add-section=.gnu_debugdata={}", bomb.display()))
            .arg(&stripped),
    );

    let run = record_stripped(dir.path(), &stripped, &[]);
    assert_left_unread(&run, &stripped);
    assert!(
        run.stderr.contains("MiniDebugInfo"),
        "the warning says what was too large:\n{}",
        run.stderr
    );
    // The program is still profiled, its static functions named by module and address.
    let profile = read_json(&dir.path().join("profile.json"));
    assert_min_samples(&profile, 100);
    assert!(
        share(&profile, |frames| frames
            .iter()
            .any(|f| f.name.starts_with("two_hot+0x")))
            > 0.5,
        "{}",
        top_stacks(&profile, 6)
    );
}

#[test]
fn ctrl_c_while_naming_writes_the_profile_at_once() {
    let _serial = serial();
    let dir = tempdir();
    // A candidate allowed by a raised bound whose CRC takes long to compute: naming is busy
    // with it when the signal comes.
    let (stripped, huge) = stripped_two_hot_with_debug_link(dir.path());
    sparse(&huge, 64 << 30);

    let out = dir.path().join("profile.json");
    let mut cmd = record_command(
        dir.path(),
        &out,
        // The perf source starts at once: the signal lands in naming, not in a start that a
        // loaded machine makes slow.
        &["--backend", "perf", "-d", "1"],
        &[stripped.as_os_str(), os("100000")],
    );
    cmd.env("STACKSCOPE_DEBUG_FILE_DIRECTORY", dir.path().join("none"))
        .env("STACKSCOPE_MAX_BINARY_SIZE", "128G");
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    let pid = child.id() as libc::pid_t;
    // Sampling ends at 1 s; the CRC of 64 GiB of holes takes far longer than the second after.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let signalled = Instant::now();
    let run = wait_output(child, start);
    let after = signalled.elapsed();
    // The duration ended the program with SIGTERM, and its status is stackscope's.
    run.assert_exit(128 + libc::SIGTERM, "the program was ended at the duration");
    assert!(
        after < Duration::from_secs(5),
        "ended {after:?} after the signal\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("naming stopped at the stop signal"),
        "{}",
        run.stderr
    );
    let profile = read_json(&out);
    assert_min_samples(&profile, 100);
}

/// A library `nobody` dlopened, replaced by a FIFO while the program still runs, under root's
/// `record -a`: root's profile is written, in time, and says what it left unread.
#[test]
fn a_library_replaced_by_a_fifo_by_another_user_does_not_cost_a_system_profile() {
    let _serial = serial();
    let dir = tempdir();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    let lib = theirs.join("libhot.so");
    std::fs::copy(workload("libhot.so"), &lib).unwrap();
    let main = theirs.join("dlopen_main");
    std::fs::copy(workload("dlopen_main"), &main).unwrap();
    for path in [dir.path(), &theirs] {
        open_to_others(path);
    }
    stackscope_testkit::run(Command::new("chown").arg("-R").arg("nobody").arg(&theirs));

    let out = dir.path().join("system.json");
    let mut cmd = record_command(dir.path(), &out, &["-a", "-d", "3"], &[]);
    let start = Instant::now();
    let recorder = spawn_piped(&mut cmd);
    std::thread::sleep(Duration::from_millis(500));
    let script = format!(
        "{main} {lib} 1500 & sleep 0.7; rm {lib}; mkfifo {lib}; wait",
        main = main.display(),
        lib = lib.display()
    );
    stackscope_testkit::run(as_nobody("sh").arg("-c").arg(&script));
    let run = wait_output(recorder, start);
    assert!(
        lib.metadata().is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_fifo()
        }),
        "the library was not replaced"
    );
    assert_left_unread(&run, &lib);
    let profile = read_json(&out);
    assert!(
        profile.threads.iter().any(|t| t.comm == "dlopen_main"),
        "the program is not in the profile: {:?}",
        profile.threads.iter().map(|t| &t.comm).collect::<Vec<_>>()
    );
}

/// A JIT run by `nobody` that leaves a FIFO as its perf map, under root's `record -a`.
#[test]
fn a_fifo_perf_map_left_by_another_user_does_not_cost_a_system_profile() {
    let _serial = serial();
    let dir = tempdir();
    open_to_others(dir.path());
    let jit = dir.path().join("jit");
    std::fs::copy(workload("jit"), &jit).unwrap();

    let out = dir.path().join("system.json");
    let mut cmd = record_command(dir.path(), &out, &["-a", "-d", "3"], &[]);
    let start = Instant::now();
    let recorder = spawn_piped(&mut cmd);
    std::thread::sleep(Duration::from_millis(500));
    let theirs = as_nobody(&jit)
        .args(["1000", "fifo"])
        .output()
        .expect("run the JIT as nobody");
    let pid: Option<u32> = String::from_utf8_lossy(&theirs.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("pid ")?.trim().parse().ok());
    let map = PerfMap(pid.map(|p| format!("/tmp/perf-{p}.map").into()));
    assert!(theirs.status.success(), "{theirs:?}");
    let run = wait_output(recorder, start);
    assert_left_unread(&run, map.0.as_ref().unwrap());
    let profile = read_json(&out);
    assert!(
        profile.threads.iter().any(|t| Some(t.pid) == pid),
        "the JIT is not in the profile"
    );
}

/// A program that keeps its DWARF and also has a debug link to a FIFO (blazesym, which reads
/// the DWARF, would follow the link itself): its DWARF is left unread, its symbols name it.
#[test]
fn a_fifo_where_a_program_with_dwarf_links_is_not_followed() {
    let _serial = serial();
    let dir = tempdir();
    let (prog, _) = stripped_two_hot(dir.path());
    let bin = dir.path().join("bin/two_hot");
    std::fs::copy(&prog, &bin).unwrap();
    let real = dir.path().join("two_hot.dbg");
    keep_debug(&prog, &real);
    add_debug_link(&bin, &real);
    let fifo = dir.path().join("bin/two_hot.dbg");
    mkfifo(&fifo);

    let run = record_stripped(dir.path(), &bin, &[]);
    assert_left_unread(&run, &fifo);
    let profile = read_json(&dir.path().join("profile.json"));
    assert!(
        share_of(&profile, "hot_alpha") > 0.0,
        "{}",
        top_stacks(&profile, 6)
    );
}

/// A perf.data whose program was replaced by a FIFO after the recording: `report` names the
/// rest, and says what it left unread.
#[test]
fn report_of_a_perf_data_whose_program_is_now_a_fifo_ends_with_its_profile() {
    let _serial = serial();
    let dir = tempdir();
    let (prog, _) = stripped_two_hot(dir.path());
    let data = perf_record(dir.path(), &["-g"], &[prog.as_os_str(), os("500")]);
    std::fs::remove_file(&prog).unwrap();
    mkfifo(&prog);
    let out = dir.path().join("out.json");
    let run = report(dir.path(), &data, &out);
    assert_left_unread(&run, &prog);
    assert_min_samples(&read_json(&out), 100);
}

/// `stackscope gdb --kernel FIFO` is refused at once, naming the FIFO, before any connection.
#[test]
fn gdb_with_a_fifo_as_its_kernel_is_refused_at_once() {
    let _serial = serial();
    let dir = tempdir();
    let fifo = dir.path().join("kernel");
    mkfifo(&fifo);
    let run = stackscope(
        dir.path(),
        [
            os("gdb"),
            os("--remote"),
            os("127.0.0.1:1"),
            os("--kernel"),
            fifo.as_os_str(),
            os("-o"),
            os("g.svg"),
        ],
    );
    assert_eq!(run.code(), Some(1), "{}", run.stderr);
    assert!(run.wall < Duration::from_secs(10), "took {:?}", run.wall);
    assert!(
        run.stderr.contains("a FIFO, not a regular file"),
        "{}",
        run.stderr
    );
}
