use std::io::{self, Read};
use std::net::TcpListener;
use std::time::Duration;

use super::cache::{Cache, Cached};
use super::{Debuginfod, Timeouts};

const BUILD_ID: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn cache_keeps_whole_files_and_misses() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().to_path_buf());
    assert_eq!(cache.lookup(BUILD_ID), Cached::Unknown);

    cache.store_missing(BUILD_ID);
    assert_eq!(cache.lookup(BUILD_ID), Cached::Missing);
    // A miss older than the cache's own lifetime for misses is asked again.
    std::fs::write(dir.path().join("cache_miss_s"), "0\n").unwrap();
    assert_eq!(cache.lookup(BUILD_ID), Cached::Unknown);

    let stored = cache.store(BUILD_ID, &mut &b"\x7fELF debug"[..]).unwrap();
    assert_eq!(stored, dir.path().join(BUILD_ID).join("debuginfo"));
    assert_eq!(cache.lookup(BUILD_ID), Cached::Found(stored.clone()));
    assert_eq!(std::fs::read(&stored).unwrap(), b"\x7fELF debug");
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
    assert!(cache.store(BUILD_ID, &mut BrokenBody(3)).is_err());
    assert_eq!(cache.lookup(BUILD_ID), Cached::Unknown);
    let left: Vec<_> = std::fs::read_dir(dir.path().join(BUILD_ID))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn no_servers_is_no_client_and_a_bad_url_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let timeouts = Timeouts::from_env();
    assert!(Debuginfod::new(&[], dir.path(), timeouts)
        .unwrap()
        .is_none());
    assert!(Debuginfod::new(&["not a url"], dir.path(), timeouts).is_err());
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
    let timeouts = Timeouts {
        start: Some(Duration::from_secs(30)),
        file: None,
        overall: Duration::from_secs(60),
    };
    let url = format!("http://127.0.0.1:{port}");
    let client = Debuginfod::new(&[&url], dir.path(), timeouts)
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&[1; 20]), None);
    assert!(
        client.session.budget(&url).is_err(),
        "{url} was not marked down"
    );
    // Not a miss: an unreachable server says nothing about whether it has the file.
    let cache = Cache::new(dir.path().to_path_buf());
    assert_eq!(cache.lookup(&"01".repeat(20)), Cached::Unknown);

    let cached = cache.store(&"02".repeat(20), &mut &b"debug"[..]).unwrap();
    assert_eq!(client.fetch_debuginfo(&[2; 20]), Some(cached));
}

/// A Ctrl-C that stopped the recording leaves the fetching after it alone; one during the
/// fetching stops it.
#[test]
fn ctrl_c_stops_fetching_only_once_it_began() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::session::Session;

    let timeouts = Timeouts::from_env();
    let stop = Arc::new(AtomicBool::new(true));
    let session = Session::new(timeouts);
    session.stop_on(Arc::clone(&stop));
    session.begin("after a stopped recording");
    assert!(session.budget("http://server").is_ok());

    let stop = Arc::new(AtomicBool::new(false));
    let session = Session::new(timeouts);
    session.stop_on(Arc::clone(&stop));
    session.begin("first");
    assert!(session.budget("http://server").is_ok());
    stop.store(true, Ordering::Relaxed);
    assert!(session.budget("http://server").is_err());
}

/// Past the bound for all fetching, nothing more is asked.
#[test]
fn the_overall_bound_ends_fetching() {
    use super::session::Session;

    let session = Session::new(Timeouts {
        start: None,
        file: Some(Duration::from_secs(7)),
        overall: Duration::from_secs(3600),
    });
    session.begin("first");
    assert_eq!(session.budget("http://server"), Ok(Duration::from_secs(7)));
    let session = Session::new(Timeouts {
        start: None,
        file: None,
        overall: Duration::ZERO,
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
    let timeouts = Timeouts {
        start: Some(Duration::from_secs(1)),
        file: None,
        overall: Duration::from_secs(600),
    };
    let client = Debuginfod::new(&[&url], dir.path(), timeouts)
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
    let client = Debuginfod::new(&[url], &not_a_dir, Timeouts::from_env())
        .unwrap()
        .unwrap();
    assert_eq!(client.fetch_debuginfo(&[4; 20]), None);
    assert!(client.session.budget(url).is_ok(), "the server was asked");
}
