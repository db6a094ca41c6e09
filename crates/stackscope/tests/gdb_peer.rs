//! `stackscope gdb` against hostile stubs: a scripted fake stub on a TCP port answers like a
//! plain one-thread stub, except for the one thing each test makes it do wrong (never end its
//! thread list, flood or trickle console output, stream a packet without end). stackscope must
//! end within its stated bounds (the reply timeout, the recording's duration) with a clear
//! error, and write what it sampled before.

#![cfg(target_os = "linux")]

mod common;

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;

/// What the fake stub does on a request: the packet's data, or `\x03` for an interrupt.
/// `interrupts` counts the interrupts so far, this one included. An `Err` ends the stub.
type Script = fn(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()>;

/// A stub's packet: `$data#cs`.
fn packet(data: &str) -> Vec<u8> {
    let sum = data.bytes().fold(0u8, |s, b| s.wrapping_add(b));
    format!("${data}#{sum:02x}").into_bytes()
}

fn send(out: &mut TcpStream, data: &str) -> io::Result<()> {
    out.write_all(&packet(data))
}

/// A plain no-ack stub with one thread, stopped when asked, whose memory cannot be read.
fn plain(request: &[u8], _interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
    let reply = match request {
        r if r.starts_with(b"qSupported") => "PacketSize=4000;QStartNoAckMode+",
        b"QStartNoAckMode" | b"D" => "OK",
        r if r.starts_with(b"Hg") => "OK",
        b"?" | b"\x03" => "S02",
        b"qfThreadInfo" => "m1",
        b"qsThreadInfo" => "l",
        // rsp 0x8000, rip 0x1234, everything else 0.
        b"g" => {
            let mut regs = [0u64; 17];
            regs[7] = 0x8000;
            regs[16] = 0x1234;
            let hex: String = regs
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .map(|b| format!("{b:02x}"))
                .collect();
            return send(out, &hex);
        }
        r if r.starts_with(b"m") || r.starts_with(b"x") => "E01",
        b"c" => return Ok(()),
        _ => "",
    };
    send(out, reply)
}

/// Serves one connection on a free local port with `script`; returns the address.
fn fake_stub(script: Script) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stub = std::thread::spawn(move || {
        let Ok((mut conn, _)) = listener.accept() else {
            return;
        };
        // Small replies go out at once, as real stubs send them.
        let _ = conn.set_nodelay(true);
        let _ = serve(&mut conn, script);
    });
    (addr, stub)
}

/// Reads requests (acks skipped) and answers each with `script`, until either side hangs up.
fn serve(conn: &mut TcpStream, script: Script) -> io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut bytes = io::BufReader::new(conn.try_clone()?).bytes();
    let mut interrupts = 0;
    while let Some(b) = bytes.next() {
        match b? {
            b'$' => {
                let mut request = Vec::new();
                for b in bytes.by_ref() {
                    match b? {
                        b'#' => break,
                        b => request.push(b),
                    }
                }
                // The checksum.
                bytes.next();
                bytes.next();
                script(&request, interrupts, &mut out)?;
            }
            0x03 => {
                interrupts += 1;
                script(b"\x03", interrupts, &mut out)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `stackscope gdb --remote ADDR --kernel ELF ARGS...` in `dir`, run to its end.
fn gdb(dir: &Path, remote: &str, args: &[&str]) -> Run {
    let mut all = vec!["gdb", "--remote", remote, "--kernel", "/bin/true"];
    all.extend_from_slice(args);
    stackscope(dir, &all)
}

/// A run of `stackscope gdb ARGS -o OUT` against a stub playing a script.
struct Against {
    run: Run,
    /// The stub's address.
    remote: String,
    out: std::path::PathBuf,
    /// Holds `out` until the test ends: bind it (`_dir`), not `..`, which drops it at once.
    _dir: tempfile::TempDir,
}

/// Runs `stackscope gdb ARGS -o DIR/out.folded` against a stub playing `script`, to its end.
fn against(script: Script, args: &[&str]) -> Against {
    let dir = tempdir();
    let out = dir.path().join("out.folded");
    let (remote, stub) = fake_stub(script);
    let mut all = args.to_vec();
    all.extend(["-o", out.to_str().unwrap()]);
    let run = gdb(dir.path(), &remote, &all);
    stub.join().unwrap();
    Against {
        run,
        remote,
        out,
        _dir: dir,
    }
}

/// Asserts stackscope took no longer than `secs` (plus room for a loaded machine).
fn assert_ended_within(run: &Run, secs: u64) {
    let bound = Duration::from_secs(secs + 5);
    assert!(
        run.wall < bound,
        "stackscope took {:?}, more than {bound:?}; stderr:\n{}",
        run.wall,
        run.stderr
    );
}

/// Asserts the recording wrote a profile holding samples to `out`, and said why it ended.
fn assert_wrote_samples_and_said(run: &Run, out: &Path, why: &str) {
    run.assert_ok();
    assert!(
        run.stderr.contains("sampling stopped") && run.stderr.contains(why),
        "stderr does not say sampling stopped because {why:?}:\n{}",
        run.stderr
    );
    let folded = std::fs::read_to_string(out).expect("the profile so far is written");
    assert!(
        !parse_folded(&folded).is_empty(),
        "no samples in:\n{folded}"
    );
}

#[test]
fn a_thread_list_that_never_ends_is_an_error_within_the_timeout() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        match request {
            b"qsThreadInfo" => send(out, "m2,3,4,5"),
            _ => plain(request, interrupts, out),
        }
    }
    let Against { run, remote, .. } = against(script, &["--timeout", "3"]);
    run.assert_one_line_error(&[&remote, "qsThreadInfo"]);
    assert_ended_within(&run, 3);
}

#[test]
fn a_console_flood_ends_sampling_and_the_samples_so_far_are_written() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        if request == b"\x03" && interrupts > 3 {
            // "hello\n" as console output, without end.
            let flood = packet("O68656c6c6f0a").repeat(1000);
            loop {
                out.write_all(&flood)?;
            }
        }
        plain(request, interrupts, out)
    }
    let Against {
        run,
        remote,
        out,
        _dir,
    } = against(script, &["--timeout", "3", "-d", "60"]);
    assert_ended_within(&run, 3);
    assert_wrote_samples_and_said(&run, &out, "console output");
    assert!(run.stderr.contains(&remote), "{}", run.stderr);
}

#[test]
fn console_output_trickling_cannot_hold_the_recording_past_its_duration() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        if request == b"\x03" && interrupts > 3 {
            // Well below any size bound, and each packet well within the reply timeout.
            loop {
                send(out, "O2e")?;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        plain(request, interrupts, out)
    }
    let Against { run, out, _dir, .. } = against(script, &["--timeout", "60", "-d", "3"]);
    // The duration, then at most 2 s to detach.
    assert_ended_within(&run, 3 + 2);
    assert_wrote_samples_and_said(&run, &out, "duration ended");
}

#[test]
fn a_packet_without_end_is_refused_at_the_packet_size() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        if request.starts_with(b"qSupported") {
            out.write_all(b"$")?;
            let endless = vec![b'a'; 1 << 16];
            loop {
                out.write_all(&endless)?;
            }
        }
        plain(request, interrupts, out)
    }
    let Against { run, remote, .. } = against(script, &["--timeout", "5"]);
    run.assert_one_line_error(&[&remote, "longer than 16384 bytes", "qSupported"]);
    assert_ended_within(&run, 5);
}

/// The C library this test runs with: a library that is there to open, listed by the stubs
/// below.
fn libc() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so"))
        .expect("the test runs with a C library")
        .to_string()
}

/// The `library-list-svr4` document of `n` libraries, each the C library at its own address.
fn library_list(n: usize) -> String {
    let libc = libc();
    let mut list = String::from("<library-list-svr4 version=\"1.0\">");
    for i in 0..n {
        let addr = 0x7f00_0000_0000u64 + (i as u64) * 0x40_0000;
        list += &format!("<library name=\"{libc}\" l_addr=\"{addr:#x}\"/>");
    }
    list + "</library-list-svr4>"
}

/// Answers a `qXfer:libraries-svr4:read::OFFSET,LENGTH` request from `list`, else as [`plain`]
/// with the library list announced.
fn serve_library_list(
    list: &str,
    request: &[u8],
    interrupts: u32,
    out: &mut TcpStream,
) -> io::Result<()> {
    if request.starts_with(b"qSupported") {
        return send(
            out,
            "PacketSize=4000;QStartNoAckMode+;qXfer:libraries-svr4:read+",
        );
    }
    let Some(range) = request.strip_prefix(b"qXfer:libraries-svr4:read::") else {
        return plain(request, interrupts, out);
    };
    let range = String::from_utf8_lossy(range);
    let (offset, length) = range.split_once(',').unwrap();
    let offset = usize::from_str_radix(offset, 16).unwrap().min(list.len());
    let length = usize::from_str_radix(length, 16).unwrap();
    let piece = &list[offset..(offset + length).min(list.len())];
    let more = offset + piece.len() < list.len();
    send(out, &format!("{}{piece}", if more { 'm' } else { 'l' }))
}

#[test]
fn a_library_list_of_50000_entries_is_refused_in_bounded_memory() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        static LIST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let list = LIST.get_or_init(|| library_list(50_000));
        serve_library_list(list, request, interrupts, out)
    }
    let Against { run, remote, .. } = against(script, &["--timeout", "20"]);
    run.assert_one_line_error(&[&remote, "more than 4096 libraries"]);
    assert_ended_within(&run, 20);
    // Each library listed held its file's unwind tables: 6 GB for this list.
    eprintln!("peak memory {} KiB", run.peak_kib);
    assert!(run.peak_kib < 100 << 10, "peak memory {} KiB", run.peak_kib);
}

#[test]
fn a_library_listed_4000_times_is_loaded_once() {
    fn script(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
        static LIST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let list = LIST.get_or_init(|| library_list(4000));
        serve_library_list(list, request, interrupts, out)
    }
    let Against { run, .. } = against(script, &["--timeout", "20", "--samples", "3"]);
    assert!(
        run.stderr.contains("sampling 1 of 1 vCPU"),
        "sampling did not begin:\n{}",
        run.stderr
    );
    eprintln!("peak memory {} KiB", run.peak_kib);
    // Each copy held the library's unwind tables: 790 MB for this list.
    assert!(run.peak_kib < 100 << 10, "peak memory {} KiB", run.peak_kib);
}

/// Answers like [`serve_library_list`] with 4000 libraries, well within the bounds, but a
/// piece of the list every half second: the list takes half a minute.
fn trickled_library_list(request: &[u8], interrupts: u32, out: &mut TcpStream) -> io::Result<()> {
    static LIST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let list = LIST.get_or_init(|| library_list(4000));
    if request.starts_with(b"qXfer:libraries-svr4:read") {
        std::thread::sleep(Duration::from_millis(500));
    }
    serve_library_list(list, request, interrupts, out)
}

#[test]
fn the_duration_ends_a_library_list_still_loading() {
    let Against { run, remote, .. } =
        against(trickled_library_list, &["--timeout", "60", "-d", "2"]);
    run.assert_one_line_error(&[&remote, "duration ended", "libraries-svr4"]);
    assert_ended_within(&run, 2);
}

#[test]
fn ctrl_c_ends_a_library_list_still_loading() {
    let dir = tempdir();
    let (remote, stub) = fake_stub(trickled_library_list);
    let out = dir.path().join("out.folded");
    let mut cmd = std::process::Command::new(stackscope_bin());
    cmd.current_dir(dir.path()).args([
        "gdb",
        "--remote",
        &remote,
        "--kernel",
        "/bin/true",
        "--timeout",
        "60",
        "-o",
        out.to_str().unwrap(),
    ]);
    let start = std::time::Instant::now();
    let child = spawn_piped(&mut cmd);
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signals our own child, still running (it waits for the list).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let run = wait_output(child, start);
    stub.join().unwrap();
    run.assert_exit(130, "Ctrl-C before sampling began");
    assert!(run.stderr.contains("nothing was sampled"), "{}", run.stderr);
    assert_ended_within(&run, 2);
    assert!(!out.exists(), "a profile written without samples");
}
