//! The packet layer of the GDB remote protocol over any byte stream: `$data#cs` framing,
//! checksums, `+`/`-` acknowledgements with retransmission, run-length decoding of replies,
//! binary escapes, `%` notifications (skipped), and a deadline on every reply.

mod batch;
mod encoding;
mod read;
mod stream;
mod token;

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use crate::error::{shown, Error};

/// How often a packet is sent again after the other side reported a bad checksum.
const MAX_RETRIES: u32 = 3;

/// The largest packet body accepted before the stub states its own `PacketSize`, and the
/// least accepted after: every reply a sampler asks for (registers, 512-byte memory chunks,
/// feature lists) fits in it.
pub const MIN_MAX_PACKET: usize = 16 << 10;
/// The most a stub's `PacketSize` can raise the limit to: what one reply may make us hold.
pub const MAX_PACKET_CEILING: usize = 1 << 20;
/// Most bytes of packets (console output and a stop reply) held back while the replies of a
/// batch sent behind an interrupt are read.
pub const MAX_HELD: usize = 1 << 20;

use batch::Batch;
pub(crate) use encoding::hex_digit;
pub use encoding::{checksum, decode_hex, error_code, expand_runs, frame, unescape};
use read::{Next, Noise};
pub use stream::Stream;
pub use token::{scan, Scan, Token};

/// A point in time `after` from now, far in the future when that is past what the clock holds.
pub fn later(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// One end of a GDB remote protocol connection.
pub struct Connection<S> {
    stream: S,
    /// Received bytes; those before `pos` are taken.
    buf: Vec<u8>,
    pos: usize,
    /// Whether packets are acknowledged (until `QStartNoAckMode` is accepted).
    ack: bool,
    timeout: Duration,
    /// The largest packet body accepted.
    max_packet: usize,
    /// No wait lasts past this (the end of a recording).
    end: Option<Instant>,
    /// Who the stub is, for error messages.
    peer: String,
    /// The last packet as framed on the wire, to retransmit and to name in errors.
    last: Vec<u8>,
    /// A raw byte (the interrupt) to send in the same write as the next batch of packets.
    lead: Option<u8>,
    /// Packets received ahead of a batch's replies (the stop reply an interrupt brought, and
    /// console output before it), for the next receives.
    held: VecDeque<Vec<u8>>,
    /// The guess at how many bytes the replies of the batch being read take.
    batch: Batch,
    /// The least a read waits for, as last set on the stream.
    min_read: usize,
    /// The size on the wire of the last packet received.
    last_wire: usize,
    /// Replies received and not acked yet.
    owed_acks: usize,
}

impl<S: Stream> Connection<S> {
    pub fn new(stream: S, timeout: Duration) -> Self {
        Connection {
            stream,
            buf: Vec::with_capacity(4096),
            pos: 0,
            ack: true,
            timeout,
            max_packet: MIN_MAX_PACKET,
            end: None,
            peer: "the GDB stub".into(),
            last: Vec::new(),
            lead: None,
            held: VecDeque::new(),
            batch: Batch::default(),
            min_read: 1,
            last_wire: 0,
            owed_acks: 0,
        }
    }

    /// Names the stub in error messages (`the GDB stub at ADDR`).
    pub fn set_peer(&mut self, peer: String) {
        self.peer = peer;
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Accepts packets as large as the stub says it handles (its `PacketSize`), within
    /// [`MIN_MAX_PACKET`] and [`MAX_PACKET_CEILING`].
    pub fn set_max_packet(&mut self, stated: Option<usize>) {
        self.max_packet = stated
            .unwrap_or(0)
            .clamp(MIN_MAX_PACKET, MAX_PACKET_CEILING);
    }

    pub fn max_packet(&self) -> usize {
        self.max_packet
    }

    /// Makes every wait end by `end`, whatever the reply timeout ([`Error::Cut`] past it).
    pub fn set_end(&mut self, end: Option<Instant>) {
        self.end = end;
    }

    /// When a reply asked for now must have arrived: the reply timeout from now, or the
    /// connection's end when that comes first.
    pub fn deadline(&self) -> Instant {
        let reply = later(self.timeout);
        self.end.map_or(reply, |end| end.min(reply))
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
        let deadline = self.deadline();
        self.send_by(data, deadline)
    }

    /// [`Connection::send`], waiting for the ack until `deadline` at the latest.
    pub fn send_by(&mut self, data: &[u8], deadline: Instant) -> Result<(), Error> {
        self.post(data)?;
        if !self.ack {
            return Ok(());
        }
        let mut retries = 0;
        let mut noise = Noise::default();
        loop {
            match self.next(deadline, &noise)? {
                Next::Ack => {
                    self.pos += 1;
                    return Ok(());
                }
                Next::Nak => {
                    self.pos += 1;
                    self.retransmit(&mut retries)?;
                }
                // A stub may skip the ack before a reply; leave it for `receive`.
                Next::Packet { .. } => return Ok(()),
                Next::Noise(b) => {
                    self.pos += 1;
                    noise.push(b);
                }
            }
        }
    }

    /// Sends a packet that gets no reply (a resume) without waiting for its ack: over a
    /// socket the packet arrives whole, and the stub's `+` is skipped with the next reply.
    pub fn post(&mut self, data: &[u8]) -> Result<(), Error> {
        self.last = frame(data);
        self.write_last()
    }

    /// Sends packets and returns their replies in order (`E NN` included, for the caller to
    /// judge). All go out in one write, acknowledged or not: one round trip however many
    /// there are (a stub that acknowledges handles each packet as it reads it, and a packet's
    /// start ends its wait for our ack of the reply before). An error names the packet whose
    /// reply failed.
    pub fn exchange(&mut self, packets: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
        let mut replies = Vec::with_capacity(packets.len());
        let framed: Vec<Vec<u8>> = packets.iter().map(|p| frame(p)).collect();
        let lead = self.lead.take();
        self.last = lead.into_iter().chain(framed.concat()).collect();
        self.batch.start(packets, lead.is_some(), self.ack);
        let result = self.write_last().and_then(|()| {
            let mut held = Vec::new();
            if lead.is_some() && self.stop_ahead(&mut held)? {
                // The target ended: the stub answers nothing more.
                self.held.extend(held);
                return Ok(());
            }
            for (packet, framed) in packets.iter().zip(framed) {
                self.last = framed;
                replies.push(self.receive()?);
                self.batch.replied(packet, self.last_wire);
            }
            self.held.extend(held);
            Ok(())
        });
        self.batch.end();
        result.map(|()| replies)
    }

    /// Makes the next [`Connection::exchange`] send `byte` (the `0x03` interrupt) ahead of its
    /// packets in the same write, so that stopping the target and the first requests to the
    /// stopped target cost one round trip. A stub stops the target on that byte before it
    /// reads on (QEMU stops every vCPU first; gdbserver reads the byte alone). The stop reply
    /// it brings, with console output before it, is held for the next receives.
    pub fn lead_with(&mut self, byte: u8) {
        self.lead = Some(byte);
    }

    /// Receives the packets an interrupt brings, up to and with its stop reply, into `held`;
    /// true when that reply says the target is gone (`W`, `X`).
    fn stop_ahead(&mut self, held: &mut Vec<Vec<u8>>) -> Result<bool, Error> {
        let deadline = self.deadline();
        let mut bytes = 0;
        loop {
            let reply = self.receive_by(deadline)?;
            bytes += reply.len();
            if bytes > MAX_HELD {
                return Err(self.excess(format!(
                    "sent more than {} MiB of console output (O packets) instead of a stop reply",
                    MAX_HELD >> 20
                )));
            }
            let kind = reply.first().copied();
            let coded = reply.len() >= 3 && reply[1..3].iter().all(u8::is_ascii_hexdigit);
            let console = kind == Some(b'O') && decode_hex(&reply[1..]).is_some();
            held.push(reply);
            match kind {
                Some(b'S' | b'T') if coded => return Ok(false),
                Some(b'W' | b'X') if coded => return Ok(true),
                _ if console => continue,
                // Not a stop: the client's stop-reply parsing names it.
                _ => return Ok(false),
            }
        }
    }

    /// Sends one raw byte that is not a packet (the `0x03` interrupt).
    pub fn send_raw(&mut self, byte: u8) -> Result<(), Error> {
        self.last = vec![byte];
        self.write_last()
    }

    /// Receives the next packet's data, run-length decoded (still escaped: see [`unescape`]).
    /// Notifications (`%...#cs`) and stray acks are skipped.
    pub fn receive(&mut self) -> Result<Vec<u8>, Error> {
        let deadline = self.deadline();
        self.receive_by(deadline)
    }

    /// [`Connection::receive`], waiting until `deadline` at the latest (or the connection's
    /// end, when that comes first): one bound for a wait that spans several packets.
    pub fn receive_by(&mut self, deadline: Instant) -> Result<Vec<u8>, Error> {
        if let Some(held) = self.held.pop_front() {
            return Ok(held);
        }
        let deadline = self.end.map_or(deadline, |end| end.min(deadline));
        let mut checksum_retries = 0;
        let mut retransmits = 0;
        let mut noise = Noise::default();
        loop {
            let (notification, checksum_ok, len) = match self.next(deadline, &noise)? {
                Next::Packet {
                    notification,
                    checksum_ok,
                    len,
                } => (notification, checksum_ok, len),
                // The stub garbled our packet: it waits for it again.
                Next::Nak if self.ack => {
                    self.pos += 1;
                    self.retransmit(&mut retransmits)?;
                    continue;
                }
                Next::Ack | Next::Nak => {
                    self.pos += 1;
                    continue;
                }
                Next::Noise(b) => {
                    self.pos += 1;
                    noise.push(b);
                    continue;
                }
            };
            let start = self.pos;
            self.pos += len;
            self.last_wire = len;
            if !checksum_ok {
                if self.ack && checksum_retries < MAX_RETRIES {
                    checksum_retries += 1;
                    self.write(b"-")?;
                    continue;
                }
                let raw = self.buf[start..start + len].to_vec();
                return Err(self.malformed(&raw, "bad checksum"));
            }
            if self.ack {
                // Acked with the next write, or before the next wait: one write for all the
                // replies a read brought.
                self.owed_acks += 1;
            }
            if notification {
                continue;
            }
            let body = &self.buf[start + 1..start + len - 3];
            return match expand_runs(body, self.max_packet) {
                Some(data) => Ok(data),
                None => {
                    let raw = self.buf[start..start + len].to_vec();
                    Err(self.malformed(
                        &raw,
                        "bad run-length encoding, or longer than the packet size once expanded",
                    ))
                }
            };
        }
    }

    /// Sends a packet and returns its reply; `E NN` replies become [`Error::Stub`].
    pub fn request(&mut self, data: &[u8]) -> Result<Vec<u8>, Error> {
        let deadline = self.deadline();
        self.request_by(data, deadline)
    }

    /// [`Connection::request`], with its ack and reply due by `deadline` at the latest.
    pub fn request_by(&mut self, data: &[u8], deadline: Instant) -> Result<Vec<u8>, Error> {
        let deadline = deadline.min(self.deadline());
        self.send_by(data, deadline)?;
        let reply = self.receive_by(deadline)?;
        if let Some(code) = error_code(&reply) {
            return Err(Error::Stub {
                peer: self.peer.clone(),
                sent: self.sent(),
                code,
            });
        }
        Ok(reply)
    }

    /// An error naming the stub, the last packet sent and what came back.
    pub fn malformed(&self, got: &[u8], why: &'static str) -> Error {
        Error::Malformed {
            peer: self.peer.clone(),
            sent: self.sent(),
            got: shown(got),
            why,
        }
    }

    /// An error saying the stub went past one of the bounds put on what it may send.
    pub fn excess(&self, what: String) -> Error {
        Error::Excess {
            peer: self.peer.clone(),
            sent: self.sent(),
            what,
        }
    }

    /// Sends the last packet again, at most [`MAX_RETRIES`] times per wait.
    fn retransmit(&mut self, retries: &mut u32) -> Result<(), Error> {
        if *retries >= MAX_RETRIES {
            return Err(self.excess(format!(
                "rejected the packet's checksum {} times",
                MAX_RETRIES + 1
            )));
        }
        *retries += 1;
        self.write_last()
    }

    fn write_last(&mut self) -> Result<(), Error> {
        let last = std::mem::take(&mut self.last);
        let result = self.write(&last);
        self.last = last;
        result
    }

    /// Writes `bytes` behind the acks owed, in one write.
    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let acks = std::mem::take(&mut self.owed_acks);
        let result = if acks == 0 {
            self.stream.write_all(bytes)
        } else {
            let mut out = vec![b'+'; acks];
            out.extend_from_slice(bytes);
            self.stream.write_all(&out)
        };
        result
            .and_then(|()| self.stream.flush())
            .map_err(|source| io_error(&self.peer, &self.last, b"", source))
    }

    /// Sends the acks owed, before a wait for more from a stub that may want them first.
    fn pay_acks(&mut self) -> Result<(), Error> {
        if self.owed_acks == 0 {
            return Ok(());
        }
        self.write(b"")
    }
}

/// A failed read or write: a reset or broken connection is the stub going away.
fn io_error(peer: &str, sent: &[u8], got: &[u8], source: io::Error) -> Error {
    match source.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Error::Closed {
            peer: peer.to_string(),
            sent: shown(sent),
            got: shown(got),
        },
        _ => Error::Io {
            peer: peer.to_string(),
            sent: shown(sent),
            error: source,
        },
    }
}
