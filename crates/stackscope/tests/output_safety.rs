//! Where profiles are written, attacked: devices, FIFOs and links are written through and never
//! replaced, a link planted at the temporary's name is never followed, a killed writer leaves
//! no temporary, and an output that cannot be written is refused before any sampling, by every
//! command that records.

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
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.path().join("out.folded");
    let spin = workload("spin");
    let mut cmd = Command::new("setpriv");
    cmd.current_dir("/")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(stackscope_bin())
        .args(record_args(&out, &[], &[spin.as_os_str(), os("1")]));
    let run = run_with_deadline(cmd);
    run.assert_one_line_error(&[out.to_str().unwrap(), "Permission denied"]);
    assert!(!out.exists());
}
