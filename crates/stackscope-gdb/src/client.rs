//! The commands a sampler needs from a GDB stub (QEMU's, gdbserver): the handshake, the thread
//! list, registers, memory, stopping and resuming, the target's auxiliary vector and load
//! offsets, and detaching.

use std::fmt;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{shown, Error};
use crate::packet::{decode_hex, error_code, frame, unescape, Connection, Stream};

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

/// x86-64 registers an unwinder needs, from the `g` packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// Why the target stopped, from a stop reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
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
}

/// A connected client.
pub struct Client<S> {
    conn: Connection<S>,
    features: Features,
    /// The thread `Hg` last selected, to skip selecting it again.
    selected: Option<u64>,
}

/// Reply timeout used when the caller does not choose one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most threads a stub may list: more than any guest has vCPUs or a program threads.
pub const MAX_THREADS: usize = 1 << 16;
/// Most console output (`O` packets) skipped while waiting for one stop reply.
pub const MAX_CONSOLE: usize = 1 << 20;
/// Largest `qXfer` object read (auxiliary vector, library list).
pub const MAX_OBJECT: usize = 16 << 20;

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
            Remote::Unix(path) => Box::new(UnixStream::connect(path).map_err(connect_err)?),
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

    /// The reply timeout.
    pub fn timeout(&self) -> Duration {
        self.conn.timeout()
    }

    /// Why the target is stopped now (`?`); stubs stop the target when a client connects.
    pub fn status(&mut self) -> Result<Stop, Error> {
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

    /// Registers of one thread; see [`Client::registers_of`].
    pub fn registers(&mut self, thread: u64) -> Result<Registers, Error> {
        Ok(self.registers_of(&[thread])?[0])
    }

    /// Registers of each thread (`Hg` + `g`, all sent at once without acks), in the x86-64
    /// order both QEMU and gdbserver use: rax rbx rcx rdx rsi rdi rbp rsp r8..r15 rip, 8 bytes
    /// each, little-endian.
    pub fn registers_of(&mut self, threads: &[u64]) -> Result<Vec<Registers>, Error> {
        let result = self.registers_of_inner(threads);
        if result.is_err() {
            // Which `Hg` took effect is unknown.
            self.selected = None;
        }
        result
    }

    fn registers_of_inner(&mut self, threads: &[u64]) -> Result<Vec<Registers>, Error> {
        let mut packets = Vec::with_capacity(threads.len() * 2);
        for &thread in threads {
            self.select_packet(thread, &mut packets);
            packets.push(b"g".to_vec());
        }
        let replies = self.conn.exchange(&packets)?;
        let mut out = Vec::with_capacity(threads.len());
        for (packet, reply) in packets.iter().zip(&replies) {
            if packet.starts_with(b"Hg") {
                self.expect_ok(packet, reply)?;
                continue;
            }
            if let Some(code) = error_code(reply) {
                return Err(self.stub_error(packet, code));
            }
            let reg = |i: usize| -> Option<u64> {
                let hex = reply.get(i * 16..(i + 1) * 16)?;
                // `xx` marks a register the stub cannot read.
                let bytes = decode_hex(hex)?;
                Some(u64::from_le_bytes(bytes.try_into().ok()?))
            };
            match (reg(16), reg(7), reg(6)) {
                (Some(ip), Some(sp), Some(bp)) => out.push(Registers { ip, sp, bp }),
                _ => {
                    return Err(self.malformed(
                        packet,
                        reply,
                        "expected at least 17 x86-64 registers in hex",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Reads up to `len` bytes at `addr` as the selected thread sees memory; `None` where the
    /// stub cannot read it (`E NN`). A stub may return fewer bytes than asked.
    pub fn read_memory(&mut self, addr: u64, len: usize) -> Result<Option<Vec<u8>>, Error> {
        let packet = self.memory_packet(addr, len);
        let reply = self.conn.exchange(std::slice::from_ref(&packet))?;
        self.memory_reply(&packet, &reply[0], len)
    }

    /// Reads `(thread, addr, len)` each as its thread sees memory (QEMU reads through that
    /// vCPU's page tables), all sent at once without acks; see [`Client::read_memory`].
    pub fn read_memory_of(
        &mut self,
        reads: &[(u64, u64, usize)],
    ) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let result = self.read_memory_of_inner(reads);
        if result.is_err() {
            self.selected = None;
        }
        result
    }

    fn read_memory_of_inner(
        &mut self,
        reads: &[(u64, u64, usize)],
    ) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let mut packets = Vec::with_capacity(reads.len() * 2);
        for &(thread, addr, len) in reads {
            self.select_packet(thread, &mut packets);
            packets.push(self.memory_packet(addr, len));
        }
        let replies = self.conn.exchange(&packets)?;
        let mut out = Vec::with_capacity(reads.len());
        let mut lens = reads.iter().map(|r| r.2);
        for (packet, reply) in packets.iter().zip(&replies) {
            if packet.starts_with(b"Hg") {
                self.expect_ok(packet, reply)?;
            } else {
                out.push(self.memory_reply(packet, reply, lens.next().unwrap_or(0))?);
            }
        }
        Ok(out)
    }

    /// Queues `Hg` when `thread` is not the selected one (0: the only one, never selected).
    fn select_packet(&mut self, thread: u64, packets: &mut Vec<Vec<u8>>) {
        if thread != 0 && self.selected != Some(thread) {
            packets.push(format!("Hg{thread:x}").into_bytes());
            self.selected = Some(thread);
        }
    }

    fn memory_packet(&self, addr: u64, len: usize) -> Vec<u8> {
        let kind = if self.features.binary_upload {
            'x'
        } else {
            'm'
        };
        format!("{kind}{addr:x},{len:x}").into_bytes()
    }

    fn memory_reply(
        &self,
        packet: &[u8],
        reply: &[u8],
        len: usize,
    ) -> Result<Option<Vec<u8>>, Error> {
        if error_code(reply).is_some() {
            return Ok(None);
        }
        if self.features.binary_upload {
            return match reply.split_first() {
                Some((b'b', data)) => match unescape(data) {
                    Some(bytes) if bytes.len() <= len => Ok(Some(bytes)),
                    _ => Err(self.malformed(packet, reply, "bad binary data")),
                },
                _ => Err(self.malformed(packet, reply, "expected b followed by binary data")),
            };
        }
        match decode_hex(reply) {
            Some(bytes) if bytes.len() <= len && !bytes.is_empty() => Ok(Some(bytes)),
            _ => Err(self.malformed(packet, reply, "expected memory contents in hex")),
        }
    }

    /// Stops the running target and returns why it stopped. A stop the target made on its
    /// own (a signal) while running is returned the same way.
    pub fn interrupt(&mut self) -> Result<Stop, Error> {
        self.conn.send_raw(0x03)?;
        self.stop_reply()
    }

    /// Lets the target run; `signal` is delivered to it (gdbserver) when not 0.
    pub fn resume(&mut self, signal: u8) -> Result<(), Error> {
        self.selected = None;
        if signal == 0 {
            self.conn.send(b"c")
        } else {
            self.conn.send(format!("C{signal:02x}").as_bytes())
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

    /// The target's auxiliary vector (Linux programs under gdbserver), when the stub has one.
    pub fn auxv(&mut self) -> Result<Option<Vec<(u64, u64)>>, Error> {
        if !self.features.auxv {
            return Ok(None);
        }
        let data = self.read_object("auxv")?;
        Ok(Some(
            data.chunks_exact(16)
                .map(|p| {
                    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                    (word(&p[..8]), word(&p[8..]))
                })
                .collect(),
        ))
    }

    /// The text offset from `qOffsets` (`Text=xxx;Data=xxx`), when the stub gives one.
    pub fn text_offset(&mut self) -> Result<Option<u64>, Error> {
        self.conn.send(b"qOffsets")?;
        let reply = self.conn.receive()?;
        if reply.is_empty() || reply.starts_with(b"E") {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&reply).into_owned();
        let offset = text
            .split(';')
            .find_map(|f| {
                f.strip_prefix("Text=")
                    .or_else(|| f.strip_prefix("TextSeg="))
            })
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        match offset {
            Some(o) => Ok(Some(o)),
            None => Err(self.conn.malformed(&reply, "expected Text=...")),
        }
    }

    /// The shared libraries the target has loaded, as (path, load bias), from the svr4 list;
    /// `None` when the stub does not give one (QEMU).
    pub fn libraries(&mut self) -> Result<Option<Vec<(PathBuf, u64)>>, Error> {
        if !self.features.libraries_svr4 {
            return Ok(None);
        }
        let data = self.read_object("libraries-svr4")?;
        Ok(Some(parse_svr4(&String::from_utf8_lossy(&data))))
    }

    /// Reads a whole `qXfer` object in packet-sized pieces, all due within one reply timeout;
    /// at most [`MAX_OBJECT`] bytes.
    fn read_object(&mut self, object: &str) -> Result<Vec<u8>, Error> {
        let piece = self.features.packet_size.unwrap_or(4096).clamp(64, 65536) - 8;
        let deadline = self.conn.deadline();
        let mut data = Vec::new();
        loop {
            let request = format!("qXfer:{object}:read::{:x},{piece:x}", data.len());
            let reply = self.conn.request_by(request.as_bytes(), deadline)?;
            let (last, body) = match reply.split_first() {
                Some((b'l', body)) => (true, body),
                Some((b'm', body)) => (false, body),
                _ => {
                    return Err(self
                        .conn
                        .malformed(&reply, "expected m or l followed by data"))
                }
            };
            let bytes = unescape(body).ok_or_else(|| self.conn.malformed(&reply, "bad escape"))?;
            let empty = bytes.is_empty();
            data.extend_from_slice(&bytes);
            if data.len() > MAX_OBJECT {
                return Err(self.conn.excess(format!(
                    "sent a {object} object of more than {} MiB",
                    MAX_OBJECT >> 20
                )));
            }
            // An empty `m` would loop forever.
            if last || empty {
                return Ok(data);
            }
        }
    }

    /// Waits for a stop reply, skipping console output (`O`) packets: all within one reply
    /// timeout, and at most [`MAX_CONSOLE`] bytes of them.
    fn stop_reply(&mut self) -> Result<Stop, Error> {
        let deadline = self.conn.deadline();
        let mut console = 0;
        loop {
            let reply = self.conn.receive_by(deadline)?;
            let code = || reply.get(1..3).and_then(decode_hex).map(|b| b[0]);
            let stop = match reply.first() {
                Some(b'S' | b'T') => code().map(Stop::Signal),
                Some(b'W') => code().map(Stop::Exited),
                Some(b'X') => code().map(Stop::Killed),
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
                Some(Stop::Exited(status)) => {
                    Err(Error::Exited(format!("exited with status {status}")))
                }
                Some(Stop::Killed(signal)) => {
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
            _ => {
                if let Some(size) = item.strip_prefix("PacketSize=") {
                    features.packet_size = usize::from_str_radix(size, 16).ok();
                }
            }
        }
    }
    features
}

/// `<library name="/lib/x86_64-linux-gnu/libc.so.6" lm="0x..." l_addr="0x7ffff7dd5000" .../>`
/// elements of a `library-list-svr4` document, as (name, l_addr).
pub fn parse_svr4(xml: &str) -> Vec<(PathBuf, u64)> {
    let attr = |element: &str, name: &str| -> Option<String> {
        let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
        let len = element[start..].find('"')?;
        Some(
            element[start..start + len]
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&"),
        )
    };
    xml.split("<library ")
        .skip(1)
        .filter_map(|element| {
            let element = &element[..element.find('>').unwrap_or(element.len())];
            let element = format!(" {element}");
            let name = attr(&element, "name").filter(|n| !n.is_empty())?;
            let l_addr = attr(&element, "l_addr")?;
            let l_addr = u64::from_str_radix(l_addr.trim_start_matches("0x"), 16).ok()?;
            Some((PathBuf::from(name), l_addr))
        })
        .collect()
}
