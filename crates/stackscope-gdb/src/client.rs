//! The commands a sampler needs from a GDB stub (QEMU's, gdbserver): the handshake, the thread
//! list, the target description, registers, memory, stopping and resuming, the target's
//! auxiliary vector and load offsets, and detaching.

mod ask;
mod description;
mod interrupt;
mod layout;
mod loaded;
mod memory;
mod registers;

use std::fmt;
use std::net::TcpStream;
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stackscope_stacks::arch::Arch;

use crate::error::{shown, Error};
use crate::packet::{decode_hex, error_code, frame, Connection, Stream};

pub use ask::{Answer, Ask};
pub use description::Description;
pub use layout::Layout;
pub use loaded::parse_svr4;
pub use registers::Registers;

/// Where the stub listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// `host:port` (an empty host means localhost).
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Remote {
    /// As the Asterinas OSDK reads `--remote`: an address whose last `:` field is a port
    /// number is TCP, anything else a Unix socket path.
    pub fn parse(addr: &str) -> Remote {
        match addr.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.parse::<u16>().is_ok() => {
                let host = if host.is_empty() { "localhost" } else { host };
                Remote::Tcp(format!("{host}:{port}"))
            }
            _ => Remote::Unix(PathBuf::from(addr)),
        }
    }
}

impl fmt::Display for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Remote::Tcp(a) => write!(f, "{a}"),
            Remote::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Why the target stopped, from a stop reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReply {
    /// Stopped with this signal (`S`/`T`); 2 (SIGINT) or 5 (SIGTRAP) after an interrupt.
    Signal(u8),
    /// Exited with this status (`W`).
    Exited(u8),
    /// Killed by this signal (`X`).
    Killed(u8),
}

/// What the stub said it supports (`qSupported`).
#[derive(Debug, Clone, Default)]
pub struct Features {
    pub packet_size: Option<usize>,
    pub no_ack: bool,
    pub auxv: bool,
    pub libraries_svr4: bool,
    /// The binary memory read `x` (GDB 16's `binary-upload`).
    pub binary_upload: bool,
    /// The target description (`qXfer:features:read`).
    pub target_description: bool,
}

/// A connected client.
pub struct Client<S> {
    conn: Connection<S>,
    features: Features,
    /// The thread `Hg` last selected, to skip selecting it again.
    selected: Option<u64>,
    /// Where the registers a walk needs sit in a `g` reply.
    layout: Layout,
    /// True once an interrupt has stopped the target: a stub that never stops it ignores
    /// interrupts.
    interrupt_stops: bool,
    /// Set (by Ctrl-C) to end what is being read: a long reply is given up between packets.
    stop: Option<Arc<AtomicBool>>,
}

/// Reply timeout used when the caller does not choose one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most threads a stub may list: more than any guest has vCPUs or a program threads.
pub const MAX_THREADS: usize = 1 << 16;
/// Most console output (`O` packets) skipped while waiting for one stop reply.
pub const MAX_CONSOLE: usize = 1 << 20;
/// Largest `qXfer` object read (auxiliary vector, target description).
pub const MAX_OBJECT: usize = 16 << 20;
/// Largest library list read: some hundred bytes per library, for [`MAX_LIBRARIES`].
pub const MAX_LIBRARY_LIST: usize = 4 << 20;
/// Most libraries a stub may list: a large program maps a few hundred. Each one listed is a
/// file opened and its unwind tables held.
pub const MAX_LIBRARIES: usize = 4096;
/// Shortest wait for the first stop after an interrupt that is taken as the stub ignoring
/// interrupts when the recording's end cuts it (a longer one is due within a reply timeout).
const LEAST_STOP_WAIT: Duration = Duration::from_millis(500);

impl Client<Box<dyn Stream>> {
    /// Connects over TCP or a Unix socket and does the handshake.
    pub fn connect(remote: &Remote, timeout: Duration) -> Result<Self, Error> {
        let connect_err = |source: std::io::Error| {
            let hint = match source.kind() {
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
                    " (is QEMU running with -gdb, or gdbserver listening there?)"
                }
                _ => "",
            };
            Error::Connect {
                remote: remote.to_string(),
                error: source,
                hint,
            }
        };
        let stream: Box<dyn Stream> = match remote {
            Remote::Tcp(addr) => {
                let stream = TcpStream::connect(addr).map_err(connect_err)?;
                // Small request/reply packets: Nagle would add tens of milliseconds per round.
                stream.set_nodelay(true).map_err(connect_err)?;
                Box::new(stream)
            }
            #[cfg(unix)]
            Remote::Unix(path) => Box::new(UnixStream::connect(path).map_err(connect_err)?),
            #[cfg(not(unix))]
            Remote::Unix(_) => {
                return Err(connect_err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "Unix sockets exist only on Unix: give HOST:PORT",
                )))
            }
        };
        let mut conn = Connection::new(stream, timeout);
        conn.set_peer(format!("the GDB stub at {remote}"));
        Client::handshake_on(conn)
    }
}

impl<S: Stream> Client<S> {
    /// Negotiates features on a fresh connection and turns acknowledgements off where the
    /// stub allows.
    pub fn handshake(stream: S, timeout: Duration) -> Result<Self, Error> {
        Client::handshake_on(Connection::new(stream, timeout))
    }

    fn handshake_on(mut conn: Connection<S>) -> Result<Self, Error> {
        // A fresh stub may wait for an ack of a packet it thinks it sent; one `+` is harmless.
        conn.send_raw(b'+')?;
        conn.send(b"qSupported:swbreak+;hwbreak+;vContSupported+")?;
        // QEMU announces the stop that a new connection causes (`T02thread:01;`) unasked;
        // that is no answer to qSupported, which never looks like a stop reply.
        let reply = loop {
            let reply = conn.receive()?;
            if !is_stop_reply(&reply) {
                break reply;
            }
        };
        if let Some(code) = crate::packet::error_code(&reply) {
            return Err(Error::Stub {
                peer: conn.peer().to_string(),
                sent: conn.sent(),
                code,
            });
        }
        let features = parse_features(&reply);
        conn.set_max_packet(features.packet_size);
        // QEMU 7.2 accepts QStartNoAckMode without announcing it; a stub that does not know
        // it answers with an empty packet, and acks stay on.
        conn.send(b"QStartNoAckMode")?;
        match conn.receive()?.as_slice() {
            b"OK" => conn.disable_acks(),
            b"" => {}
            [b'E', ..] if !features.no_ack => {}
            other => return Err(conn.malformed(other, "expected OK")),
        }
        Ok(Client {
            conn,
            features,
            selected: None,
            layout: Layout::default_of(Arch::X86_64),
            interrupt_stops: false,
            stop: None,
        })
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Makes every wait for the stub end by `end` at the latest (the end of a recording),
    /// whatever the reply timeout; `None` leaves the reply timeout alone.
    pub fn set_end(&mut self, end: Option<Instant>) {
        self.conn.set_end(end);
    }

    /// `stop` (set by Ctrl-C) ends a reply of many packets between two of them, and the
    /// loading of the files the stub lists.
    pub fn set_stop(&mut self, stop: Arc<AtomicBool>) {
        self.stop = Some(stop);
    }

    /// Whether the flag given to [`Client::set_stop`] is set.
    pub fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// The reply timeout.
    pub fn timeout(&self) -> Duration {
        self.conn.timeout()
    }

    /// Why the target is stopped now (`?`); stubs stop the target when a client connects.
    pub fn status(&mut self) -> Result<StopReply, Error> {
        self.conn.send(b"?")?;
        self.stop_reply()
    }

    /// The target's threads (QEMU: one per vCPU, in CPU order), as the stub numbers them;
    /// `[0]` for a stub that knows no threads.
    /// The whole list is due within one reply timeout and holds at most [`MAX_THREADS`].
    pub fn threads(&mut self) -> Result<Vec<u64>, Error> {
        let deadline = self.conn.deadline();
        let mut threads = Vec::new();
        let mut reply = self.conn.request_by(b"qfThreadInfo", deadline)?;
        loop {
            match reply.split_first() {
                Some((b'm', list)) => {
                    for id in list.split(|&b| b == b',') {
                        let tid = parse_thread_id(id)
                            .ok_or_else(|| self.conn.malformed(&reply, "bad thread id"))?;
                        threads.push(tid);
                    }
                    if threads.len() > MAX_THREADS {
                        return Err(self.conn.excess(format!(
                            "listed more than {MAX_THREADS} threads without ending the list"
                        )));
                    }
                }
                Some((b'l', _)) => break,
                // A stub without threads: the one it has is the current one (id 0).
                None if threads.is_empty() => return Ok(vec![0]),
                _ => return Err(self.conn.malformed(&reply, "expected a thread list")),
            }
            reply = self.conn.request_by(b"qsThreadInfo", deadline)?;
        }
        Ok(threads)
    }

    /// Queues `Hg` when `thread` is not the selected one (0: the only one, never selected).
    fn select_packet(&mut self, thread: u64, packets: &mut Vec<Vec<u8>>) {
        if thread != 0 && self.selected != Some(thread) {
            packets.push(format!("Hg{thread:x}").into_bytes());
            self.selected = Some(thread);
        }
    }

    /// Stops the running target and returns why it stopped. A stop the target made on its
    /// own (a signal) while running is returned the same way. A stub that has never stopped
    /// the target on an interrupt and lets the wait run out is said to ignore interrupts
    /// ([`Error::NoStop`]), rather than leaving an empty profile unexplained.
    pub fn interrupt(&mut self) -> Result<StopReply, Error> {
        self.conn.send_raw(0x03)?;
        let start = Instant::now();
        self.stop_after_interrupt(start)
    }

    /// The stop reply to an interrupt sent at `start`, a wait that runs out on a stub that
    /// never stopped the target told apart as [`Error::NoStop`].
    fn stop_after_interrupt(&mut self, start: Instant) -> Result<StopReply, Error> {
        let stop = self.stop_reply();
        let waited = start.elapsed();
        match stop {
            Ok(stop) => {
                self.interrupt_stops = true;
                Ok(stop)
            }
            Err(Error::Timeout { .. }) if !self.interrupt_stops => Err(self.no_stop(waited)),
            Err(Error::Cut { .. }) if !self.interrupt_stops && waited >= LEAST_STOP_WAIT => {
                Err(self.no_stop(waited))
            }
            Err(e) => Err(e),
        }
    }

    fn no_stop(&self, waited: Duration) -> Error {
        Error::NoStop {
            peer: self.conn.peer().to_string(),
            secs: (waited.as_secs_f64() * 10.0).round() / 10.0,
        }
    }

    /// Lets the target run; `signal` is delivered to it (gdbserver) when not 0.
    pub fn resume(&mut self, signal: u8) -> Result<(), Error> {
        self.selected = None;
        // No reply comes until the target stops, and no wait for the ack: the round ends here.
        if signal == 0 {
            self.conn.post(b"c")
        } else {
            self.conn.post(format!("C{signal:02x}").as_bytes())
        }
    }

    /// Detaches, leaving the target running. The target must be stopped.
    pub fn detach(&mut self) -> Result<(), Error> {
        let reply = self.conn.request(b"D")?;
        if reply != b"OK" {
            return Err(self.conn.malformed(&reply, "expected OK"));
        }
        Ok(())
    }

    /// Waits for a stop reply, skipping console output (`O`) packets: all within one reply
    /// timeout, and at most [`MAX_CONSOLE`] bytes of them.
    fn stop_reply(&mut self) -> Result<StopReply, Error> {
        let deadline = self.conn.deadline();
        let mut console = 0;
        loop {
            let reply = self.conn.receive_by(deadline)?;
            let code = || reply.get(1..3).and_then(decode_hex).map(|b| b[0]);
            let stop = match reply.first() {
                Some(b'S' | b'T') => code().map(StopReply::Signal),
                Some(b'W') => code().map(StopReply::Exited),
                Some(b'X') => code().map(StopReply::Killed),
                Some(b'O') if reply.len() > 1 && decode_hex(&reply[1..]).is_some() => {
                    console += reply.len() / 2;
                    if console > MAX_CONSOLE {
                        return Err(self.conn.excess(format!(
                            "sent more than {} MiB of console output (O packets) instead of a stop reply",
                            MAX_CONSOLE >> 20
                        )));
                    }
                    continue;
                }
                _ => None,
            };
            return match stop {
                Some(StopReply::Exited(status)) => {
                    Err(Error::Exited(format!("exited with status {status}")))
                }
                Some(StopReply::Killed(signal)) => {
                    Err(Error::Exited(format!("was killed by signal {signal}")))
                }
                Some(stop) => Ok(stop),
                None => Err(self.conn.malformed(&reply, "expected a stop reply")),
            };
        }
    }

    fn expect_ok(&self, packet: &[u8], reply: &[u8]) -> Result<(), Error> {
        match error_code(reply) {
            Some(code) => Err(self.stub_error(packet, code)),
            None if reply == b"OK" => Ok(()),
            None => Err(self.malformed(packet, reply, "expected OK")),
        }
    }

    /// An `E NN` reply to one of several packets sent at once.
    fn stub_error(&self, packet: &[u8], code: String) -> Error {
        Error::Stub {
            peer: self.conn.peer().to_string(),
            sent: shown(&frame(packet)),
            code,
        }
    }

    /// A bad reply to one of several packets sent at once.
    fn malformed(&self, packet: &[u8], reply: &[u8], why: &'static str) -> Error {
        Error::Malformed {
            peer: self.conn.peer().to_string(),
            sent: shown(&frame(packet)),
            got: shown(reply),
            why,
        }
    }
}

/// `S05` or `T05...`: a stop reply.
fn is_stop_reply(reply: &[u8]) -> bool {
    matches!(reply, [b'S' | b'T', a, b, ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit())
}

/// A thread id as the stub writes it: hex, or `pPID.TID` with the multiprocess extension.
fn parse_thread_id(id: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(id).ok()?;
    let tid = match text.strip_prefix('p') {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, t)| t),
        None => text,
    };
    u64::from_str_radix(tid, 16).ok().filter(|&t| t != 0)
}

fn parse_features(reply: &[u8]) -> Features {
    let text = String::from_utf8_lossy(reply);
    let mut features = Features::default();
    for item in text.split(';') {
        match item {
            "QStartNoAckMode+" => features.no_ack = true,
            "qXfer:auxv:read+" => features.auxv = true,
            "qXfer:libraries-svr4:read+" => features.libraries_svr4 = true,
            "binary-upload+" => features.binary_upload = true,
            "qXfer:features:read+" => features.target_description = true,
            _ => {
                if let Some(size) = item.strip_prefix("PacketSize=") {
                    features.packet_size = usize::from_str_radix(size, 16).ok();
                }
            }
        }
    }
    features
}
