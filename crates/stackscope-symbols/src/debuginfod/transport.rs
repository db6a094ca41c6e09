//! The HTTP transport under the `debuginfod` crate's client: requests with elfutils'
//! timeouts and size bound, within what the [`Session`] allows, and each answer's bytes
//! counted as they are read, on the progress display and against the size bound.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;

use debuginfod::{HttpClient, HttpClientError, Readable};
use ureq::http::StatusCode;
use ureq::BodyReader;

use super::progress::Progress;
use super::session::Session;

/// Requests over a blocking HTTP agent configured with the session's timeouts. Clones share
/// the agent and the session.
#[derive(Clone)]
pub(super) struct Transport {
    agent: ureq::Agent,
    session: Arc<Session>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport").finish_non_exhaustive()
    }
}

impl Transport {
    pub(super) fn new(session: Arc<Session>) -> Self {
        let start = session.limits.start;
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
        let max_size = self.session.limits.size;
        let request = self.agent.get(url).config().timeout_global(Some(budget));
        // elfutils' header: its server answers 406 rather than send a larger file.
        let request = request
            .build()
            .header("X-DEBUGINFOD-MAXSIZE", max_size.to_string());
        match request.call() {
            Ok(response) => {
                // elfutils' client reads the size from X-Debuginfod-Size without a length.
                let length = response.body().content_length().or_else(|| {
                    let size = response.headers().get("x-debuginfod-size")?;
                    size.to_str().ok()?.trim().parse().ok()
                });
                if let Some(length) = length.filter(|&l| l > max_size) {
                    // Dropping the answer unread closes its connection.
                    self.session.warn_too_large(server, Some(length));
                    return Err(other(format!("{length} bytes, over the size bound")));
                }
                let progress = self.session.start_progress(server, length);
                Ok(Box::new(Download {
                    body: response.into_body().into_reader(),
                    progress,
                    session: Arc::clone(&self.session),
                    server: server.to_string(),
                    left: max_size,
                }))
            }
            Err(ureq::Error::StatusCode(code)) => {
                let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
                match status {
                    // Not found is the ordinary answer for a binary the server does not index.
                    StatusCode::NOT_FOUND => {}
                    StatusCode::NOT_ACCEPTABLE => self.session.warn_too_large(server, None),
                    _ => self.session.warn(
                        server,
                        &format!("answered {status}; its debug info is left out"),
                    ),
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

/// An answer's body, counted on the progress display and against the size bound as it is
/// read.
struct Download {
    body: BodyReader<'static>,
    progress: Progress,
    session: Arc<Session>,
    server: String,
    /// How many more bytes the size bound allows.
    left: u64,
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
        // Only a body of unstated size passes the bound: ureq reads no further than a length.
        match self.left.checked_sub(n as u64) {
            Some(left) => self.left = left,
            None => {
                self.session.give_up_endless(&self.server);
                return Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    "more than the size bound",
                ));
            }
        }
        self.progress.advance(n as u64);
        Ok(n)
    }
}
