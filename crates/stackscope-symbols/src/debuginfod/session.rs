//! What one process has learnt of its debuginfod servers while fetching: which could not be
//! reached (named once, not asked again), how much of the overall bound is left, and what the
//! user is shown meanwhile. Whether to stop is naming's ([`crate::interrupt`]): a fetch is a
//! step of naming, and stops when naming is told to.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::progress::Progress;
use super::Limits;
use crate::interrupt;

/// What one process has learnt of its servers, shared by the transport and the fetching.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) limits: Limits,
    /// When the first fetch began: the overall bound counts from there.
    began: OnceLock<Instant>,
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
    cache_said: bool,
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
    pub(super) fn new(limits: Limits) -> Self {
        Session {
            limits,
            began: OnceLock::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// Whether naming was told to stop (a Ctrl-C that only ended sampling does not tell it);
    /// the first time it was, says so.
    pub(super) fn interrupted(&self) -> bool {
        let interrupted = interrupt::interrupted();
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
    pub(super) fn begin(&self, name: &str) {
        self.began.get_or_init(Instant::now);
        self.state().fetching = name.to_string();
    }

    /// A fetch ended.
    pub(super) fn end(&self) {
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
            .limits
            .overall
            .checked_sub(spent)
            .filter(|l| !l.is_zero())
        else {
            if !std::mem::replace(&mut state.overall_said, true) {
                state.say(&format!(
                    "stackscope: warning: debuginfod: stopped fetching debug info after {} s, \
                     the bound for all fetching; the binaries not yet fetched keep the names \
                     they have",
                    self.limits.overall.as_secs()
                ));
            }
            return Err("the bound for all fetching was reached".to_string());
        };
        Ok(self.limits.file.map_or(left, |file| file.min(left)))
    }

    /// `server` cannot be reached: said once, and not asked again.
    pub(super) fn mark_down(&self, server: &str, why: &dyn fmt::Display) {
        self.give_up(
            server,
            &format!("cannot be reached ({why}); debug info from it is left out"),
        );
    }

    /// `server` is not asked again, for the reason `what` says (once).
    fn give_up(&self, server: &str, what: &str) {
        self.warn(server, what);
        let mut state = self.state();
        if !state.down.iter().any(|s| s == server) {
            state.down.push(server.to_string());
        }
    }

    /// `server` has the file being fetched only over the size bound: `stated` bytes, when it
    /// said how many (else it answered 406, refusing the bound it was sent). Said once; its
    /// other files may be smaller.
    pub(super) fn warn_too_large(&self, server: &str, stated: Option<u64>) {
        let (size, how) = match stated {
            Some(length) => (format!(" as {length} bytes,"), ""),
            None => (String::new(), "; it answered 406"),
        };
        let what = format!(
            "has the debug info of {} only{size} over the bound of {} bytes \
             (DEBUGINFOD_MAXSIZE{how}); it is left out",
            self.state().fetching,
            self.limits.size
        );
        self.warn(server, &what);
    }

    /// `server` sent more than the size bound, having not stated as much: said once, and
    /// not asked again, since every file from it could cost as much.
    pub(super) fn give_up_endless(&self, server: &str) {
        let what = format!(
            "sent more than {} bytes (DEBUGINFOD_MAXSIZE) of the debug info of {}; the \
             download is dropped and the server not asked again",
            self.limits.size,
            self.state().fetching
        );
        self.give_up(server, &what);
    }

    /// A download from `server` of the debug info of `name` broke off: said once, and the
    /// server not asked again, since what broke this one would cost the next one as much.
    pub(super) fn warn_download(&self, server: &str, name: &str, why: &io::Error) {
        let server = server.trim_end_matches('/');
        self.mark_down(server, &format!("fetching the debug info of {name}: {why}"));
    }

    /// The cache at `dir` cannot be written: said once; nothing is fetched without it.
    pub(super) fn warn_cache(&self, dir: &Path, why: &io::Error) {
        let mut state = self.state();
        if !std::mem::replace(&mut state.cache_said, true) {
            state.say(&format!(
                "stackscope: warning: debuginfod: cannot keep debug files in {} ({why}); \
                 none is fetched",
                dir.display()
            ));
        }
    }

    /// One warning per server, whatever else goes wrong with it later.
    pub(super) fn warn(&self, server: &str, what: &str) {
        let mut state = self.state();
        if state.warned.iter().any(|s| s == server) {
            return;
        }
        state.warned.push(server.to_string());
        state.say(&format!(
            "stackscope: warning: debuginfod server {server} {what}"
        ));
    }

    pub(super) fn start_progress(&self, server: &str, length: Option<u64>) -> Progress {
        let mut state = self.state();
        let progress = Progress::start(&state.fetching, server, length);
        state.progress = Some(progress.clone());
        progress
    }
}
