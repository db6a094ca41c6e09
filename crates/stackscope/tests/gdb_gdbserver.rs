//! `stackscope gdb` against a real second stub: gdbserver running split.c (func_a and func_b
//! share the work about 30/70 and measure the CPU time each takes, which the sampled split is
//! checked against), built with DWARF CFI and without frame pointers, and with frame
//! pointers and no CFI for its functions. The program is position-independent, so its load
//! address must come from the stub; gdbserver holds it at its first instruction, so it must be
//! continued.

#![cfg(target_os = "linux")]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;

/// split.c built two ways: CFI only (no frame pointers), and frame pointers only (no CFI for
/// its own functions; the C runtime's objects still bring a little `.eh_frame`).
fn split_build(dir: &Path, frame_pointers: bool) -> PathBuf {
    let flags: &[&str] = if frame_pointers {
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ]
    } else {
        &["-O2", "-g", "-fomit-frame-pointer"]
    };
    let src = std::fs::read_to_string(workloads_src().join("split.c")).expect("read split.c");
    let name = if frame_pointers {
        "split_fp"
    } else {
        "split_cfi"
    };
    stackscope_testkit::compile("gcc", dir, ("split.c", &src), flags, &[], name)
}

/// gdbserver and the program it started; both are killed when dropped (stackscope detaches
/// and leaves the program running).
struct Gdbserver {
    server: Child,
    program_pid: Option<u32>,
    port: Option<u16>,
}

impl Gdbserver {
    /// Starts `cmd` (a [`gdbserver_command`] with its stdin and stdout set up) and reads what
    /// it says on stderr until `ready` holds; `waiting_for` is the failure when it never does.
    fn start(cmd: &mut Command, ready: fn(&Gdbserver) -> bool, waiting_for: &str) -> Gdbserver {
        let mut server = cmd
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chrt and gdbserver (apt packages util-linux, gdbserver)");
        let lines = stderr_lines(&mut server);
        let mut gdbserver = Gdbserver {
            server,
            program_pid: None,
            port: None,
        };
        let mut said = String::new();
        while !ready(&gdbserver) {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{waiting_for} ({e}); it said:\n{said}"));
            gdbserver.note(&line);
            said += &line;
            said.push('\n');
        }
        gdbserver
    }

    /// `gdbserver --once 127.0.0.1:0 PROGRAM ARGS`, waiting until it listens.
    fn tcp(program: &Path, args: &[&str]) -> Gdbserver {
        let gdbserver = Gdbserver::start(
            gdbserver_command()
                .arg("--once")
                .arg("127.0.0.1:0")
                .arg(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            |g| g.port.is_some(),
            "gdbserver did not say where it listens",
        );
        assert!(
            gdbserver.program_pid.is_some(),
            "gdbserver started no program"
        );
        gdbserver
    }

    /// gdbserver on its standard input and output, with `socket` bridged to them: a stub
    /// behind a Unix socket, as QEMU serves one.
    fn unix(program: &Path, args: &[&str], socket: &Path) -> Gdbserver {
        let listener = UnixListener::bind(socket).expect("bind the Unix socket");
        let mut gdbserver = Gdbserver::start(
            gdbserver_command()
                .arg("-")
                .arg(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
            |g| g.program_pid.is_some(),
            "gdbserver did not start the program",
        );
        let stdin = gdbserver.server.stdin.take().expect("piped stdin");
        let stdout = gdbserver.server.stdout.take().expect("piped stdout");
        std::thread::spawn(move || bridge(listener, stdin, stdout));
        gdbserver
    }

    fn note(&mut self, line: &str) {
        if let Some(pid) = line.split("pid = ").nth(1) {
            self.program_pid = pid.trim().parse().ok();
        }
        if let Some(port) = line.strip_prefix("Listening on port ") {
            self.port = port.trim().parse().ok();
        }
    }

    fn remote(&self) -> String {
        format!("127.0.0.1:{}", self.port.expect("a TCP gdbserver"))
    }
}

impl Drop for Gdbserver {
    fn drop(&mut self) {
        if let Some(pid) = self.program_pid {
            // SAFETY: kill(2) on the program gdbserver started for this test.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// `gdbserver` under the real-time FIFO policy, which the program inherits, so that no
/// ordinary task preempts it. A round looks where the program is when the stub stops it: at a
/// uniform point of its CPU time only while it runs. A preempted program is looked at where it
/// was preempted, and the scheduler preempts where it next checks the time slice: under load,
/// often in split.c's own clock reads (a fifth to a half of the looks at nice -20, 3-6% under
/// FIFO), two in each function per iteration, which drew the sampled split towards 50/50
/// (func_a at 38% and 49% for a measured 30%, at a load average of 7-8). Under FIFO the
/// program leaves its CPU only to the kernel's real-time throttling (5% of each second, at a
/// timer tick), and looks at a program that has not run since the round before are left out.
fn gdbserver_command() -> Command {
    let mut cmd = Command::new("chrt");
    cmd.args(["--fifo", "1", "gdbserver"]);
    cmd
}

/// gdbserver's stderr, line by line, from a thread.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Copies bytes between the first client of `listener` and gdbserver's stdio.
fn bridge(listener: UnixListener, mut to_stub: ChildStdin, mut from_stub: ChildStdout) {
    let Ok((client, _)) = listener.accept() else {
        return;
    };
    let Ok(mut client_out) = client.try_clone() else {
        return;
    };
    let mut client_in = client;
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from_stub.read(&mut buf) {
            if n == 0 || client_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client_out.shutdown(std::net::Shutdown::Both);
    });
    let mut buf = [0u8; 4096];
    while let Ok(n) = client_in.read(&mut buf) {
        if n == 0 || to_stub.write_all(&buf[..n]).is_err() || to_stub.flush().is_err() {
            break;
        }
    }
}

/// A directory in memory for split's truth file, which split rewrites every 100 ms of CPU:
/// on a disk busy with other work a rename can block for milliseconds, which the rounds see
/// as the program sitting in `write_truth` (7% of the looks on a loaded host) while its CPU
/// clock, the truth, does not count it.
fn in_memory_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("stackscope-test")
        .tempdir_in("/dev/shm")
        .unwrap_or_else(|_| tempdir())
}

/// `stackscope gdb --remote REMOTE ARGS...` in `dir`, run to its end.
fn gdb(dir: &Path, remote: &str, args: &[&str]) -> Run {
    // What these tests check is what is sampled at a set rate, not the pacing: no slowdown
    // limit, so that a loaded host's pauses do not refuse their rates.
    let mut all = vec!["gdb", "--remote", remote, "--max-slowdown", "100"];
    all.extend_from_slice(args);
    stackscope(dir, &all)
}

/// The rate of the split tests over TCP, where the program ran about 2.5 ms between rounds
/// (stackscope's resume step took 1.4 ms of them).
const HZ: u32 = 400;
/// The rate over the Unix socket. There, at [`HZ`], the program ran only about a millisecond
/// between rounds, two or three of split's function calls, and was found near where the
/// scheduler's slice, which starts anew at each resume, ran out: at the clock read that ends
/// the function then running, a place tied to the last look rather than to the time spent.
/// The looks alternated between func_a and func_b (35 to 57% func_a on a loaded host, against
/// 30% measured). Ten milliseconds between rounds spans dozens of calls.
const UNIX_HZ: u32 = 100;

/// Samples `remote` running split: 1000 rounds at `hz` into JSON.
fn sample_split(
    dir: &Path,
    remote: &str,
    program: &Path,
    hz: u32,
) -> (Run, stackscope_profile::Profile) {
    let out = dir.join("guest.json");
    let run = gdb(
        dir,
        remote,
        &[
            "--kernel",
            program.to_str().unwrap(),
            "--samples",
            "1000",
            "-F",
            &hz.to_string(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    run.assert_ok();
    let profile = read_json(&out);
    (run, profile)
}

/// Asserts the split `split` measured from its start to just after sampling ended, and the
/// stacks and figures of 1000 rounds at `hz`.
fn assert_split(run: &Run, profile: &stackscope_profile::Profile, split: &Measured, hz: u32) {
    // A look at a program that did not run since the round before is left out: one place
    // counted once, not once per round the host left the program waiting.
    let stale = gdb_stale_looks(run);
    assert_eq!(
        profile.total_samples() + stale,
        1000,
        "{stale} looks left out\n{}\n{}",
        top_stacks(profile, 8),
        run.stderr
    );
    assert_split_profile(profile, &split.truth());
    assert_share_at_least(profile, "main", 0.95);
    // main calls func_a and func_b: the stacks through them are in that order, root first.
    // (The rest is mostly the program writing its truth file.)
    let through = share(profile, |frames| {
        frames
            .iter()
            .any(|f| f.name == "func_a" || f.name == "func_b")
    });
    let ordered = share(profile, |frames| {
        let pos = |name: &str| frames.iter().position(|f| f.name == name);
        match (pos("main"), pos("func_a").or(pos("func_b"))) {
            (Some(m), Some(f)) => m < f,
            _ => false,
        }
    });
    let ordered = ordered / through.max(1e-9);
    assert!(
        ordered >= 0.95,
        "main above func_a/func_b in {ordered} of their stacks\n{}",
        top_stacks(profile, 8)
    );
    assert_eq!(profile.meta.source, "gdb");
    assert_eq!(profile.meta.frequency_hz, Some(u64::from(hz)));
    assert_eq!(profile.threads.len(), 1, "{:?}", profile.threads);
    assert_eq!(profile.threads[0].comm, "cpu0");
    assert!(
        run.stderr
            .contains(&format!("1000 rounds, {} stacks in ", 1000 - stale))
            && run.stderr.contains("guest paused per round: median "),
        "no sampling figures on stderr:\n{}",
        run.stderr
    );
}

#[test]
fn cfi_build_under_gdbserver_gives_the_split_and_stacks_reaching_main() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    let truth_dir = in_memory_dir();
    let split = Measured::of(program.clone(), truth_dir.path(), "1000000");
    let stub = Gdbserver::tcp(&program, &split.args());
    let (run, profile) = sample_split(dir.path(), &stub.remote(), &program, HZ);
    assert_split(&run, &profile, &split, HZ);
    assert!(
        run.stderr.contains("unwinding by DWARF CFI"),
        "{}",
        run.stderr
    );
    // The C library is placed from the stub's library list: stacks go on to the entry point.
    assert_share_at_least(&profile, "_start", 0.9);
    let func_b = frame_with_source(&profile, "func_b", "split_cfi", "split.c");
    assert!(
        func_b.line.is_some(),
        "func_b has no source line: {func_b:?}"
    );
    let libc_frame = frame_named(&profile, "__libc_start_call_main");
    assert!(
        libc_frame
            .module
            .as_deref()
            .is_some_and(|m| m.starts_with("libc.so")),
        "{libc_frame:?}"
    );
}

#[test]
fn frame_pointer_build_under_gdbserver_gives_the_split_and_stacks_reaching_main() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), true);
    let truth_dir = in_memory_dir();
    let split = Measured::of(program.clone(), truth_dir.path(), "1000000");
    let stub = Gdbserver::tcp(&program, &split.args());
    let (run, profile) = sample_split(dir.path(), &stub.remote(), &program, HZ);
    assert_split(&run, &profile, &split, HZ);
}

#[test]
fn unix_socket_stub_gives_the_split() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    let socket = dir.path().join("gdb.sock");
    let truth_dir = in_memory_dir();
    let split = Measured::of(program.clone(), truth_dir.path(), "1000000");
    let _stub = Gdbserver::unix(&program, &split.args(), &socket);
    let socket = socket.to_str().unwrap();
    let (run, profile) = sample_split(dir.path(), socket, &program, UNIX_HZ);
    assert_split(&run, &profile, &split, UNIX_HZ);
}

#[test]
fn program_exiting_mid_run_writes_the_profile_so_far() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    // About 2 s of work, sampled for far longer. Not less: the program starts when stackscope
    // continues it and then has a CPU to itself, while stackscope shares the other with the
    // load; with a quarter of a second it once exited before the first round.
    let stub = Gdbserver::tcp(&program, &["4000"]);
    let out = dir.path().join("guest.folded");
    let run = gdb(
        dir.path(),
        &stub.remote(),
        &[
            "--elf",
            program.to_str().unwrap(),
            "-d",
            "60",
            "-F",
            "200",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    run.assert_ok();
    assert!(
        run.stderr.contains("exited with status 0"),
        "does not say the program exited:\n{}",
        run.stderr
    );
    let folded = std::fs::read_to_string(&out).expect("the profile so far was written");
    let lines = parse_folded(&folded);
    assert!(
        folded_share(&lines, |f| f.iter().any(|n| n == "func_b")) > 0.3,
        "{folded}"
    );
    assert!(lines.iter().all(|l| l.0[0] == "cpu0"), "{folded}");
}

#[test]
fn refused_connection_and_bad_elf_are_one_line_errors() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = format!("127.0.0.1:{port}");
    let program = program.to_str().unwrap();
    gdb(dir.path(), &remote, &["--kernel", program, "-o", "x.svg"])
        .assert_one_line_error(&[&remote, "refused"]);

    let not_elf = dir.path().join("split.c");
    gdb(
        dir.path(),
        &remote,
        &["--kernel", not_elf.to_str().unwrap(), "-o", "x.svg"],
    )
    .assert_one_line_error(&["split.c", "not an ELF file"]);

    let socket = dir.path().join("nobody.sock");
    gdb(dir.path(), socket.to_str().unwrap(), &["--kernel", program])
        .assert_one_line_error(&["nobody.sock", "gdbserver"]);
}

#[test]
fn a_stub_that_never_answers_is_a_timeout_not_a_hang() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    // Accepts the connection and says nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let remote = listener.local_addr().unwrap().to_string();
    let keep = std::thread::spawn(move || {
        let conn: Option<TcpStream> = listener.accept().ok().map(|c| c.0);
        std::thread::sleep(Duration::from_secs(10));
        drop(conn);
    });
    gdb(
        dir.path(),
        &remote,
        &["--kernel", program.to_str().unwrap(), "--timeout", "1"],
    )
    .assert_one_line_error(&["no reply", "qSupported"]);
    keep.join().unwrap();
}

#[test]
fn ctrl_c_writes_the_profile_and_leaves_the_program_running() {
    let _serial = serial();
    let dir = tempdir();
    let program = split_build(dir.path(), false);
    let stub = Gdbserver::tcp(&program, &["1000000"]);
    let out = dir.path().join("guest.folded");
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args(["gdb", "--remote", &stub.remote(), "--kernel"])
        .arg(&program)
        .args(["-F", "200", "--max-slowdown", "100", "-o"])
        .arg(&out);
    let start = std::time::Instant::now();
    let child = spawn_piped(&mut cmd);
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: kill(2) on the stackscope this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let run = wait_output(child, start);
    run.assert_ok();
    let lines = parse_folded(&std::fs::read_to_string(&out).expect("profile written"));
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        total >= 20,
        "only {total} samples in 3 s at 200 Hz:\n{}",
        run.stderr
    );
    // Detached, not stopped: the program goes on running (state R, not t).
    let pid = stub.program_pid.unwrap();
    let state = wait_until("the program runs on after stackscope detached", || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit_once(") ")?.1.chars().next()?;
        (state == 'R').then_some(state)
    });
    assert_eq!(state, 'R');
}

/// A Rust program whose hot function is a method of a generic type called from a closure.
const RUST_GENERIC: &str = r#"
struct Worker<T>(T);

impl<T: Copy + Into<u64>> Worker<T> {
    #[inline(never)]
    fn spin(&self, n: u64) -> u64 {
        let mut x: u64 = self.0.into();
        for i in 0..n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x)
    }
}

fn main() {
    let worker = Worker(3u32);
    let run = || loop {
        std::hint::black_box(worker.spin(std::hint::black_box(1_000_000)));
    };
    run();
}
"#;

#[test]
fn rust_clean_shortens_generic_and_closure_names() {
    let _serial = serial();
    let dir = tempdir();
    let program = stackscope_testkit::compile(
        "rustc",
        dir.path(),
        ("rust_generic.rs", RUST_GENERIC),
        &["-C", "opt-level=2", "-C", "debuginfo=1"],
        &[],
        "rust_generic",
    );
    // Each run gets its own gdbserver: detaching ends a gdbserver session for good.
    let sample = |clean: bool| {
        let stub = Gdbserver::tcp(&program, &[]);
        let out = dir
            .path()
            .join(if clean { "clean.folded" } else { "raw.folded" });
        let mut args = vec![
            "--kernel",
            program.to_str().unwrap(),
            "--samples",
            "100",
            "-F",
            "200",
            "-o",
            out.to_str().unwrap(),
        ];
        if clean {
            args.push("--rust-clean");
        }
        gdb(dir.path(), &stub.remote(), &args).assert_ok();
        std::fs::read_to_string(&out).expect("profile written")
    };
    let raw = sample(false);
    assert!(
        raw.contains("rust_generic::Worker<T>::spin") && raw.contains("{{closure}}"),
        "full names without --rust-clean:\n{raw}"
    );
    let clean = sample(true);
    let lines = parse_folded(&clean);
    let with_spin = folded_share(&lines, |f| {
        f.iter().any(|n| n == "rust_generic::Worker::spin")
            && f.iter().any(|n| n == "rust_generic::main")
    });
    assert!(with_spin > 0.9, "short names with --rust-clean:\n{clean}");
    assert!(
        !clean.contains('<') && !clean.contains("{{closure}}") && !clean.contains("{impl#"),
        "{clean}"
    );
}
