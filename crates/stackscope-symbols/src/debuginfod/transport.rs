//! The HTTP transport under the `debuginfod` crate's client: requests with elfutils'
//! timeouts, servers that failed remembered (and named once), and each answer's bytes
//! counted on the progress display as they are read.

use std::fmt;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use debuginfod::{HttpClient, HttpClientError, Readable};
use ureq::http::StatusCode;
use ureq::BodyReader;

use super::progress::Progress;
use super::Timeouts;

/// What one process has learnt of its servers, shared by the transport and the fetching.
#[derive(Debug)]
pub(crate) struct Session {
    timeouts: Timeouts,
    /// When the first fetch began: the overall bound counts from there.
    began: OnceLock<Instant>,
    /// Set by Ctrl-C, and whether it was set when fetching began: a Ctrl-C that stopped
    /// the recording must not stop the fetching that follows; one during it does.
    stop: OnceLock<Arc<AtomicBool>>,
    stop_at_start: OnceLock<bool>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Servers that could not be reached, not asked again.
    down: Vec<String>,
    /// Servers already named in a warning.
    warned: Vec<String>,
    /// What is being fetched, in words: the library's client hands the transport only a URL.
    fetching: String,
    progress: Option<Progress>,
    overall_said: bool,
    interrupt_said: bool,
}

impl State {
    /// Prints `line` on stderr, around the progress bar if one shows.
    fn say(&self, line: &str) {
        match &self.progress {
            Some(progress) => progress.say(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Session {
    pub(crate) fn new(timeouts: Timeouts) -> Self {
        Session {
            timeouts,
            began: OnceLock::new(),
            stop: OnceLock::new(),
            stop_at_start: OnceLock::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// Fetching stops when `stop` is set after it began.
    pub(crate) fn stop_on(&self, stop: Arc<AtomicBool>) {
        let _ = self.stop.set(stop);
    }

    /// Whether Ctrl-C came since fetching began; the first time it did, says so.
    pub(crate) fn interrupted(&self) -> bool {
        let interrupted = self.stop.get().is_some_and(|flag| {
            let now = flag.load(Ordering::Relaxed);
            let at_start = *self.stop_at_start.get_or_init(|| now);
            now && !at_start
        });
        if interrupted {
            let mut state = self.state();
            if !std::mem::replace(&mut state.interrupt_said, true) {
                state.say(
                    "stackscope: debuginfod: fetching stopped at Ctrl-C; the profile keeps \
                     the names it has",
                );
            }
        }
        interrupted
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding it left nothing half-done that matters here.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fetch of what `name` says begins.
    pub(crate) fn begin(&self, name: &str) {
        self.began.get_or_init(Instant::now);
        self.interrupted();
        self.state().fetching = name.to_string();
    }

    /// A fetch ended.
    pub(crate) fn end(&self) {
        if let Some(progress) = self.state().progress.take() {
            progress.finish();
        }
    }

    /// How long a request to `server` may take, or why it is not made.
    pub(super) fn budget(&self, server: &str) -> Result<Duration, String> {
        if self.interrupted() {
            return Err("stopped at Ctrl-C".to_string());
        }
        let mut state = self.state();
        if state.down.iter().any(|s| s == server) {
            return Err(format!("{server} could not be reached before"));
        }
        let spent = self.began.get().map_or(Duration::ZERO, Instant::elapsed);
        let Some(left) = self
            .timeouts
            .overall
            .checked_sub(spent)
            .filter(|l| !l.is_zero())
        else {
            if !std::mem::replace(&mut state.overall_said, true) {
                state.say(&format!(
                    "stackscope: warning: debuginfod: stopped fetching debug info after {} s, \
                     the bound for all fetching; the binaries not yet fetched keep the names \
                     they have",
                    self.timeouts.overall.as_secs()
                ));
            }
            return Err("the bound for all fetching was reached".to_string());
        };
        Ok(self.timeouts.file.map_or(left, |file| file.min(left)))
    }

    /// `server` cannot be reached: said once, and not asked again.
    fn mark_down(&self, server: &str, why: &dyn fmt::Display) {
        self.warn(
            server,
            &format!("cannot be reached ({why}); debug info from it is left out"),
        );
        let mut state = self.state();
        if !state.down.iter().any(|s| s == server) {
            state.down.push(server.to_string());
        }
    }

    /// A download from `server` of the debug info of `name` broke off: said once, and the
    /// server not asked again, since what broke this one would cost the next one as much.
    pub(crate) fn warn_download(&self, server: &str, name: &str, why: &io::Error) {
        let server = server.trim_end_matches('/');
        self.mark_down(server, &format!("fetching the debug info of {name}: {why}"));
    }

    /// One warning per server, whatever else goes wrong with it later.
    fn warn(&self, server: &str, what: &str) {
        let mut state = self.state();
        if state.warned.iter().any(|s| s == server) {
            return;
        }
        state.warned.push(server.to_string());
        state.say(&format!(
            "stackscope: warning: debuginfod server {server} {what}"
        ));
    }

    fn start_progress(&self, server: &str, length: Option<u64>) -> Progress {
        let mut state = self.state();
        let progress = Progress::start(&state.fetching, server, length);
        state.progress = Some(progress.clone());
        progress
    }
}

/// Requests over a blocking HTTP agent configured with the session's timeouts.
pub(crate) struct Transport {
    agent: ureq::Agent,
    session: Arc<Session>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport").finish_non_exhaustive()
    }
}

impl Transport {
    pub(crate) fn new(session: Arc<Session>) -> Self {
        let start = session.timeouts.start;
        let config = ureq::Agent::config_builder()
            .timeout_resolve(start)
            .timeout_connect(start)
            .timeout_recv_response(start)
            // A server that stops sending mid-file is given up on as one that never started.
            .timeout_per_read(start)
            .user_agent(concat!("stackscope/", env!("CARGO_PKG_VERSION")))
            .build();
        Transport {
            agent: ureq::Agent::new_with_config(config),
            session,
        }
    }
}

impl HttpClient for Transport {
    fn get(&self, url: &str) -> Result<Box<dyn Readable>, HttpClientError> {
        let server = server_of(url);
        let other = |e: String| HttpClientError::Other(e.into());
        let budget = self.session.budget(server).map_err(other)?;
        let request = self.agent.get(url).config().timeout_global(Some(budget));
        match request.build().call() {
            Ok(response) => {
                let length = response.body().content_length();
                let progress = self.session.start_progress(server, length);
                Ok(Box::new(Download {
                    body: response.into_body().into_reader(),
                    progress,
                    session: Arc::clone(&self.session),
                }))
            }
            Err(ureq::Error::StatusCode(code)) => {
                let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
                // Not found is the ordinary answer for a binary the server does not index.
                if status != StatusCode::NOT_FOUND {
                    self.session.warn(
                        server,
                        &format!("answered {status}; its debug info is left out"),
                    );
                }
                Err(HttpClientError::StatusCode(status))
            }
            Err(e) => {
                self.session.mark_down(server, &e);
                Err(other(e.to_string()))
            }
        }
    }
}

/// The server part of a request URL (the crate puts `/buildid/...` right after it).
fn server_of(url: &str) -> &str {
    url.find("/buildid/").map_or(url, |at| &url[..at])
}

/// An answer's body, counted on the progress display as it is read.
struct Download {
    body: BodyReader<'static>,
    progress: Progress,
    session: Arc<Session>,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download").finish_non_exhaustive()
    }
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.session.interrupted() {
            // Not ErrorKind::Interrupted, which readers retry.
            return Err(io::Error::other("stopped at Ctrl-C"));
        }
        let n = self.body.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}
