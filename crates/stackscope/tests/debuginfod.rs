//! Debug info fetched from a real debuginfod server (elfutils', from apt) started on a
//! loopback port over a directory holding only the split-off debug file of a program built
//! here with -g and shipped stripped: its hot static functions are named, with source lines,
//! only through the server; a second run reads elfutils' cache with the server gone; and
//! servers that cannot be reached cost the timeout once, are named in one warning each, and
//! the profile is written all the same. A Ctrl-C during a download stops it, whether it is
//! the first stop or the one after a stopped recording, and the profile is written.
//!
//! Hostile servers, on loopback ports too, answer with the debug file of a decoy build (the
//! same program with its functions renamed), with a 10 GiB length, with a body without end,
//! or with more than `DEBUGINFOD_MAXSIZE`: each run ends in time with its profile, names no
//! frame from the decoy, keeps nothing in the cache (watched while it runs), stays small in
//! memory, and says what happened in one-line warnings (once per server, or per answer of
//! another build). A decoy already in the cache is not used and not removed.

#![cfg(target_os = "linux")]

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{read_json, record_command, run_with_deadline, share_of, Run};
use stackscope_profile::Profile;
use stackscope_symbols::elf::ElfFile;
use stackscope_testkit::{compile, run, Running};

/// Two hot static functions in the program, and work in a library of its own, both shipped
/// stripped: nothing on this machine names the static functions. noipa keeps gcc from cloning
/// or inlining them, so each is one function under its own name.
const PROGRAM: &str = r#"
#include <stdlib.h>
unsigned long helper_work(unsigned long n, unsigned long seed);
static volatile unsigned long sink;

static __attribute__((noipa)) unsigned long warm_alpha(unsigned long n, unsigned long seed)
{
    for (unsigned long i = 0; i < n; i++)
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
    return seed;
}

static __attribute__((noipa)) unsigned long warm_beta(unsigned long n, unsigned long seed)
{
    for (unsigned long i = 0; i < n; i++)
        seed = (seed ^ (seed >> 29)) * 0xbf58476d1ce4e5b9UL;
    return seed;
}

int main(int argc, char **argv)
{
    unsigned long rounds = argc > 1 ? strtoul(argv[1], 0, 10) : 300;
    for (unsigned long r = 0; r < rounds; r++) {
        sink += warm_alpha(1000000, r);
        sink += warm_beta(1000000, r);
        sink += helper_work(300000, r);
    }
    return 0;
}
"#;

const LIBRARY: &str = r#"
static __attribute__((noipa)) unsigned long helper_spin(unsigned long n, unsigned long seed)
{
    for (unsigned long i = 0; i < n; i++)
        seed = seed * 2862933555777941757UL + 3037000493UL;
    return seed;
}

unsigned long helper_work(unsigned long n, unsigned long seed)
{
    return helper_spin(n, seed) ^ 1;
}
"#;

/// The stripped program (linked to its stripped library) and the directory the server
/// serves, holding the program's split-off debug file only.
struct Built {
    program: PathBuf,
    served: PathBuf,
    build_id: String,
}

fn build(dir: &Path) -> Built {
    let lib_full = compile(
        "gcc",
        dir,
        ("helper.c", LIBRARY),
        &["-O2", "-g", "-shared", "-fPIC"],
        &[],
        "libhelper.so.full",
    );
    run(Command::new("strip")
        .args(["-s", "-o"])
        .arg(dir.join("libhelper.so"))
        .arg(&lib_full));
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let lib_dir = format!("-L{}", dir.display());
    let full = compile(
        "gcc",
        dir,
        ("debuginfod_pair.c", PROGRAM),
        &["-O2", "-g", "-Wl,--build-id"],
        &[&lib_dir, "-lhelper", &rpath],
        "debuginfod_pair.full",
    );
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(served.join("debuginfod_pair.debug")));
    let program = dir.join("debuginfod_pair");
    run(Command::new("strip")
        .args(["-s", "-o"])
        .arg(&program)
        .arg(&full));
    let elf = ElfFile::open(&program).expect("read the stripped program");
    let build_id = elf
        .build_id()
        .expect("gcc gave the program a build-id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Built {
        program,
        served,
        build_id,
    }
}

/// A port nothing listens on (taken from the kernel, then closed).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().unwrap().port()
}

/// elfutils' debuginfod over `served`, on a loopback port, killed on drop.
struct Server {
    _process: Running,
    url: String,
    log: PathBuf,
}

impl Server {
    fn start(dir: &Path, served: &Path) -> Server {
        let port = free_port();
        let log = dir.join("debuginfod.log");
        let process = Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-d"])
            .arg(dir.join("debuginfod.sqlite"))
            .arg(served)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start debuginfod (apt: debuginfod)");
        Server {
            _process: Running(process),
            url: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    /// Polls until the server answers for `build_id` (it listens before its first scan
    /// ends), bounded so that a server that never comes up fails the test with its log.
    fn wait_for(&self, build_id: &str) {
        let start = Instant::now();
        let addr = self.url.trim_start_matches("http://");
        while start.elapsed() < Duration::from_secs(60) {
            if http_status(addr, &format!("/buildid/{build_id}/debuginfo")) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "debuginfod did not serve {build_id} within 60 s; its log:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

/// The status code of a GET of `path` at `addr`, or `None` while nothing answers there.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Records the program with the environment's debuginfod variables set to `env` (and no
/// others from the test's own environment).
fn record(
    dir: &Path,
    name: &str,
    options: &[&str],
    env: &[(&str, &str)],
    built: &Built,
) -> (Run, Profile) {
    let out = dir.join(name);
    let command = [built.program.as_os_str(), OsStr::new("300")];
    let mut cmd = record_command(dir, &out, options, &command);
    for var in [
        "DEBUGINFOD_URLS",
        "DEBUGINFOD_TIMEOUT",
        "DEBUGINFOD_MAXTIME",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("DEBUGINFOD_CACHE_PATH", dir.join("cache"));
    cmd.envs(env.iter().copied());
    let run = run_with_deadline(cmd);
    run.assert_ok();
    let profile = read_json(&out);
    (run, profile)
}

/// `perf record` of the program, then `stackscope report` of its perf.data with the server at
/// `url` and an empty cache.
fn report_perf_data(dir: &Path, url: &str, built: &Built) -> (Run, Profile) {
    let data = dir.join("perf.data");
    // -N: no copy into perf's build-id cache in the home directory.
    run(Command::new("perf")
        .args(["record", "-N", "-q", "-F", "999", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&built.program)
        .arg("300")
        .env_remove("DEBUGINFOD_URLS"));
    let out = dir.join("reported.json");
    let mut cmd = Command::new(common::stackscope_bin());
    cmd.current_dir(dir)
        .arg("report")
        .arg(&data)
        .arg("-o")
        .arg(&out)
        .env("DEBUGINFOD_URLS", url)
        .env("DEBUGINFOD_CACHE_PATH", dir.join("report-cache"));
    let run = run_with_deadline(cmd);
    run.assert_ok();
    let profile = read_json(&out);
    (run, profile)
}

/// Each hot static function is named, in the stripped program, with a line of its source.
fn assert_named_with_lines(profile: &Profile, run: &Run) {
    for name in ["warm_alpha", "warm_beta"] {
        let frame = profile
            .frames
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "{name} not named; top stacks:\n{}\nstderr:\n{}",
                    common::top_stacks(profile, 8),
                    run.stderr
                )
            });
        assert_eq!(
            frame.module.as_deref(),
            Some("debuginfod_pair"),
            "{frame:?}"
        );
        assert!(
            frame
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("debuginfod_pair.c"))
                && frame.line.is_some(),
            "{name} has no source line: {frame:?}"
        );
        // Hot: a real share of the samples, whatever the machine's load.
        assert!(share_of(profile, name) > 0.05, "{name} holds few samples");
    }
}

#[test]
fn a_debuginfod_server_names_a_stripped_program_and_its_cache_serves_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let server = Server::start(dir.path(), &built.served);
    server.wait_for(&built.build_id);
    let url = server.url.clone();
    let env = [("DEBUGINFOD_URLS", url.as_str())];

    // Without the server nothing names the static functions: the names below are its doing.
    let (_, bare) = record(
        dir.path(),
        "bare.json",
        &["--format", "json", "--no-debuginfod"],
        &env,
        &built,
    );
    assert!(
        !bare.frames.iter().any(|f| f.name == "warm_alpha"),
        "warm_alpha was named without debuginfod"
    );

    let (run, fetched) = record(
        dir.path(),
        "fetched.json",
        &["--format", "json"],
        &env,
        &built,
    );
    assert_named_with_lines(&fetched, &run);
    let fetched_stderr = run.stderr.clone();
    assert!(
        run.stderr
            .contains(&format!("debug info of build-id {}", built.build_id)),
        "no note of the download on stderr:\n{}",
        run.stderr
    );
    let cached = dir
        .path()
        .join("cache")
        .join(&built.build_id)
        .join("debuginfo");
    assert!(cached.is_file(), "nothing kept in elfutils' cache layout");

    // `report perf.data` names from the server too (with a cache of its own, so it asks).
    let (run, reported) = report_perf_data(dir.path(), &url, &built);
    assert_named_with_lines(&reported, &run);

    // The server gone, its port closed: the cache alone names them, and nothing is asked.
    drop(server);
    let (run, again) = record(
        dir.path(),
        "cached.json",
        &["--format", "json"],
        &env,
        &built,
    );
    assert_named_with_lines(&again, &run);
    assert!(
        !run.stderr.contains("fetching the debug info"),
        "the cache was not read first:\n{}",
        run.stderr
    );
    // A file first sampled in this run (the dynamic loader, at the start) is asked of the
    // server, which is gone: that is the only warning allowed.
    if run.stderr.contains("warning") {
        let before = unnamed_files(&fetched_stderr);
        let new = unnamed_files(&run.stderr);
        assert!(
            new.iter().any(|file| !before.contains(file)),
            "a server was asked for what the cache holds:\n{}",
            run.stderr
        );
    }
}

/// The files the summary's hint names as sampled without symbols.
fn unnamed_files(stderr: &str) -> Vec<String> {
    let Some(hint) = stderr
        .lines()
        .find_map(|line| line.split("(shown as module+address), in ").nth(1))
    else {
        return Vec::new();
    };
    let files = hint.split(": ").next().unwrap_or("");
    files.split(", ").map(str::to_string).collect()
}

/// A loopback port whose connections never complete, as at a blackholed address: a listener
/// whose queue of connections (cut to one) is held full and never accepted from, so the
/// kernel drops every further SYN. Returns what must stay alive, and the URL.
fn blackholed_port() -> ((TcpListener, TcpStream), String) {
    use std::os::fd::AsRawFd;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen on a socket this test owns; a second listen only resizes its queue.
    let listening = unsafe { libc::listen(listener.as_raw_fd(), 0) };
    assert_eq!(listening, 0, "cannot resize the listen queue");
    let addr = listener.local_addr().unwrap();
    let filler = TcpStream::connect(addr).expect("fill the listen queue");
    ((listener, filler), format!("http://{addr}"))
}

#[test]
fn unreachable_servers_cost_the_timeout_once_and_the_profile_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    // A closed port refuses at once; a blackholed one never completes a connection.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let (_blackhole, blackholed) = blackholed_port();
    let urls = format!("{closed} {blackholed}");
    let timeout = 20;
    let timeout_text = timeout.to_string();

    let (baseline, _) = record(
        dir.path(),
        "off.json",
        &["--format", "json", "--no-debuginfod"],
        &[],
        &built,
    );
    let env = [
        ("DEBUGINFOD_URLS", urls.as_str()),
        ("DEBUGINFOD_TIMEOUT", &timeout_text),
    ];
    let (run, profile) = record(
        dir.path(),
        "unreachable.json",
        &["--format", "json"],
        &env,
        &built,
    );

    let in_program = common::share(&profile, |frames| {
        frames
            .iter()
            .any(|f| f.module.as_deref() == Some("debuginfod_pair"))
    });
    assert!(in_program > 0.5, "the profile lacks the program's samples");
    for server in [&closed, &blackholed] {
        let warnings: Vec<&str> = run
            .stderr_lines()
            .into_iter()
            .filter(|l| l.contains("warning") && l.contains(server.as_str()))
            .collect();
        assert_eq!(
            warnings.len(),
            1,
            "not one warning naming {server}:\n{}",
            run.stderr
        );
    }
    // The program and its library both wanted debug info: asked per file, the blackholed
    // server would cost the timeout twice. Asked once, it costs it once, and at least once.
    let timeout = Duration::from_secs(timeout);
    assert!(
        run.wall >= timeout,
        "the blackholed server was not waited for: {:?}",
        run.wall
    );
    assert!(
        run.wall < baseline.wall + timeout + timeout / 2,
        "fetching cost {:?} beyond a run without it ({:?}), more than the timeout {timeout:?}",
        run.wall.saturating_sub(baseline.wall),
        baseline.wall
    );
}

/// A server that answers with a large file and then sends it a little at a time, for far
/// longer than any test waits.
fn trickling_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n");
                while stream.write_all(&[0u8; 1000]).is_ok() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
    });
    url
}

/// Records the program against a server whose download never ends, sends SIGINT once the
/// download began, and asserts that it stopped the download and the profile was written.
/// With `rounds` long enough to be stopped, a first SIGINT ends the recording before any
/// download: the one during the download is then a second stop, which stops naming as well.
fn ctrl_c_during_a_download(rounds: &str, stop_recording_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let url = trickling_server();
    let out = dir.path().join("interrupted.json");
    let command = [built.program.as_os_str(), OsStr::new(rounds)];
    let stderr_path = dir.path().join("stderr.txt");
    let mut cmd = record_command(dir.path(), &out, &["--format", "json"], &command);
    cmd.env("DEBUGINFOD_URLS", &url)
        .env("DEBUGINFOD_CACHE_PATH", dir.path().join("cache"))
        .env_remove("DEBUGINFOD_TIMEOUT")
        .env_remove("DEBUGINFOD_MAXTIME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    let mut stackscope = Running(cmd.spawn().expect("start stackscope"));
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let pid = stackscope.0.id() as libc::pid_t;
    // SAFETY: kill only sends a signal, to the child this test started and still holds.
    let interrupt = || unsafe { libc::kill(pid, libc::SIGINT) };
    let start = Instant::now();
    let mut wait_for = |said: &str| {
        while !stderr().contains(said) {
            assert!(
                start.elapsed() < common::DEADLINE,
                "never said {said:?}:\n{}",
                stderr()
            );
            if let Some(status) = stackscope.0.try_wait().unwrap() {
                panic!(
                    "stackscope ended ({status}) before saying {said:?}:\n{}",
                    stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    if stop_recording_first {
        wait_for("stackscope: sampling");
        std::thread::sleep(Duration::from_millis(500));
        interrupt();
        // Past the time within which a second SIGINT counts as a copy of the first; the
        // download, which never ends, is still under way after it.
        std::thread::sleep(Duration::from_millis(1500));
    }
    wait_for("fetching the debug info");
    interrupt();
    // The download would last for hours: ending at all within the deadline is the stop.
    let status = loop {
        if let Some(status) = stackscope.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < common::DEADLINE,
            "Ctrl-C did not stop the download:\n{}",
            stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // A recording stopped early passes on its program's end by SIGINT, as a shell would.
    let code = if stop_recording_first {
        128 + libc::SIGINT
    } else {
        0
    };
    assert_eq!(status.code(), Some(code), "{status}:\n{}", stderr());
    assert!(stderr().contains("stopped at Ctrl-C"), "{}", stderr());
    let profile = read_json(&out);
    assert!(profile.total_samples() > 0, "an empty profile was written");
    // Nothing half-downloaded passes for a debug file.
    let entry = dir
        .path()
        .join(format!("cache/{}/debuginfo", built.build_id));
    assert!(
        !entry.exists(),
        "a partial download was kept as {}",
        entry.display()
    );
}

#[test]
fn ctrl_c_during_a_download_still_writes_the_profile() {
    ctrl_c_during_a_download("100", false);
}

/// The first Ctrl-C ends the recording and leaves the fetching after it alone; the next one
/// stops naming, and the download under way with it.
#[test]
fn ctrl_c_during_a_download_after_a_stopped_recording_still_writes_the_profile() {
    ctrl_c_during_a_download("1000000", true);
}

/// The split-off debug file of a decoy: the program with its hot functions renamed
/// (`decoy_alpha`, `decoy_beta`), so of the same layout and another build-id. A frame named
/// from it says that a file with the wrong build-id was used.
fn build_decoy(dir: &Path) -> Vec<u8> {
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let lib_dir = format!("-L{}", dir.display());
    let full = compile(
        "gcc",
        dir,
        ("decoy.c", &PROGRAM.replace("warm_", "decoy_")),
        &["-O2", "-g", "-Wl,--build-id"],
        &[&lib_dir, "-lhelper", &rpath],
        "decoy.full",
    );
    let debug = dir.join("decoy.debug");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    std::fs::read(debug).unwrap()
}

/// What a hostile server answers to every request.
#[derive(Clone)]
enum Hostile {
    /// This file, whatever build-id was asked.
    File(Arc<Vec<u8>>),
    /// A length of 10 GiB, and a body that goes on.
    HugeLength,
    /// A chunked body without end, and no length.
    EndlessChunks,
    /// A length of this many bytes, and that many.
    Sized(u64),
}

/// A test-only HTTP server on a loopback port, answering as [`Hostile`] says, keeping the
/// head of every request and counting the bytes of body it sent.
struct HostileServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

impl HostileServer {
    fn start(answer: Hostile) -> HostileServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let (seen, counted) = (Arc::clone(&requests), Arc::clone(&sent));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (seen, counted, answer) =
                    (Arc::clone(&seen), Arc::clone(&counted), answer.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    let mut head = String::new();
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        head.push_str(&line);
                        line.clear();
                    }
                    seen.lock().unwrap().push(head);
                    answer.send(reader.get_mut(), &counted);
                });
            }
        });
        HostileServer {
            url,
            requests,
            sent,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Hostile {
    /// Writes the answer until it ends or the client goes, counting the body in `sent`.
    fn send(&self, stream: &mut TcpStream, sent: &AtomicU64) {
        let length = match self {
            Hostile::File(file) => Some(file.len() as u64),
            Hostile::HugeLength => Some(10 << 30),
            Hostile::EndlessChunks => None,
            Hostile::Sized(size) => Some(*size),
        };
        let head = match length {
            Some(length) => format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n"),
            None => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
        };
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut body = |bytes: &[u8]| {
            let written = stream.write_all(bytes).is_ok();
            if written {
                sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            written
        };
        let zeros = [0u8; 65536];
        match self {
            Hostile::File(file) => {
                body(file);
            }
            Hostile::HugeLength => while body(&zeros) {},
            Hostile::EndlessChunks => {
                let mut chunk = b"10000\r\n".to_vec();
                chunk.extend_from_slice(&zeros);
                chunk.extend_from_slice(b"\r\n");
                while body(&chunk) {}
            }
            Hostile::Sized(size) => {
                let mut left = *size;
                while left > 0 && body(&zeros[..left.min(65536) as usize]) {
                    left = left.saturating_sub(65536);
                }
            }
        }
    }
}

/// A run of `record`, and what was seen of it while it ran.
struct Watched {
    run: Run,
    profile: Profile,
    cache: PathBuf,
    /// The most bytes the cache directory held at any look.
    peak_cache: u64,
    /// stackscope's peak resident memory (VmHWM) at its last look before it ended.
    peak_rss: u64,
}

/// The bytes of the files under `dir`, at any depth, and their paths.
fn files_under(dir: &Path) -> (u64, Vec<PathBuf>) {
    let (mut bytes, mut files) = (0, Vec::new());
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => dirs.push(entry.path()),
                Ok(meta) => {
                    bytes += meta.len();
                    files.push(entry.path());
                }
                Err(_) => {}
            }
        }
    }
    (bytes, files)
}

/// The peak resident memory of process `pid`, in bytes, while it runs.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Records the program as [`record`] does, with the cache at `dir/cache`, looking at the
/// cache's size and stackscope's memory every 10 ms while it runs.
fn record_watched(dir: &Path, name: &str, env: &[(&str, &str)], built: &Built) -> Watched {
    let out = dir.join(name);
    let cache = dir.join("cache");
    let command = [built.program.as_os_str(), OsStr::new("300")];
    let mut cmd = record_command(dir, &out, &["--format", "json"], &command);
    for var in [
        "DEBUGINFOD_URLS",
        "DEBUGINFOD_TIMEOUT",
        "DEBUGINFOD_MAXTIME",
        "DEBUGINFOD_MAXSIZE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("DEBUGINFOD_CACHE_PATH", &cache);
    cmd.envs(env.iter().copied());
    let start = Instant::now();
    let child = common::spawn_piped(&mut cmd);
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let (mut cache_peak, mut rss_peak) = (0, 0);
            // The last look comes after the end, so that a file left behind is seen too.
            loop {
                let ended = done.load(Ordering::Relaxed);
                cache_peak = cache_peak.max(files_under(&cache).0);
                rss_peak = rss_peak.max(peak_rss(pid).unwrap_or(0));
                if ended {
                    break (cache_peak, rss_peak);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let run = common::wait_output(child, start);
    done.store(true, Ordering::Relaxed);
    let (peak_cache, peak_rss) = watcher.join().unwrap();
    run.assert_ok();
    let profile = read_json(&out);
    Watched {
        run,
        profile,
        cache: dir.join("cache"),
        peak_cache,
        peak_rss,
    }
}

/// Far more than stackscope needs to record and name the program, far less than a body
/// held in memory.
const RSS_BOUND: u64 = 256 << 20;
/// Far longer than the program runs, far shorter than a download of 10 GiB or the default
/// `DEBUGINFOD_TIMEOUT` of 90 s.
const WALL_BOUND: Duration = Duration::from_secs(45);

/// What every refused answer must leave: a profile of the program with no frame named from
/// a wrong file, no byte of it in the cache, bounded time and memory, and warnings naming the
/// server at `url` that say `said`, each once; returns those.
fn assert_left_alone(watched: &Watched, url: &str, said: &str) -> Vec<String> {
    let Watched { run, profile, .. } = watched;
    let in_program = common::share(profile, |frames| {
        frames
            .iter()
            .any(|f| f.module.as_deref() == Some("debuginfod_pair"))
    });
    assert!(in_program > 0.5, "the profile lacks the program's samples");
    for name in ["warm_alpha", "decoy_alpha", "decoy_beta"] {
        assert!(
            !profile.frames.iter().any(|f| f.name == name),
            "{name} was named, from a file not asked for:\n{}",
            common::top_stacks(profile, 8)
        );
    }
    // No byte of any answer kept; a server that said it has no file is remembered, as
    // elfutils remembers it, by an empty entry.
    let (bytes, files) = files_under(&watched.cache);
    assert!(
        bytes == 0 && files.iter().all(|f| f.ends_with("debuginfo")),
        "left in the cache ({bytes} bytes): {files:?}"
    );
    assert!(
        run.wall < WALL_BOUND,
        "the run took {:?}:\n{}",
        run.wall,
        run.stderr
    );
    assert!(
        watched.peak_rss > 0 && watched.peak_rss < RSS_BOUND,
        "peak resident memory {} bytes",
        watched.peak_rss
    );
    // One line per server, or per file of another build (by its URL), each said once.
    let warnings: Vec<&str> = run
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("warning") && l.contains(url))
        .collect();
    assert!(
        !warnings.is_empty(),
        "no warning naming {url}:\n{}",
        run.stderr
    );
    for (i, warning) in warnings.iter().enumerate() {
        assert!(
            warning.contains(said),
            "the warning does not say {said:?}: {warning}"
        );
        assert!(
            !warnings[..i].contains(warning),
            "said twice: {warning}\n{}",
            run.stderr
        );
    }
    eprintln!(
        "{}\n{:?}, peak cache {} bytes, peak RSS {} MiB",
        warnings.join("\n"),
        run.wall,
        watched.peak_cache,
        watched.peak_rss >> 20,
    );
    warnings.into_iter().map(str::to_string).collect()
}

/// The build-id of the ELF file `bytes`, in hex.
fn build_id_of(bytes: &[u8]) -> String {
    let elf = ElfFile::from_bytes(bytes).expect("an ELF file");
    let id = elf.build_id().expect("a build-id");
    stackscope_symbols::elf::build_id_hex(id)
}

/// Nothing at all in the cache: a hostile server never says it has no file.
fn assert_cache_empty(watched: &Watched) {
    let (_, files) = files_under(&watched.cache);
    assert!(files.is_empty(), "left in the cache: {files:?}");
}

/// How many files of another build the summary says were left unused, if it says so.
fn said_left_out(run: &Run) -> Option<u64> {
    run.stderr_lines().into_iter().find_map(|line| {
        let rest = line.strip_prefix("stackscope: ")?;
        let (count, what) = rest.split_once(' ')?;
        what.starts_with("debug or binary file(s) left unused")
            .then(|| count.parse().ok())?
    })
}

#[test]
fn a_server_answering_with_another_build_s_debug_file_names_nothing_from_it_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let decoy = build_decoy(dir.path());
    let decoy_id = build_id_of(&decoy);
    let server = HostileServer::start(Hostile::File(Arc::new(decoy)));

    let watched = record_watched(
        dir.path(),
        "decoy.json",
        &[("DEBUGINFOD_URLS", &server.url)],
        &built,
    );
    assert_left_alone(
        &watched,
        &server.url,
        &format!("its build-id is {decoy_id}, not the"),
    );
    assert_cache_empty(&watched);
    assert!(
        !server.requests().is_empty(),
        "the server was not asked, so it proves nothing"
    );
    // The program and its library at least.
    let count = said_left_out(&watched.run);
    assert!(
        count.is_some_and(|c| c >= 2),
        "the end says {count:?} files left out:\n{}",
        watched.run.stderr
    );
}

/// A server with files over the size bound, the bound (`DEBUGINFOD_MAXSIZE`, unset for
/// none), and what the one warning naming the server says.
struct OverTheBound {
    /// The profile's file name, which says the case.
    name: &'static str,
    server: BoundServer,
    max_size: Option<u64>,
    said: String,
}

/// Who answers in a case over the size bound.
enum BoundServer {
    /// A hostile server; the most bytes the cache may hold at any look, and what must hold of
    /// what the server saw.
    Hostile {
        answer: Hostile,
        peak_cache: u64,
        saw: fn(&HostileServer),
    },
    /// elfutils' own server, with the program's debug file of some kilobytes.
    Elfutils,
}

/// Records the program against the case's server, which is left alone and said once.
fn refuse_over_the_bound(case: OverTheBound) {
    eprintln!("case: {}", case.name);
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    // elfutils' server runs until `_elfutils` is dropped, after the recording.
    let (url, hostile, _elfutils) = match case.server {
        BoundServer::Hostile {
            answer,
            peak_cache,
            saw,
        } => {
            let server = HostileServer::start(answer);
            (server.url.clone(), Some((server, peak_cache, saw)), None)
        }
        BoundServer::Elfutils => {
            let server = Server::start(dir.path(), &built.served);
            server.wait_for(&built.build_id);
            (server.url.clone(), None, Some(server))
        }
    };
    let max_size = case.max_size.map(|size| size.to_string());
    let mut env = vec![("DEBUGINFOD_URLS", url.as_str())];
    env.extend(max_size.as_deref().map(|size| ("DEBUGINFOD_MAXSIZE", size)));
    let watched = record_watched(dir.path(), case.name, &env, &built);
    let warned = assert_left_alone(&watched, &url, &case.said);
    // Said once for the server, whatever else it is asked.
    assert_eq!(warned.len(), 1, "{}: {warned:?}", case.name);
    if let Some((server, peak_cache, saw)) = hostile {
        assert_cache_empty(&watched);
        assert!(
            watched.peak_cache <= peak_cache,
            "{}: the cache held {} bytes",
            case.name,
            watched.peak_cache
        );
        saw(&server);
    }
}

#[test]
fn answers_over_the_size_bound_are_refused_and_nothing_is_kept() {
    let endless_bound: u64 = 32 << 20;
    let cases = [
        OverTheBound {
            name: "huge.json",
            server: BoundServer::Hostile {
                answer: Hostile::HugeLength,
                // Refused by its stated length before a byte is written.
                peak_cache: 0,
                saw: |server| {
                    // What the socket buffers took before stackscope hung up, no more.
                    let sent = server.sent.load(Ordering::Relaxed);
                    assert!(sent < 64 << 20, "the server sent {sent} bytes");
                },
            },
            // The default bound.
            max_size: None,
            said: "only as 10737418240 bytes, over the bound of 2147483648 bytes".to_string(),
        },
        OverTheBound {
            name: "endless.json",
            server: BoundServer::Hostile {
                answer: Hostile::EndlessChunks,
                // Dropped at the bound.
                peak_cache: endless_bound,
                saw: |server| {
                    // Not asked again.
                    let asked = server.requests().len();
                    assert_eq!(asked, 1, "asked {asked} times");
                },
            },
            max_size: Some(endless_bound),
            said: format!("sent more than {endless_bound} bytes"),
        },
        OverTheBound {
            name: "sized.json",
            server: BoundServer::Hostile {
                answer: Hostile::Sized(8 << 20),
                peak_cache: 0,
                saw: |server| {
                    let requests = server.requests();
                    assert!(
                        requests.iter().all(|r| r
                            .to_ascii_lowercase()
                            .contains("x-debuginfod-maxsize: 1048576\r\n")),
                        "the bound was not sent as elfutils sends it: {requests:?}"
                    );
                    // Honest about its sizes, it is still asked for the library's file.
                    assert!(requests.len() >= 2, "asked {} times", requests.len());
                },
            },
            max_size: Some(1 << 20),
            said: "only as 8388608 bytes, over the bound of 1048576 bytes (DEBUGINFOD_MAXSIZE)"
                .to_string(),
        },
        OverTheBound {
            name: "refused.json",
            server: BoundServer::Elfutils,
            max_size: Some(100),
            said: "only over the bound of 100 bytes (DEBUGINFOD_MAXSIZE; it answered 406)"
                .to_string(),
        },
    ];
    for case in cases {
        refuse_over_the_bound(case);
    }
}

#[test]
fn a_debug_file_with_another_build_id_in_the_cache_is_neither_used_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let decoy = build_decoy(dir.path());
    let entry = dir
        .path()
        .join("cache")
        .join(&built.build_id)
        .join("debuginfo");
    std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
    std::fs::write(&entry, &decoy).unwrap();
    // A server with the right file: it cannot replace the one in place, which is not ours.
    let right = std::fs::read(built.served.join("debuginfod_pair.debug")).unwrap();
    let server = HostileServer::start(Hostile::File(Arc::new(right)));

    let watched = record_watched(
        dir.path(),
        "cached_decoy.json",
        &[("DEBUGINFOD_URLS", &server.url)],
        &built,
    );
    let run = &watched.run;
    for name in ["decoy_alpha", "decoy_beta"] {
        assert!(
            !watched.profile.frames.iter().any(|f| f.name == name),
            "{name} was named from the decoy in the cache"
        );
    }
    assert_eq!(
        std::fs::read(&entry).unwrap(),
        decoy,
        "the file in the cache was changed"
    );
    let warnings: Vec<&str> = run
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("warning") && l.contains(&entry.display().to_string()))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "not one warning naming it:\n{}",
        run.stderr
    );
    assert!(
        warnings[0].contains(&build_id_of(&decoy)),
        "{}",
        warnings[0]
    );
    assert!(
        said_left_out(run).is_some_and(|c| c >= 1),
        "the end does not count it:\n{}",
        run.stderr
    );
    eprintln!("{}", warnings[0]);
}
