//! The packet layer of the GDB remote protocol over any byte stream: `$data#cs` framing,
//! checksums, `+`/`-` acknowledgements with retransmission, run-length decoding of replies,
//! binary escapes, `%` notifications (skipped), and a deadline on every reply.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::error::{shown, Error};

/// A byte stream whose reads can time out: a socket, or recorded bytes in tests.
pub trait Stream: Read + Write {
    /// Makes a read that waits longer than `timeout` fail with `WouldBlock` or `TimedOut`.
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl Stream for TcpStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        TcpStream::set_read_timeout(self, Some(timeout))
    }
}

impl Stream for UnixStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        UnixStream::set_read_timeout(self, Some(timeout))
    }
}

impl<S: Stream + ?Sized> Stream for Box<S> {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        (**self).set_read_timeout(timeout)
    }
}

/// How often a packet is sent again after the other side reported a bad checksum.
const MAX_RETRIES: u32 = 3;

/// One end of a GDB remote protocol connection.
pub struct Connection<S> {
    stream: S,
    buf: Vec<u8>,
    pos: usize,
    /// Whether packets are acknowledged (until `QStartNoAckMode` is accepted).
    ack: bool,
    timeout: Duration,
    /// The last packet as framed on the wire, to retransmit and to name in errors.
    last: Vec<u8>,
}

impl<S: Stream> Connection<S> {
    pub fn new(stream: S, timeout: Duration) -> Self {
        Connection {
            stream,
            buf: Vec::with_capacity(4096),
            pos: 0,
            ack: true,
            timeout,
            last: Vec::new(),
        }
    }

    /// Whether packets are still acknowledged.
    pub fn acks(&self) -> bool {
        self.ack
    }

    /// Stops sending and expecting `+`/`-` (after the stub accepted `QStartNoAckMode`).
    pub fn disable_acks(&mut self) {
        self.ack = false;
    }

    /// The stream, for whoever needs it after the conversation.
    pub fn into_inner(self) -> S {
        self.stream
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The last packet sent, for error messages.
    pub fn sent(&self) -> String {
        shown(&self.last)
    }

    /// Sends a packet and, in acknowledged mode, waits for its `+`.
    pub fn send(&mut self, data: &[u8]) -> Result<(), Error> {
        self.last = frame(data);
        self.write_last()?;
        if !self.ack {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        let mut retries = 0;
        let mut got = Vec::new();
        loop {
            let b = self.read_byte(deadline, &got)?;
            match b {
                b'+' => return Ok(()),
                b'-' if retries < MAX_RETRIES => {
                    retries += 1;
                    self.write_last()?;
                }
                b'-' => {
                    return Err(self.malformed(b"-", "the stub rejected the packet's checksum"));
                }
                b'$' | b'%' => {
                    // A stub may skip the ack before a reply; keep the byte for `receive`.
                    self.pos -= 1;
                    return Ok(());
                }
                _ => got.push(b),
            }
        }
    }

    /// Sends packets and returns their replies in order (`E NN` included, for the caller to
    /// judge). Without acks all go out in one write: one round trip however many there are.
    /// An error names the packet whose reply failed.
    pub fn exchange(&mut self, packets: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
        let mut replies = Vec::with_capacity(packets.len());
        if self.ack {
            for packet in packets {
                self.send(packet)?;
                replies.push(self.receive()?);
            }
            return Ok(replies);
        }
        let framed: Vec<Vec<u8>> = packets.iter().map(|p| frame(p)).collect();
        self.last = framed.concat();
        self.write_last()?;
        for packet in framed {
            self.last = packet;
            replies.push(self.receive()?);
        }
        Ok(replies)
    }

    /// Sends one raw byte that is not a packet (the `0x03` interrupt).
    pub fn send_raw(&mut self, byte: u8) -> Result<(), Error> {
        self.last = vec![byte];
        self.write_last()
    }

    /// Receives the next packet's data, run-length decoded (still escaped: see [`unescape`]).
    /// Notifications (`%...#cs`) and stray acks are skipped.
    pub fn receive(&mut self) -> Result<Vec<u8>, Error> {
        let deadline = Instant::now() + self.timeout;
        let mut retries = 0;
        loop {
            let mut raw = Vec::new();
            // Find the start of a packet.
            let notification = loop {
                match self.read_byte(deadline, &raw)? {
                    b'$' => break false,
                    b'%' => break true,
                    // The stub garbled our packet: it waits for it again.
                    b'-' if self.ack => self.write_last()?,
                    b'+' | b'-' => {}
                    other => raw.push(other),
                }
            };
            raw.clear();
            raw.push(if notification { b'%' } else { b'$' });
            loop {
                let b = self.read_byte(deadline, &raw)?;
                raw.push(b);
                if b == b'#' {
                    break;
                }
            }
            let c1 = self.read_byte(deadline, &raw)?;
            raw.push(c1);
            let c2 = self.read_byte(deadline, &raw)?;
            raw.push(c2);
            let body = &raw[1..raw.len() - 3];
            let stated = hex_digit(c1).zip(hex_digit(c2)).map(|(h, l)| (h << 4) | l);
            if stated != Some(checksum(body)) {
                if self.ack && retries < MAX_RETRIES {
                    retries += 1;
                    self.write(b"-")?;
                    continue;
                }
                return Err(self.malformed(&raw, "bad checksum"));
            }
            if self.ack {
                self.write(b"+")?;
            }
            if notification {
                continue;
            }
            return expand_runs(body)
                .ok_or_else(|| self.malformed(&raw, "bad run-length encoding"));
        }
    }

    /// Sends a packet and returns its reply; `E NN` replies become [`Error::Stub`].
    pub fn request(&mut self, data: &[u8]) -> Result<Vec<u8>, Error> {
        self.send(data)?;
        let reply = self.receive()?;
        if let Some(code) = error_code(&reply) {
            return Err(Error::Stub {
                sent: self.sent(),
                code,
            });
        }
        Ok(reply)
    }

    /// An error naming the last packet sent and what came back.
    pub fn malformed(&self, got: &[u8], why: &'static str) -> Error {
        Error::Malformed {
            sent: self.sent(),
            got: shown(got),
            why,
        }
    }

    fn write_last(&mut self) -> Result<(), Error> {
        let last = std::mem::take(&mut self.last);
        let result = self.write(&last);
        self.last = last;
        result
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
            .map_err(|source| io_error(&self.last, b"", source))
    }

    /// One byte before `deadline`; `got` is what the caller has received of this reply so
    /// far, for the error message.
    fn read_byte(&mut self, deadline: Instant, got: &[u8]) -> Result<u8, Error> {
        if self.pos == self.buf.len() {
            self.fill(deadline, got)?;
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn fill(&mut self, deadline: Instant, got: &[u8]) -> Result<(), Error> {
        self.buf.clear();
        self.pos = 0;
        self.buf.resize(self.buf.capacity().max(4096), 0);
        loop {
            let now = Instant::now();
            let timeout = || Error::Timeout {
                sent: shown(&self.last),
                got: shown(got),
                secs: self.timeout.as_secs_f64(),
            };
            if now >= deadline {
                self.buf.clear();
                return Err(timeout());
            }
            // A zero timeout means "block forever" to sockets.
            let wait = (deadline - now).max(Duration::from_millis(1));
            let result = self
                .stream
                .set_read_timeout(wait)
                .and_then(|()| self.stream.read(&mut self.buf));
            match result {
                Ok(0) => {
                    self.buf.clear();
                    return Err(Error::Closed {
                        sent: shown(&self.last),
                        got: shown(got),
                    });
                }
                Ok(n) => {
                    self.buf.truncate(n);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.buf.clear();
                    return Err(timeout());
                }
                Err(source) => {
                    self.buf.clear();
                    return Err(io_error(&self.last, got, source));
                }
            }
        }
    }
}

/// A failed read or write: a reset or broken connection is the stub going away.
fn io_error(sent: &[u8], got: &[u8], source: io::Error) -> Error {
    match source.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Error::Closed {
            sent: shown(sent),
            got: shown(got),
        },
        _ => Error::Io {
            sent: shown(sent),
            error: source,
        },
    }
}

/// `$data#cs`, with the bytes that would end or confuse the framing escaped.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 4);
    out.push(b'$');
    for &b in data {
        if matches!(b, b'$' | b'#' | b'}' | b'*') {
            out.push(b'}');
            out.push(b ^ 0x20);
        } else {
            out.push(b);
        }
    }
    let cs = checksum(&out[1..]);
    out.push(b'#');
    out.extend_from_slice(format!("{cs:02x}").as_bytes());
    out
}

/// The modulo-256 sum of a packet's bytes between `$` and `#`.
pub fn checksum(body: &[u8]) -> u8 {
    body.iter().fold(0u8, |sum, &b| sum.wrapping_add(b))
}

/// Expands run-length encoding: `X*N` stands for `X` followed by `N - 29` more `X`s.
/// `None` when a `*` has no character before it or a count out of range.
pub fn expand_runs(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b == b'*' {
            let count = *body.get(i + 1)?;
            let &last = out.last()?;
            let repeat = usize::from(count).checked_sub(29).filter(|&n| n > 0)?;
            out.extend(std::iter::repeat_n(last, repeat));
            i += 2;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

/// Undoes the binary escape (`}` then the byte xor 0x20) of binary replies (`x`, `qXfer`).
/// `None` when the data ends in a lone `}`.
pub fn unescape(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len());
    let mut bytes = data.iter();
    while let Some(&b) = bytes.next() {
        if b == b'}' {
            out.push(bytes.next()? ^ 0x20);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// `Some("NN")` for an `E NN` error reply.
pub fn error_code(reply: &[u8]) -> Option<String> {
    match reply {
        [b'E', a, b] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
            Some(String::from_utf8_lossy(&reply[1..]).into_owned())
        }
        // Textual errors (`E.message`), from stubs that support them.
        [b'E', b'.', ..] => Some(String::from_utf8_lossy(&reply[2..]).into_owned()),
        _ => None,
    }
}

pub(crate) fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decodes hex text into bytes; `None` on an odd length or a non-hex digit.
pub fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|p| Some((hex_digit(p[0])? << 4) | hex_digit(p[1])?))
        .collect()
}
