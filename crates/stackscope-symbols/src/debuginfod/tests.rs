//! The cache, the transport and the session against servers on loopback ports, hostile ones
//! included, and small ELF programs built here as debug files.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stackscope_testkit::compile;

use super::cache::{Cache, Cached, Stored, Unusable};
use super::{Debuginfod, Limits, DEFAULT_MAX_SIZE};
use crate::elf::{build_id_hex, ElfFile};
use crate::foreign::mismatched_count;

const BUILD_ID: &str = "0123456789abcdef0123456789abcdef01234567";

/// Limits for tests: short enough that a hang fails the test rather than stalls it.
fn limits(size: u64) -> Limits {
    Limits {
        start: Some(Duration::from_secs(30)),
        file: None,
        overall: Duration::from_secs(60),
        size,
    }
}

/// A small ELF program built here, and its build-id.
struct Elf {
    path: PathBuf,
    build_id: Vec<u8>,
}

impl Elf {
    /// Programs from different `text` have different build-ids.
    fn build(dir: &Path, name: &str, text: &str) -> Elf {
        let source = format!("int main(void) {{ return {text}; }}\n");
        let path = compile(
            "gcc",
            dir,
            (&format!("{name}.c"), &source),
            &["-Wl,--build-id"],
            &[],
            name,
        );
        let build_id = ElfFile::open(&path)
            .unwrap()
            .build_id()
            .expect("gcc gave it a build-id")
            .to_vec();
        Elf { path, build_id }
    }

    fn hex(&self) -> String {
        build_id_hex(&self.build_id)
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

/// The files under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

#[test]
fn cache_keeps_whole_files_and_misses() {
    let dir = tempfile::tempdir().unwrap();
    let elf = Elf::build(dir.path(), "kept", "1");
    let cache_dir = dir.path().join("cache");
    let cache = Cache::new(cache_dir.clone());
    let hex = elf.hex();
    assert_eq!(cache.lookup(&hex, &elf.build_id), Cached::Unknown);

    cache.store_missing(&hex);
    assert_eq!(cache.lookup(&hex, &elf.build_id), Cached::Missing);
    // A miss older than the cache's own lifetime for misses is asked again.
    std::fs::write(cache_dir.join("cache_miss_s"), "0\n").unwrap();
    assert_eq!(cache.lookup(&hex, &elf.build_id), Cached::Unknown);

    let stored = cache
        .store(&hex, &elf.build_id, &mut &elf.bytes()[..])
        .unwrap();
    let entry = cache_dir.join(&hex).join("debuginfo");
    assert_eq!(stored, Stored::Kept(entry.clone()));
    assert_eq!(
        cache.lookup(&hex, &elf.build_id),
        Cached::Found(entry.clone())
    );
    assert_eq!(std::fs::read(&entry).unwrap(), elf.bytes());
    assert_eq!(
        files_under(&cache_dir.join(&hex)),
        [entry],
        "a temporary was left"
    );
}

/// A body that breaks off after a few bytes.
struct BrokenBody(usize);

impl Read for BrokenBody {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0 == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "stalled"));
        }
        self.0 -= 1;
        buf[0] = b'x';
        Ok(1)
    }
}

#[test]
fn a_broken_download_leaves_nothing_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().to_path_buf());
    assert!(cache.store(BUILD_ID, &[1; 20], &mut BrokenBody(3)).is_err());
    assert_eq!(cache.lookup(BUILD_ID, &[1; 20]), Cached::Unknown);
    let left = files_under(dir.path());
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_file_with_another_build_id_is_neither_kept_nor_used_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let asked = Elf::build(dir.path(), "asked", "2");
    let other = Elf::build(dir.path(), "other", "3");
    assert_ne!(asked.build_id, other.build_id);
    let cache_dir = dir.path().join("cache");
    let cache = Cache::new(cache_dir.clone());
    let hex = asked.hex();

    let stored = cache
        .store(&hex, &asked.build_id, &mut &other.bytes()[..])
        .unwrap();
    assert_eq!(
        stored,
        Stored::Unusable(Unusable::OtherBuildId(other.build_id.clone()))
    );
    let stored = cache
        .store(&hex, &asked.build_id, &mut &b"<html>not found</html>"[..])
        .unwrap();
    assert!(
        matches!(stored, Stored::Unusable(Unusable::Unreadable(_))),
        "{stored:?}"
    );
    let left = files_under(&cache_dir);
    assert!(left.is_empty(), "something was kept: {left:?}");

    // Put there by another tool: not used, and left where it is.
    let entry = cache_dir.join(&hex).join("debuginfo");
    std::fs::write(&entry, other.bytes()).unwrap();
    let before = mismatched_count();
    assert_eq!(
        cache.lookup(&hex, &asked.build_id),
        Cached::Unusable(entry.clone())
    );
    assert!(mismatched_count() > before, "the mismatch was not counted");
    assert_eq!(std::fs::read(&entry).unwrap(), other.bytes());
}

/// A server on a loopback port that answers every request with what `answer` writes, and
/// keeps the head of every request it was sent.
fn serve(
    answer: impl Fn(&mut TcpStream) + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let seen = Arc::clone(&seen);
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let mut head = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    head.push_str(&line);
                    line.clear();
                }
                seen.lock().unwrap().push(head);
                answer(&mut stream);
            });
        }
    });
    (url, requests)
}

fn answer_with(file: Vec<u8>) -> impl Fn(&mut TcpStream) + Send + Sync + 'static {
    move |stream| {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", file.len());
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(&file);
    }
}

#[test]
fn a_server_answering_with_another_file_leaves_it_to_the_next_server() {
    let dir = tempfile::tempdir().unwrap();
    let asked = Elf::build(dir.path(), "asked", "4");
    let other = Elf::build(dir.path(), "other", "5");
    let (wrong, _) = serve(answer_with(other.bytes()));
    let (right, _) = serve(answer_with(asked.bytes()));
    let cache_dir = dir.path().join("cache");
    let before = mismatched_count();

    let client = Debuginfod::new(&[&wrong], &cache_dir, limits(DEFAULT_MAX_SIZE))
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&asked.build_id), None);
    assert!(mismatched_count() > before, "the mismatch was not counted");
    assert!(
        files_under(&cache_dir).is_empty(),
        "the wrong file was kept"
    );
    // Not a miss: the next run asks again.
    assert_eq!(
        Cache::new(cache_dir.clone()).lookup(&asked.hex(), &asked.build_id),
        Cached::Unknown
    );

    let client = Debuginfod::new(&[&wrong, &right], &cache_dir, limits(DEFAULT_MAX_SIZE))
        .unwrap()
        .unwrap();
    let path = client
        .fetch_debuginfo(&asked.build_id)
        .expect("the second server's file");
    assert_eq!(std::fs::read(&path).unwrap(), asked.bytes());
}

/// A server whose answer is over the size bound, and whether it is asked again after.
struct OverTheBound {
    what: &'static str,
    answer: fn(&mut TcpStream),
    /// Honest about its size, a server is still asked for its smaller files.
    asked_again: bool,
}

/// A stated length of 10 GiB, and a body that goes on.
fn stated_10_gib(stream: &mut TcpStream) {
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10737418240\r\n\r\n");
    while stream.write_all(&[0; 65536]).is_ok() {}
}

/// A chunked body without end, and no length.
fn endless_chunks(stream: &mut TcpStream) {
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    let chunk = [b'x'; 65536];
    while stream
        .write_all(b"10000\r\n")
        .and_then(|()| stream.write_all(&chunk))
        .and_then(|()| stream.write_all(b"\r\n"))
        .is_ok()
    {}
}

#[test]
fn an_answer_over_the_size_bound_is_dropped_before_any_byte_is_kept() {
    let cases = [
        OverTheBound {
            what: "a stated size over the bound",
            answer: stated_10_gib,
            asked_again: true,
        },
        OverTheBound {
            what: "an endless body",
            answer: endless_chunks,
            asked_again: false,
        },
    ];
    for (n, case) in (6..).zip(cases) {
        let (url, requests) = serve(case.answer);
        let dir = tempfile::tempdir().unwrap();
        let client = Debuginfod::new(&[&url], dir.path(), limits(1 << 20))
            .unwrap()
            .unwrap();
        let start = Instant::now();
        assert_eq!(client.fetch_debuginfo(&[n; 20]), None, "{}", case.what);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}: {:?}",
            case.what,
            start.elapsed()
        );
        assert!(files_under(dir.path()).is_empty(), "{}", case.what);
        assert_eq!(
            client.session.budget(&url).is_ok(),
            case.asked_again,
            "{}: whether the server is asked again",
            case.what
        );
        let head = requests.lock().unwrap()[0].to_ascii_lowercase();
        assert!(
            head.contains("x-debuginfod-maxsize: 1048576\r\n"),
            "{}: {head}",
            case.what
        );
    }
}

#[test]
fn debuginfod_maxsize_is_read_as_elfutils_reads_it_with_a_default_bound() {
    let size = |value: Option<&str>| {
        Limits::from_vars(|name| {
            (name == "DEBUGINFOD_MAXSIZE")
                .then_some(value)
                .flatten()
                .map(str::to_string)
        })
        .size
    };
    assert_eq!(size(Some("1000")), 1000);
    // elfutils has no bound for these; stackscope keeps its own.
    assert_eq!(size(None), DEFAULT_MAX_SIZE);
    assert_eq!(size(Some("0")), DEFAULT_MAX_SIZE);
    assert_eq!(size(Some("-5")), DEFAULT_MAX_SIZE);
    assert_eq!(size(Some("lots")), DEFAULT_MAX_SIZE);
}

#[test]
fn no_servers_is_no_client_and_a_bad_url_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::from_env();
    assert!(Debuginfod::new(&[], dir.path(), limits).unwrap().is_none());
    assert!(Debuginfod::new(&["not a url"], dir.path(), limits).is_err());
}

/// A closed port fails at once, is said once, and is not asked again; the cache is read
/// first, so a cached file needs no server at all.
#[test]
fn an_unreachable_server_is_asked_once() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let cache_dir = dir.path().join("cache");
    let client = Debuginfod::new(&[&url], &cache_dir, limits(DEFAULT_MAX_SIZE))
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&[1; 20]), None);
    assert!(
        client.session.budget(&url).is_err(),
        "{url} was not marked down"
    );
    // Not a miss: an unreachable server says nothing about whether it has the file.
    let cache = Cache::new(cache_dir.clone());
    assert_eq!(cache.lookup(&"01".repeat(20), &[1; 20]), Cached::Unknown);

    let elf = Elf::build(dir.path(), "cached", "8");
    let cached = cache
        .store(&elf.hex(), &elf.build_id, &mut &elf.bytes()[..])
        .unwrap();
    let Stored::Kept(cached) = cached else {
        panic!("{cached:?}")
    };
    assert_eq!(client.fetch_debuginfo(&elf.build_id), Some(cached));
}

/// A Ctrl-C that only ended sampling leaves the fetching after it alone; one that stops naming
/// stops the fetching under way. Naming's stop is the process's own, so this runs alone in a
/// process of its own: the test binary again, with only this test.
#[test]
fn ctrl_c_stops_fetching_only_once_naming_is_told_to_stop() {
    use super::session::Session;
    use crate::interrupt;

    const ALONE: &str = "STACKSCOPE_NAMING_STOP_TEST_ALONE";
    const NAME: &str = "debuginfod::tests::ctrl_c_stops_fetching_only_once_naming_is_told_to_stop";
    if std::env::var_os(ALONE).is_none() {
        let run = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success() && stdout.contains("1 passed"),
            "{}\n{stdout}\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
        return;
    }

    let limits = Limits::from_env();
    interrupt::sampling_ended();
    let session = Session::new(limits);
    session.begin("after a stopped recording");
    assert!(session.budget("http://server").is_ok());

    interrupt::stop_naming();
    assert!(session.budget("http://server").is_err());
}

/// Past the bound for all fetching, nothing more is asked.
#[test]
fn the_overall_bound_ends_fetching() {
    use super::session::Session;

    let session = Session::new(Limits {
        start: None,
        file: Some(Duration::from_secs(7)),
        overall: Duration::from_secs(3600),
        size: DEFAULT_MAX_SIZE,
    });
    session.begin("first");
    assert_eq!(session.budget("http://server"), Ok(Duration::from_secs(7)));
    let session = Session::new(Limits {
        start: None,
        file: None,
        overall: Duration::ZERO,
        size: DEFAULT_MAX_SIZE,
    });
    session.begin("first");
    assert!(session.budget("http://server").is_err());
}

/// A server that takes connections and never answers is given up on at the timeout, and not
/// asked again.
#[test]
fn a_server_that_never_answers_is_given_up_on() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        start: Some(Duration::from_secs(1)),
        file: None,
        overall: Duration::from_secs(600),
        size: DEFAULT_MAX_SIZE,
    };
    let client = Debuginfod::new(&[&url], dir.path(), limits)
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&[3; 20]), None);
    assert!(
        client.session.budget(&url).is_err(),
        "{url} was not marked down"
    );
}

/// A cache that cannot be written stops fetching before any server is asked, and is not
/// taken for a server that cannot be reached.
#[test]
fn an_unwritable_cache_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let url = "http://127.0.0.1:9";
    let client = Debuginfod::new(&[url], &not_a_dir, Limits::from_env())
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&[4; 20]), None);
    assert!(client.session.budget(url).is_ok(), "the server was asked");
}
