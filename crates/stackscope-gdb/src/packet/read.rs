//! Waiting for what the stub sends: reading into the connection's buffer until a token is
//! whole or the deadline passes, and saying why a wait failed (timeout, cut at the end of the
//! recording, the stub gone).

use std::io;
use std::time::{Duration, Instant};

use super::{io_error, scan, Connection, Scan, Stream, Token};
use crate::error::{shown, shown_part, Error, SHOWN_MAX};

/// What [`Connection::next`] found, owned so the connection can act on it.
pub(super) enum Next {
    Ack,
    Nak,
    Packet {
        notification: bool,
        checksum_ok: bool,
        len: usize,
    },
    Noise(u8),
}

/// Bytes skipped outside packets while waiting, kept in part for error messages.
#[derive(Default)]
pub(super) struct Noise {
    kept: Vec<u8>,
    total: usize,
}

impl Noise {
    pub(super) fn push(&mut self, b: u8) {
        if self.kept.len() < SHOWN_MAX {
            self.kept.push(b);
        }
        self.total += 1;
    }
}

impl<S: Stream> Connection<S> {
    /// The next token of what the stub sent, reading until `deadline` when it is incomplete;
    /// the token stays unread (at `pos`) for the caller to take.
    pub(super) fn next(&mut self, deadline: Instant, noise: &Noise) -> Result<Next, Error> {
        loop {
            match scan(&self.buf[self.pos..], self.max_packet) {
                Scan::Token(token, len) => {
                    return Ok(match token {
                        Token::Ack => Next::Ack,
                        Token::Nak => Next::Nak,
                        Token::Noise(b) => Next::Noise(b),
                        Token::Packet {
                            notification,
                            checksum_ok,
                            ..
                        } => Next::Packet {
                            notification,
                            checksum_ok,
                            len,
                        },
                    })
                }
                Scan::TooLong => {
                    let got = shown(&self.buf[self.pos..]);
                    self.buf.clear();
                    self.pos = 0;
                    return Err(Error::TooLong {
                        peer: self.peer.clone(),
                        sent: self.sent(),
                        max: self.max_packet,
                        got,
                    });
                }
                Scan::Incomplete => self.fill(deadline, noise)?,
            }
        }
    }

    /// Reads more bytes before `deadline`, after those not taken yet.
    fn fill(&mut self, deadline: Instant, noise: &Noise) -> Result<(), Error> {
        // A stub may wait for them before it sends more.
        self.pay_acks()?;
        self.buf.drain(..self.pos);
        self.pos = 0;
        let mut chunk = [0u8; 4096];
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(self.ran_out(noise));
            }
            let (least, patience) = self.batch.want(now, chunk.len());
            self.wait_for_at_least(least);
            // A zero timeout means "block forever" to sockets.
            let bound = patience.map_or(deadline, |until| until.min(deadline));
            let wait = bound
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            let result = self
                .stream
                .set_read_timeout(wait)
                .and_then(|()| self.stream.read(&mut chunk));
            match result {
                Ok(0) => {
                    return Err(Error::Closed {
                        peer: self.peer.clone(),
                        sent: shown(&self.last),
                        got: self.got(noise),
                    });
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.batch.arrived(n);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if patience.is_none() {
                        return Err(self.ran_out(noise));
                    }
                    // Waiting for the whole batch ran out of patience: read what comes.
                    self.batch.give_up();
                }
                Err(source) => {
                    let got = self.buf.clone();
                    return Err(io_error(&self.peer, &self.last, &got, source));
                }
            }
        }
    }

    /// Has reads wait for `least` bytes, as the batch's guess asks.
    fn wait_for_at_least(&mut self, least: usize) {
        if least != self.min_read {
            // A stream that cannot wait for more wakes for each reply: slower, no worse.
            self.min_read = if self.stream.set_min_read(least).is_ok() {
                least
            } else {
                1
            };
        }
    }

    /// The error of a wait that ran out: cut at the end of the recording, else a timeout.
    fn ran_out(&self, noise: &Noise) -> Error {
        if self.end.is_some_and(|end| end <= Instant::now()) {
            Error::Cut {
                peer: self.peer.clone(),
                sent: shown(&self.last),
                got: self.got(noise),
            }
        } else {
            Error::Timeout {
                peer: self.peer.clone(),
                sent: shown(&self.last),
                got: self.got(noise),
                secs: self.timeout.as_secs_f64(),
            }
        }
    }

    /// What came of a wait, for an error: the bytes not taken yet, else the noise skipped.
    fn got(&self, noise: &Noise) -> String {
        if self.buf.is_empty() {
            shown_part(&noise.kept, noise.total)
        } else {
            shown(&self.buf)
        }
    }
}
