//! Where profiles are written, attacked: devices, FIFOs and links are written through and never
//! replaced, a link planted at the temporary's name is never followed, a link, file or FIFO
//! another user planted in a sticky world-writable directory is followed or written only where
//! the kernel would let us, a killed writer leaves no temporary, and an output that cannot be
//! written is refused before any sampling, by every command that records.
//!
//! And what is written, attacked: a process's name and a frame's name holding a terminal
//! escape, control characters, NUL, XML's specials and folded's separators go through every
//! writer to files their readers parse (an XML parser, a JSON parser, `go tool pprof`,
//! `stackscope report`), and `stackscope diff`'s two-count folded output is refused by
//! `report` rather than misread.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::{Frame, Metadata, ProfileBuilder, Thread};

/// A small saved profile to re-render, and the folded text `report` makes of it.
fn small_input(dir: &Path) -> (PathBuf, &'static str) {
    let input = dir.join("in.folded");
    let text = "prog;main;work 5\n";
    std::fs::write(&input, text).unwrap();
    (input, text)
}

/// `stackscope report INPUT -o OUT --format folded` in `dir`.
fn report_folded(dir: &Path, input: &Path, out: &Path) -> Run {
    stackscope(
        dir,
        [
            os("report"),
            input.as_os_str(),
            os("-o"),
            out.as_os_str(),
            os("--format"),
            os("folded"),
        ],
    )
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fifo_is_written_in_place_and_kept() {
    let _serial = serial();
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    let fifo = dir.path().join("pipe");
    stackscope_testkit::run(Command::new("mkfifo").arg(&fifo));
    // Opened for reading before stackscope runs and without waiting for a writer; once
    // stackscope has ended, reading gives what it wrote, or nothing if it never opened the FIFO.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // SAFETY: clears O_NONBLOCK on a descriptor this test owns.
    unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, 0) };
    report_folded(dir.path(), &input, &fifo).assert_ok();
    let mut got = String::new();
    reader.read_to_string(&mut got).unwrap();
    assert_eq!(got, text, "the FIFO's reader got other bytes");
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced by a {kind:?}");
    assert_eq!(
        names_in(dir.path()),
        ["in.folded", "pipe"],
        "files left behind"
    );
}

#[test]
fn device_node_stays_a_device() {
    let _serial = serial();
    let dir = tempdir();
    let (input, _) = small_input(dir.path());
    // A private /dev/null (char 1:3), so a failure cannot break the machine's.
    let null = dir.path().join("null");
    stackscope_testkit::run(Command::new("mknod").arg(&null).args(["c", "1", "3"]));
    report_folded(dir.path(), &input, &null).assert_ok();
    let kind = std::fs::symlink_metadata(&null).unwrap().file_type();
    assert!(
        kind.is_char_device(),
        "the device was replaced by a {kind:?}"
    );
    assert_eq!(
        names_in(dir.path()),
        ["in.folded", "null"],
        "files left behind"
    );
}

#[test]
fn stdout_link_is_written_through_and_kept() {
    let _serial = serial();
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    // What /dev/stdout is, in a directory of the test's own.
    let link = dir.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    let run = report_folded(dir.path(), &input, &link);
    run.assert_ok();
    assert_eq!(run.stdout, text, "standard output did not get the profile");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced"
    );
    // With standard output redirected to a file, that file receives the profile.
    let redirected = dir.path().join("redirected");
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args([os("report"), input.as_os_str(), os("-o"), link.as_os_str()])
        .args(["--format", "folded"])
        .stdout(std::fs::File::create(&redirected).unwrap())
        .stderr(Stdio::null());
    assert!(cmd.status().unwrap().success());
    assert_eq!(std::fs::read_to_string(&redirected).unwrap(), text);
}

#[test]
fn link_to_a_regular_file_replaces_the_file_and_keeps_the_link() {
    let _serial = serial();
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    let real = dir.path().join("real.folded");
    std::fs::write(&real, "old\n").unwrap();
    let link = dir.path().join("link.folded");
    std::os::unix::fs::symlink("real.folded", &link).unwrap();
    report_folded(dir.path(), &input, &link).assert_ok();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&real).unwrap(), text);
    // A link to nothing is refused rather than creating the file it names.
    let dangling = dir.path().join("dangling.folded");
    std::os::unix::fs::symlink("nowhere.folded", &dangling).unwrap();
    report_folded(dir.path(), &input, &dangling).assert_one_line_error(&[
        "dangling.folded",
        "nowhere.folded",
        "does not exist",
    ]);
    assert!(!dir.path().join("nowhere.folded").exists());
}

#[test]
fn planted_link_at_a_predictable_temporary_name_is_not_followed() {
    let _serial = serial();
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let out = dir.path().join("out.folded");
    // Before stackscope runs, its future pid is known to the child that becomes it: plant a
    // link at every name derived from the output name and that pid.
    let planted: Vec<std::ffi::CString> = [".tmp", ".new", ".part"]
        .iter()
        .map(|suffix| std::ffi::CString::new(*suffix).unwrap())
        .collect();
    let out_c = std::ffi::CString::new(out.as_os_str().as_encoded_bytes()).unwrap();
    let victim_c = std::ffi::CString::new(victim.as_os_str().as_encoded_bytes()).unwrap();
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args([os("report"), input.as_os_str(), os("-o"), out.as_os_str()])
        .args(["--format", "folded"]);
    // SAFETY: the closure only formats into stack buffers and calls getpid and symlink.
    unsafe {
        cmd.pre_exec(move || {
            let mut pid = [0u8; 20];
            let mut n = libc::getpid() as u32;
            let mut len = 0;
            loop {
                pid[len] = b'0' + (n % 10) as u8;
                n /= 10;
                len += 1;
                if n == 0 {
                    break;
                }
            }
            pid[..len].reverse();
            for suffix in &planted {
                for with_pid in [true, false] {
                    let mut name = [0u8; 4096];
                    let mut at = 0;
                    let mut push = |bytes: &[u8]| {
                        name[at..at + bytes.len()].copy_from_slice(bytes);
                        at += bytes.len();
                    };
                    push(out_c.as_bytes());
                    if with_pid {
                        push(b".");
                        push(&pid[..len]);
                    }
                    push(suffix.as_bytes());
                    push(b"\0");
                    libc::symlink(victim_c.as_ptr(), name.as_ptr().cast());
                }
            }
            Ok(())
        });
    }
    let run = run_with_deadline(cmd);
    run.assert_ok();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "the profile was written through a planted link"
    );
    let meta = std::fs::symlink_metadata(&out).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the output is not a regular file"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
}

#[test]
fn sigterm_during_a_large_report_leaves_no_temporary() {
    let _serial = serial();
    let dir = tempdir();
    // Large enough that writing takes a good part of a second.
    let input = dir.path().join("big.folded");
    let mut text = String::new();
    for i in 0..400_000u32 {
        text.push_str(&format!(
            "prog;main;f{};g{};h{i} {}\n",
            i % 1000,
            i % 977,
            1 + i % 5
        ));
    }
    std::fs::write(&input, text).unwrap();
    let out = dir.path().join("out.json");
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args([os("report"), input.as_os_str(), os("-o"), out.as_os_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    // Wait for the temporary, then stop stackscope as a user or a service manager would.
    let temporary = loop {
        let found = names_in(dir.path())
            .into_iter()
            .find(|n| n != "big.folded" && n != "out.json");
        if let Some(name) = found {
            break name;
        }
        assert!(
            start.elapsed() < DEADLINE && child.try_wait().unwrap().is_none(),
            "stackscope ended before any temporary appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "stackscope did not end by SIGTERM (it may have finished first): {status:?}"
    );
    assert_eq!(
        names_in(dir.path()),
        ["big.folded"],
        "the temporary {temporary} (or a partial output) was left behind"
    );
}

/// A read-only filesystem mounted for one test, unmounted when dropped.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn at(dir: &Path) -> ReadOnlyMount {
        let mount = dir.join("ro");
        std::fs::create_dir(&mount).unwrap();
        stackscope_testkit::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
                .arg(&mount),
        );
        ReadOnlyMount(mount)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs `bin ARGS` in `dir` to its end.
fn run_bin<S: AsRef<OsStr>>(bin: &str, dir: &Path, args: &[S]) -> Run {
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir).args(args);
    run_with_deadline(cmd)
}

#[test]
fn unwritable_output_is_refused_before_sampling_by_every_recording_command() {
    let _serial = serial();
    let dir = tempdir();
    let ro = ReadOnlyMount::at(dir.path());
    let out = ro.0.join("out.folded");
    let out = out.to_str().unwrap();
    let spin = workload("spin");
    let spin = spin.to_str().unwrap();
    let perf_shim = env!("CARGO_BIN_EXE_stackscope-perf");
    let dtrace_shim = env!("CARGO_BIN_EXE_stackscope-dtrace");
    let dtrace_script = "profile-997 /pid == $target/ { @[ustack(100)] = count(); }";
    let cases: [(&str, &str, Vec<&str>); 6] = [
        (
            "record",
            stackscope_bin(),
            vec!["record", "-o", out, "--", spin, "2"],
        ),
        (
            "record --backend bpf",
            stackscope_bin(),
            vec!["record", "--backend", "bpf", "-o", out, "--", spin, "2"],
        ),
        ("profile", stackscope_bin(), vec!["profile", "-o", out, "1"]),
        (
            "gdb",
            stackscope_bin(),
            vec![
                "gdb",
                "--remote",
                "127.0.0.1:1",
                "--kernel",
                spin,
                "-o",
                out,
            ],
        ),
        (
            "stackscope-perf",
            perf_shim,
            vec!["record", "-F", "997", "-g", "-o", out, "--", spin, "2"],
        ),
        (
            "stackscope-dtrace",
            dtrace_shim,
            vec![
                "-x",
                "ustackframes=100",
                "-n",
                dtrace_script,
                "-o",
                out,
                "-c",
                spin,
            ],
        ),
    ];
    for (what, bin, args) in cases {
        let start = Instant::now();
        let run = run_bin(bin, dir.path(), &args);
        run.assert_one_line_error(&[out, "Read-only file system"]);
        assert!(
            start.elapsed().as_secs_f64() < 1.5,
            "{what}: refused only after {:?} (it sampled first?)",
            start.elapsed()
        );
    }
}

#[test]
fn unwritable_directory_is_refused_before_sampling_for_an_unprivileged_user() {
    let _serial = serial();
    let dir = tempdir();
    // The user can reach the directory but not create files in it.
    open_to_others(dir.path());
    let out = dir.path().join("out.folded");
    let spin = workload("spin");
    let mut cmd = as_nobody(stackscope_bin());
    cmd.current_dir("/")
        .args(record_args(&out, &[], &[spin.as_os_str(), os("1")]));
    let run = run_with_deadline(cmd);
    run.assert_one_line_error(&[out.to_str().unwrap(), "Permission denied"]);
    assert!(!out.exists());
}

/// A kernel setting, `/proc/sys/fs/NAME`, raised to at least `value` for one test and put back
/// when dropped.
struct FsSetting {
    path: PathBuf,
    old: String,
}

impl FsSetting {
    fn at_least(name: &str, value: u8) -> FsSetting {
        let path = Path::new("/proc/sys/fs").join(name);
        let old = std::fs::read_to_string(&path).unwrap();
        if old.trim().parse::<u8>().unwrap() < value {
            std::fs::write(&path, value.to_string()).unwrap();
        }
        FsSetting { path, old }
    }
}

impl Drop for FsSetting {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, self.old.trim());
    }
}

/// A directory as `/tmp` is (sticky, mode 1777) in `dir`, which is opened so that other users
/// reach it.
fn sticky_dir(dir: &Path) -> PathBuf {
    open_to_others(dir);
    let sticky = dir.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, PermissionsExt::from_mode(0o1777)).unwrap();
    sticky
}

#[test]
fn a_link_another_user_planted_in_a_sticky_directory_is_not_followed() {
    let _serial = serial();
    let _protected = FsSetting::at_least("protected_symlinks", 1);
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    let sticky = sticky_dir(dir.path());
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = sticky.join("planted.folded");
    stackscope_testkit::run(as_nobody("ln").arg("-s").arg(&victim).arg(&planted));

    let planted_name = planted.to_str().unwrap();
    report_folded(dir.path(), &input, &planted).assert_one_line_error(&[
        planted_name,
        "fs.protected_symlinks",
        "Permission denied",
    ]);
    // Refused before sampling, as any unwritable output is.
    let spin = workload("spin");
    let start = Instant::now();
    record(dir.path(), &planted, &[], &[spin.as_os_str(), os("2")])
        .assert_one_line_error(&[planted_name, "fs.protected_symlinks"]);
    assert!(
        start.elapsed().as_secs_f64() < 1.5,
        "refused only after {:?} (it sampled first?)",
        start.elapsed()
    );
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious\n",
        "the root-owned file a planted link names was written"
    );
    assert!(std::fs::symlink_metadata(&planted)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(names_in(&sticky), ["planted.folded"], "files left behind");

    // A link root owns in the same directory is followed as before.
    let mine = dir.path().join("mine.folded");
    std::fs::write(&mine, "old\n").unwrap();
    let own = sticky.join("own.folded");
    std::os::unix::fs::symlink(&mine, &own).unwrap();
    report_folded(dir.path(), &input, &own).assert_ok();
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), text);
    assert!(std::fs::symlink_metadata(&own)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_file_or_fifo_another_user_owns_in_a_sticky_directory_is_not_written() {
    let _serial = serial();
    let _regular = FsSetting::at_least("protected_regular", 1);
    let _fifos = FsSetting::at_least("protected_fifos", 1);
    let dir = tempdir();
    let (input, text) = small_input(dir.path());
    let sticky = sticky_dir(dir.path());
    let theirs = sticky.join("theirs.folded");
    let script = format!("echo theirs > '{}'", theirs.display());
    stackscope_testkit::run(as_nobody("sh").arg("-c").arg(&script));
    let pipe = sticky.join("pipe");
    stackscope_testkit::run(as_nobody("mkfifo").arg(&pipe));

    report_folded(dir.path(), &input, &theirs).assert_one_line_error(&[
        theirs.to_str().unwrap(),
        "fs.protected_regular",
        "Permission denied",
    ]);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs\n");
    // Refused before opening: a FIFO nobody reads would otherwise block the open.
    report_folded(dir.path(), &input, &pipe)
        .assert_one_line_error(&[pipe.to_str().unwrap(), "fs.protected_fifos"]);
    assert!(std::fs::symlink_metadata(&pipe)
        .unwrap()
        .file_type()
        .is_fifo());

    // A file root owns there is replaced as before.
    let ours = sticky.join("ours.folded");
    std::fs::write(&ours, "old\n").unwrap();
    report_folded(dir.path(), &input, &ours).assert_ok();
    assert_eq!(std::fs::read_to_string(&ours).unwrap(), text);
    assert_eq!(
        names_in(&sticky),
        ["ours.folded", "pipe", "theirs.folded"],
        "files left behind"
    );
}

/// Whether a writer must not let `c` through: control characters but the line feed and tab
/// the text formats are made of, and the non-characters XML cannot hold.
fn unprintable(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || c == '\u{fffe}' || c == '\u{ffff}'
}

/// Every string, keys included, of a JSON document.
fn json_strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_strings(v, out)),
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                out.push(key.clone());
                json_strings(v, out);
            }
        }
        _ => {}
    }
}

/// Parses `svg` with a real XML parser (Python's expat), as a browser would.
fn assert_well_formed_xml(svg: &Path) {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
        ])
        .arg(svg)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{} is not well-formed XML: {}",
        svg.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Re-renders `input` with `report` into every format and hands each output to its reader:
/// SVG to an XML parser, JSON to a JSON parser, pprof to `go tool pprof`, folded stacks to
/// `report` itself, which must read back the same stacks and counts. Fails the test where a
/// control character got through (stackscope's own JSON escapes them, and only it keeps
/// them); returns each format's name and the text its reader saw.
fn through_every_writer(dir: &Path, input: &Path) -> Vec<(&'static str, String)> {
    let mut seen = Vec::new();
    for name in Format::ALL.map(|f| f.name()) {
        let out = dir.join(format!("out.{name}"));
        stackscope(
            dir,
            [
                os("report"),
                input.as_os_str(),
                os("-o"),
                out.as_os_str(),
                os("--format"),
                os(name),
            ],
        )
        .assert_ok();
        let text = match name {
            "pprof" => {
                let out = Command::new("go")
                    .args(["tool", "pprof", "-traces"])
                    .arg(&out)
                    .env("PPROF_TMPDIR", dir)
                    .output()
                    .expect("run `go tool pprof` (Debian package golang-go)");
                assert!(out.status.success(), "go tool pprof failed: {out:?}");
                String::from_utf8(out.stdout).unwrap()
            }
            _ => std::fs::read_to_string(&out)
                .unwrap_or_else(|e| panic!("{name} output is not UTF-8: {e}")),
        };
        match name {
            "json" | "speedscope" | "firefox" | "osdk" => {
                let value: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name} output is not JSON: {e}"));
                let mut strings = Vec::new();
                json_strings(&value, &mut strings);
                if name != "json" {
                    let bad = strings.iter().find(|s| s.chars().any(unprintable));
                    assert!(bad.is_none(), "{name} holds a control character: {bad:?}");
                }
                seen.push((name, strings.join("\n")));
                continue;
            }
            "svg" => assert_well_formed_xml(&out),
            "folded" => {
                let back = dir.join("back.folded");
                report_folded(dir, &out, &back).assert_ok();
                assert_eq!(
                    std::fs::read_to_string(&back).unwrap(),
                    text,
                    "folded stacks do not read back as written"
                );
            }
            _ => {}
        }
        let bad: Vec<char> = text.chars().filter(|&c| unprintable(c)).collect();
        assert!(bad.is_empty(), "{name} holds control characters {bad:?}");
        seen.push((name, text));
    }
    seen
}

/// A name for the spin workload to give itself, with what a profile's writers must not pass on
/// raw: a terminal escape, XML's specials, a C0 control, folded's frame separator and a newline.
/// At most 15 bytes, the kernel's limit for a process's name.
const EVIL_COMM: &str = "\x1b[m<&evil\x01;x\n";

#[test]
fn a_process_name_with_control_characters_reaches_every_writer_replaced() {
    let _serial = serial();
    let dir = tempdir();
    let evil = Background::spawn(Command::new(workload("spin")).args(["20", EVIL_COMM]));
    let pid = evil.pid().to_string();
    wait_until("the workload named itself", || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm == format!("{EVIL_COMM}\n")).then_some(())
    });

    // Straight from a recording to SVG, the format a browser refused.
    let svg = dir.path().join("flame.svg");
    record(dir.path(), &svg, &["-p", &pid, "-d", "1"], &[]).assert_ok();
    assert_well_formed_xml(&svg);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("evil"));

    let json = dir.path().join("profile.json");
    record(dir.path(), &json, &["-p", &pid, "-d", "1"], &[]).assert_ok();
    let profile = read_json(&json);
    assert!(
        profile.threads.iter().any(|t| t.comm == EVIL_COMM),
        "the lossless JSON lost the name: {:?}",
        profile.threads
    );
    for (name, text) in through_every_writer(dir.path(), &json) {
        // DTrace's aggregation and OSDK's rounds have no thread to name, and the top table
        // names functions only.
        if !["dtrace", "osdk", "top"].contains(&name) {
            assert!(
                text.contains("evil"),
                "{name} does not name the process:\n{text}"
            );
        }
    }
    let folded = std::fs::read_to_string(dir.path().join("out.folded")).unwrap();
    assert!(
        folded.contains("\u{fffd}[m<&evil\u{fffd}:x\u{fffd};"),
        "folded does not show the name replaced:\n{folded}"
    );
}

#[test]
fn frame_names_with_control_characters_reach_every_writer_replaced() {
    let _serial = serial();
    let dir = tempdir();
    let names = [
        "esc\x1b[31mred",
        "start\x01of heading",
        "nul\0byte",
        "semi;colon",
        "new\nline",
        "<tag attr=\"&amp;\">",
        "del\x7fc1\u{85}",
        "-",
        "ends in 12",
    ];
    let mut b = ProfileBuilder::new(Metadata {
        event: "cpu-clock".to_string(),
        ..Metadata::default()
    });
    let thread = b.thread(Thread {
        pid: 1,
        tid: 1,
        comm: "prog".to_string(),
        process_name: "prog".to_string(),
    });
    let main = b.frame(Frame {
        name: "main".to_string(),
        ..Frame::default()
    });
    for (i, name) in names.iter().enumerate() {
        let frame = b.frame(Frame {
            name: name.to_string(),
            module: Some(format!("/tmp/lib{name}.so")),
            ..Frame::default()
        });
        let middle = b.stack(&[main, frame, main]);
        let leaf = b.stack(&[main, frame]);
        b.add(thread, middle, None, 2 * i as u64 + 1);
        b.add(thread, leaf, None, 2 * i as u64 + 2);
    }
    let profile = b.finish();
    let input = dir.path().join("hostile.json");
    let mut bytes = Vec::new();
    format::write(&profile, Format::Json, &WriteOptions::default(), &mut bytes).unwrap();
    std::fs::write(&input, bytes).unwrap();

    for (name, text) in through_every_writer(dir.path(), &input) {
        assert!(text.contains("red"), "{name} lost a frame:\n{text}");
    }
    // Every stack kept apart, with its count.
    let back =
        stackscope_profile::format::read(&std::fs::read(dir.path().join("out.folded")).unwrap())
            .unwrap();
    assert_eq!(back.samples.len(), profile.samples.len());
    assert_eq!(back.total_samples(), profile.total_samples());
}

#[test]
fn diffs_folded_output_is_refused_by_report_not_misread() {
    let _serial = serial();
    let dir = tempdir();
    let before = dir.path().join("before.folded");
    let after = dir.path().join("after.folded");
    std::fs::write(&before, "prog;main;foo 5\nprog;main;bar 3\n").unwrap();
    std::fs::write(&after, "prog;main;foo 2\nprog;main;bar 6\n").unwrap();
    let diff = dir.path().join("diff.folded");
    stackscope(
        dir.path(),
        [
            os("diff"),
            before.as_os_str(),
            after.as_os_str(),
            os("-o"),
            diff.as_os_str(),
        ],
    )
    .assert_ok();
    let text = std::fs::read_to_string(&diff).unwrap();
    assert!(text.contains("prog;main;foo 5 2"), "{text}");

    let svg = dir.path().join("again.svg");
    let diff_name = diff.to_str().unwrap();
    stackscope(
        dir.path(),
        [os("report"), diff.as_os_str(), os("-o"), svg.as_os_str()],
    )
    .assert_one_line_error(&[diff_name, "differential folded stacks", "line 1"]);
    assert!(!svg.exists());
    // Nor is it taken for one side of another comparison.
    stackscope(
        dir.path(),
        [
            os("diff"),
            diff.as_os_str(),
            after.as_os_str(),
            os("-o"),
            svg.as_os_str(),
        ],
    )
    .assert_one_line_error(&[diff_name, "differential folded stacks"]);
}
