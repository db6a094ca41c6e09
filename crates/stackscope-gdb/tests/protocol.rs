//! The protocol layer on recorded exchanges: the bytes a stub sends are replayed in order, what
//! the client writes is kept and compared. Replies follow what QEMU 7.2 and gdbserver 13 send.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use stackscope_gdb::client::{parse_svr4, Answer, Ask, Registers, StopReply};
use stackscope_gdb::packet::{
    checksum, expand_runs, frame, scan, unescape, Connection, Scan, Token,
};
use stackscope_gdb::{Client, Error, Remote, Stream};

/// Each write a client made, kept apart.
type Writes = Rc<RefCell<Vec<Vec<u8>>>>;

/// A stub's side of a recorded exchange.
struct Recorded {
    /// What the stub sends, in the pieces it sends it in.
    incoming: VecDeque<Vec<u8>>,
    /// After the last piece: end of file (the stub hung up) or silence (reads time out).
    hang_up: bool,
    written: Vec<u8>,
    /// Each write the client made, seen from outside the client.
    writes: Writes,
}

impl Recorded {
    fn new(pieces: &[&[u8]]) -> Self {
        Recorded {
            incoming: pieces.iter().map(|p| p.to_vec()).collect(),
            hang_up: false,
            written: Vec::new(),
            writes: Rc::default(),
        }
    }

    fn writes(&self) -> Writes {
        Rc::clone(&self.writes)
    }

    fn hanging_up(mut self) -> Self {
        self.hang_up = true;
        self
    }
}

impl Read for Recorded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(piece) = self.incoming.front_mut() else {
            return if self.hang_up {
                Ok(0)
            } else {
                Err(io::Error::new(io::ErrorKind::WouldBlock, "read timed out"))
            };
        };
        let n = piece.len().min(buf.len());
        buf[..n].copy_from_slice(&piece[..n]);
        piece.drain(..n);
        if piece.is_empty() {
            self.incoming.pop_front();
        }
        Ok(n)
    }
}

impl Write for Recorded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        self.writes.borrow_mut().push(buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for Recorded {
    fn set_read_timeout(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// A stub's packet: `$data#cs` with a correct checksum.
fn packet(data: &str) -> Vec<u8> {
    format!("${data}#{:02x}", checksum(data.as_bytes())).into_bytes()
}

const TIMEOUT: Duration = Duration::from_secs(5);

/// A client past a no-ack handshake, with the stub's later bytes queued after it.
fn no_ack_client(features: &str, later: &[&[u8]]) -> Client<Recorded> {
    watched_no_ack_client(features, later).0
}

/// [`no_ack_client`], with the client's writes to look at.
fn watched_no_ack_client(features: &str, later: &[&[u8]]) -> (Client<Recorded>, Writes) {
    let supported = packet(features);
    let ok = packet("OK");
    let mut pieces: Vec<&[u8]> = vec![b"+", &supported, b"+", &ok];
    pieces.extend_from_slice(later);
    let stream = Recorded::new(&pieces);
    let writes = stream.writes();
    let client = Client::handshake(stream, TIMEOUT).expect("handshake");
    (client, writes)
}

/// Registers as a `g` reply holds them: 16 general registers, rip, eflags, segment registers.
fn g_reply(rbp: u64, rsp: u64, rip: u64) -> String {
    let mut regs = [0u64; 17];
    regs[6] = rbp;
    regs[7] = rsp;
    regs[16] = rip;
    let mut hex: String = regs
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .map(|b| format!("{b:02x}"))
        .collect();
    hex.push_str("46020000"); // eflags
    hex.push_str(&"10000000".repeat(6)); // cs ss ds es fs gs
    hex
}

/// Run-length encodes as stubs do: a run of 4 to 97 equal characters becomes `X*N`, avoiding
/// the counts that would read as `#` or `$`.
fn run_length_encode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let mut run = 1;
        while i + run < bytes.len() && bytes[i + run] == c && run < 98 {
            run += 1;
        }
        // `#` (35) and `$` (36) as counts would end or start a packet: 6 and 7 extra.
        while run > 3 && matches!(run - 1 + 29, 35 | 36) {
            run -= 1;
        }
        if run > 3 {
            out.push(c as char);
            out.push('*');
            out.push((run - 1 + 29) as u8 as char);
        } else {
            for _ in 0..run {
                out.push(c as char);
            }
        }
        i += run;
    }
    out
}

#[test]
fn frames_packets_with_checksum_and_escapes() {
    assert_eq!(frame(b"qSupported"), b"$qSupported#37");
    assert_eq!(frame(b"g"), b"$g#67");
    // `$`, `#`, `}` and `*` in data are escaped; the checksum covers the escaped bytes.
    let framed = frame(b"X0,4:a#}*");
    assert_eq!(&framed[..framed.len() - 3], b"$X0,4:a}\x03}]}\x0a");
    let body = &framed[1..framed.len() - 3];
    assert_eq!(
        &framed[framed.len() - 2..],
        format!("{:02x}", checksum(body)).as_bytes()
    );
    assert_eq!(
        unescape(&framed[1..framed.len() - 3]).unwrap(),
        b"X0,4:a#}*"
    );
}

#[test]
fn expands_run_length_encoding() {
    // gdbserver's `0* ` is four zeros: the count ' ' (32) means 32 - 29 = 3 more.
    assert_eq!(expand_runs(b"0* ", 64).unwrap(), b"0000");
    assert_eq!(expand_runs(b"ab*\"c", 64).unwrap(), b"abbbbbbc");
    // A `*` with nothing before it, or a count below 30, is malformed.
    assert_eq!(expand_runs(b"*0", 64), None);
    assert_eq!(expand_runs(b"a*\x1c", 64), None);
    assert_eq!(expand_runs(b"a*", 64), None);
}

#[test]
fn handshake_turns_acks_off_and_reads_features() {
    let client = no_ack_client(
        "PacketSize=3fff;QPassSignals+;qXfer:auxv:read+;qXfer:libraries-svr4:read+;QStartNoAckMode+;vContSupported+",
        &[],
    );
    let features = client.features();
    assert_eq!(features.packet_size, Some(0x3fff));
    assert!(features.no_ack && features.auxv && features.libraries_svr4);
    assert!(!features.binary_upload);
}

#[test]
fn ack_mode_acknowledges_each_reply_and_retransmits_on_a_bad_checksum() {
    // A stub without QStartNoAckMode answers it with an empty packet: acks stay on. The `g`
    // reply first arrives corrupted.
    let regs = g_reply(0x7ffc_0000_1000, 0x7ffc_0000_0ff0, 0x5555_5555_5140);
    let good = packet(&regs);
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 1] = if bad[n - 1] == b'0' { b'1' } else { b'0' };
    let supported = packet("PacketSize=1000");
    let ok = packet("OK");
    let unknown = packet("");
    let stream = Recorded::new(&[
        b"+", &supported, b"+", &unknown, b"+", &ok, b"+", &bad, &good,
    ]);
    let mut client = Client::handshake(stream, TIMEOUT).expect("handshake");
    assert!(!client.features().no_ack);
    let got = client
        .registers(1)
        .expect("registers after a retransmission");
    assert_eq!(
        pc_sp_fp_lr(got),
        (0x5555_5555_5140, 0x7ffc_0000_0ff0, 0x7ffc_0000_1000, 0)
    );
}

#[test]
fn the_written_bytes_are_the_protocol() {
    let supported = packet("PacketSize=1000");
    let ok = packet("OK");
    let mut conn = Connection::new(Recorded::new(&[b"+", &supported, b"+", &ok]), TIMEOUT);
    conn.send(b"qSupported:x+").unwrap();
    assert_eq!(conn.receive().unwrap(), b"PacketSize=1000");
    conn.send(b"Hg1").unwrap();
    assert_eq!(conn.receive().unwrap(), b"OK");
    let mut conn = Connection::new(Recorded::new(&[b"-", b"+", &ok, b"+"]), TIMEOUT);
    conn.send(b"c").unwrap();
    assert_eq!(conn.receive().unwrap(), b"OK");
    // The reply's ack goes out with the next packet.
    conn.send(b"?").unwrap();
    let written = conn.into_inner().written;
    assert_eq!(written, b"$c#63$c#63+$?#3f");
}

#[test]
fn bad_checksum_without_acks_is_an_error_naming_the_packet() {
    let mut client = no_ack_client("QStartNoAckMode+", &[b"$OK#00"]);
    let err = client.registers(1).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Malformed { .. }), "{msg}");
    assert!(msg.contains("$Hg1#"), "names the packet sent: {msg}");
    assert!(msg.contains("$OK#00"), "names what came back: {msg}");
    assert!(msg.contains("checksum"), "{msg}");
}

#[test]
fn truncated_reply_then_silence_is_a_timeout_naming_both_sides() {
    let mut client = no_ack_client("QStartNoAckMode+", &[b"$OK#9"]);
    let err = client.registers(2).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Timeout { .. }), "{msg}");
    assert!(msg.contains("$Hg2#"), "{msg}");
    assert!(msg.contains("OK#9"), "{msg}");
}

#[test]
fn truncated_reply_then_hang_up_ends_the_target() {
    let supported = packet("QStartNoAckMode+");
    let ok = packet("OK");
    let stream = Recorded::new(&[b"+", &supported, b"+", &ok, b"$T05thr"]).hanging_up();
    let mut client = Client::handshake(stream, TIMEOUT).unwrap();
    let err = client.interrupt().unwrap_err();
    assert!(matches!(err, Error::Closed { .. }), "{err}");
    assert!(err.is_end_of_target());
    assert!(err.to_string().contains("T05thr"), "{err}");
}

#[test]
fn run_length_encoded_registers_decode() {
    let regs = g_reply(0x10_0000, 0x0f_fff0, 0x10_1234);
    let encoded = run_length_encode(&regs);
    assert!(
        encoded.len() < regs.len() / 2,
        "the reply is encoded: {encoded}"
    );
    let reply = packet(&encoded);
    let hg = packet("OK");
    let mut client = no_ack_client("QStartNoAckMode+", &[&hg, &reply]);
    assert_eq!(
        pc_sp_fp_lr(client.registers(1).unwrap()),
        (0x10_1234, 0x0f_fff0, 0x10_0000, 0)
    );
}

#[test]
fn unexpected_reply_is_an_error_not_a_guess() {
    let ok = packet("OK");
    let short = packet("00000000");
    let mut client = no_ack_client("QStartNoAckMode+", &[&ok, &short]);
    let err = client.registers(1).unwrap_err();
    assert!(err.to_string().contains("$g#67"), "{err}");
    assert!(err.to_string().contains("17 x86-64 registers"), "{err}");
}

#[test]
fn stub_errors_name_the_request() {
    // Unreadable memory is no error, only no bytes; a thread the stub refuses is one.
    let e14 = packet("E14");
    let e22 = packet("E22");
    // `Hg7` and `g` go out together: the stub answers both, `g` for the thread it kept.
    let g = packet(&g_reply(1, 2, 3));
    let mut client = no_ack_client("QStartNoAckMode+", &[&e14, &e22, &g]);
    assert_eq!(client.read_memory(0xdead_0000, 512).unwrap(), None);
    let err = client.registers(7).unwrap_err();
    assert!(
        matches!(err, Error::Stub { ref code, .. } if code == "22"),
        "{err}"
    );
    assert!(err.to_string().contains("$Hg7#"), "{err}");
}

#[test]
fn requests_without_acks_go_out_together() {
    // Registers of two vCPUs, then their stacks: each batch is one write and one round trip.
    // The stacks are read the still selected vCPU 2's first, so that it is not selected again.
    let ok = packet("OK");
    let g1 = packet(&g_reply(0x1000, 0x2000, 0x3000));
    let g2 = packet(&g_reply(0x4000, 0x5000, 0x6000));
    let mem = packet("0102");
    let e = packet("E14");
    let all: Vec<u8> = [&ok[..], &g1, &ok, &g2, &e, &ok, &mem].concat();
    let supported = packet("QStartNoAckMode+");
    let stream = Recorded::new(&[b"+", &supported, b"+", &ok, &all]);
    let writes = stream.writes();
    let mut client = Client::handshake(stream, TIMEOUT).expect("handshake");
    let regs = client.registers_of(&[1, 2]).unwrap();
    assert_eq!((regs[0].pc, regs[1].sp), (0x3000, 0x5000));
    let chunks = client
        .read_memory_of(&[(1, 0x2000, 512), (2, 0x5000, 512)])
        .unwrap();
    assert_eq!(chunks, vec![Some(vec![1, 2]), None]);
    let last = writes.borrow().last().cloned().unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&last),
        "$m5000,200#f0$Hg1#e0$m2000,200#ed"
    );
}

#[test]
fn binary_memory_reads_unescape() {
    // `x` (binary-upload) data with `}` escapes for `#`, `$`, `}` and `*`.
    let data = b"b\x01}\x03}\x04}]}\x0a\xff";
    let mut reply = b"$".to_vec();
    reply.extend_from_slice(data);
    reply.extend_from_slice(format!("#{:02x}", checksum(data)).as_bytes());
    let mut client = no_ack_client("QStartNoAckMode+;binary-upload+", &[&reply]);
    assert_eq!(
        client.read_memory(0x1000, 6).unwrap(),
        Some(vec![0x01, b'#', b'$', b'}', b'*', 0xff])
    );
}

#[test]
fn hex_memory_reads_may_be_short() {
    let reply = packet("c3cc");
    let mut client = no_ack_client("QStartNoAckMode+", &[&reply]);
    assert_eq!(
        client.read_memory(0x1000, 512).unwrap(),
        Some(vec![0xc3, 0xcc])
    );
}

#[test]
fn notifications_and_console_output_are_skipped() {
    let note = format!("%Stop:T05#{:02x}", checksum(b"Stop:T05")).into_bytes();
    let console = packet("O4f4b0a");
    let stop = packet("T02thread:01;");
    let mut client = no_ack_client("QStartNoAckMode+", &[&note, &console, &stop]);
    assert_eq!(client.interrupt().unwrap(), StopReply::Signal(2));
}

#[test]
fn exit_and_kill_stop_replies_end_the_target() {
    let exited = packet("W00");
    let mut client = no_ack_client("QStartNoAckMode+", &[&exited]);
    let err = client.interrupt().unwrap_err();
    assert!(err.is_end_of_target());
    assert!(err.to_string().contains("exited with status 0"), "{err}");

    let killed = packet("X09");
    let mut client = no_ack_client("QStartNoAckMode+", &[&killed]);
    assert!(client
        .interrupt()
        .unwrap_err()
        .to_string()
        .contains("killed by signal 9"));
}

#[test]
fn thread_lists_span_packets_and_multiprocess_ids() {
    // QEMU sends one vCPU per packet; gdbserver a comma list, `pPID.TID` with multiprocess.
    let m1 = packet("m1");
    let m2 = packet("m2,3");
    let m3 = packet("mp4d2.4d3");
    let end = packet("l");
    let mut client = no_ack_client("QStartNoAckMode+", &[&m1, &m2, &m3, &end]);
    assert_eq!(client.threads().unwrap(), vec![1, 2, 3, 0x4d3]);
}

#[test]
fn auxv_is_read_in_pieces_and_unescaped() {
    // AT_ENTRY (9) = 0x5555_5555_5040 split over two `qXfer` replies; 0x23 (`#`) is escaped.
    let mut auxv = Vec::new();
    for (k, v) in [(6u64, 0x1000u64), (9, 0x5555_5555_5023), (0, 0)] {
        auxv.extend_from_slice(&k.to_le_bytes());
        auxv.extend_from_slice(&v.to_le_bytes());
    }
    let escape = |bytes: &[u8]| -> Vec<u8> {
        let mut out = Vec::new();
        for &b in bytes {
            if matches!(b, b'#' | b'$' | b'}' | b'*') {
                out.extend_from_slice(&[b'}', b ^ 0x20]);
            } else {
                out.push(b);
            }
        }
        out
    };
    let piece = |tag: u8, bytes: &[u8]| -> Vec<u8> {
        let mut body = vec![tag];
        body.extend_from_slice(&escape(bytes));
        let mut p = b"$".to_vec();
        p.extend_from_slice(&body);
        p.extend_from_slice(format!("#{:02x}", checksum(&body)).as_bytes());
        p
    };
    let first = piece(b'm', &auxv[..20]);
    let last = piece(b'l', &auxv[20..]);
    let mut client = no_ack_client("QStartNoAckMode+;qXfer:auxv:read+", &[&first, &last]);
    let pairs = client.auxv().unwrap().unwrap();
    assert_eq!(pairs, vec![(6, 0x1000), (9, 0x5555_5555_5023), (0, 0)]);
}

#[test]
fn remote_addresses_read_as_the_osdk_reads_them() {
    assert_eq!(
        Remote::parse("localhost:1234"),
        Remote::Tcp("localhost:1234".into())
    );
    assert_eq!(Remote::parse(":1234"), Remote::Tcp("localhost:1234".into()));
    assert_eq!(
        Remote::parse(".osdk-gdb-socket"),
        Remote::Unix(PathBuf::from(".osdk-gdb-socket"))
    );
    assert_eq!(
        Remote::parse("/tmp/a:b/gdb.sock"),
        Remote::Unix(PathBuf::from("/tmp/a:b/gdb.sock"))
    );
    assert_eq!(Remote::parse("[::1]:9"), Remote::Tcp("[::1]:9".into()));
}

#[test]
fn svr4_library_lists_give_paths_and_load_biases() {
    // As gdbserver 13 sends it; the main program is only `main-lm`, the vDSO has no file.
    let xml = r#"<library-list-svr4 version="1.0" main-lm="0x7ffff7ffe2e0"><library name="linux-vdso.so.1" lm="0x7ffff7fc1000" l_addr="0x7ffff7fc1000" l_ld="0x7ffff7fc13e0" lmid="0x0"/><library name="/lib/x86_64-linux-gnu/libc.so.6" lm="0x7ffff7fbb6c0" l_addr="0x7ffff7dd5000" l_ld="0x7ffff7fa8bc0" lmid="0x0"/><library name="/opt/a&amp;b/lib.so" lm="0x1" l_addr="0x0" l_ld="0x2" lmid="0x0"/></library-list-svr4>"#;
    assert_eq!(
        parse_svr4(xml),
        vec![
            (PathBuf::from("linux-vdso.so.1"), 0x7fff_f7fc_1000),
            (
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                0x7fff_f7dd_5000
            ),
            (PathBuf::from("/opt/a&b/lib.so"), 0),
        ]
    );
    assert!(parse_svr4("<library-list-svr4 version=\"1.0\"/>").is_empty());
}

#[test]
fn an_unasked_stop_reply_at_connection_is_not_taken_for_the_features() {
    // QEMU 7.2 sends `T02thread:01;` as soon as a client connects (it stops the guest then).
    let stray = packet("T02thread:01;");
    // Not announced, but accepted.
    let supported = packet("PacketSize=1000;qXfer:features:read+;vContSupported+;multiprocess+");
    let ok = packet("OK");
    let status = packet("T05thread:01;");
    let stream = Recorded::new(&[&stray, b"+", &supported, b"+", &ok, &status]);
    let mut client = Client::handshake(stream, TIMEOUT).expect("handshake");
    assert_eq!(client.features().packet_size, Some(0x1000));
    assert_eq!(client.status().unwrap(), StopReply::Signal(5));
}

#[test]
fn a_stub_without_threads_has_one_and_needs_no_selecting() {
    // An empty reply is how a stub says it does not know a packet.
    let none = packet("");
    let g = packet(&g_reply(0x10, 0x20, 0x30));
    let mut client = no_ack_client("QStartNoAckMode+", &[&none, &g]);
    assert_eq!(client.threads().unwrap(), vec![0]);
    assert_eq!(client.registers(0).unwrap().pc, 0x30);
}

#[test]
fn scanning_splits_acks_packets_and_noise_and_stops_at_the_packet_size() {
    assert_eq!(scan(b"", 16), Scan::Incomplete);
    assert_eq!(scan(b"+$OK", 16), Scan::Token(Token::Ack, 1));
    assert_eq!(scan(b"-", 16), Scan::Token(Token::Nak, 1));
    assert_eq!(scan(b"x$OK#9a", 16), Scan::Token(Token::Noise(b'x'), 1));
    let ok = packet("OK");
    let ok_packet = Token::Packet {
        notification: false,
        body: b"OK",
        checksum_ok: true,
    };
    assert_eq!(
        scan(&[&ok[..], b"+"].concat(), 16),
        Scan::Token(ok_packet, 6)
    );
    let bad = Token::Packet {
        notification: false,
        body: b"OK",
        checksum_ok: false,
    };
    assert_eq!(scan(b"$OK#9b", 16), Scan::Token(bad, 6));
    assert_eq!(scan(b"%Stop:T05#", 16), Scan::Incomplete);
    // A body of exactly the maximum is a packet; one byte more without `#` is refused
    // without waiting for the rest.
    let sixteen = packet(&"a".repeat(16));
    assert!(matches!(
        scan(&sixteen, 16),
        Scan::Token(Token::Packet { .. }, 20)
    ));
    assert_eq!(scan(&sixteen, 15), Scan::TooLong);
    assert_eq!(
        scan(format!("${}", "a".repeat(16)).as_bytes(), 16),
        Scan::Incomplete
    );
    assert_eq!(
        scan(format!("${}", "a".repeat(17)).as_bytes(), 16),
        Scan::TooLong
    );
}

#[test]
fn run_length_expansion_stops_at_its_bound() {
    // `a*~` is 98 `a`s.
    assert_eq!(expand_runs(b"a*~", 98).map(|v| v.len()), Some(98));
    assert_eq!(expand_runs(b"a*~", 97), None);
    assert_eq!(expand_runs(b"abc", 2), None);
}

#[test]
fn a_stub_rejecting_every_packet_is_an_error_after_a_few_retransmissions() {
    // The `g` is acknowledged, then every copy of it reported garbled while its reply is due.
    let supported = packet("PacketSize=1000");
    let naks = [b"-"; 100];
    let mut pieces: Vec<&[u8]> = vec![b"+", &supported, b"+"];
    pieces.extend(naks.iter().map(|n| &n[..]));
    let mut conn = Connection::new(Recorded::new(&pieces), TIMEOUT);
    conn.send(b"qSupported").unwrap();
    assert_eq!(conn.receive().unwrap(), b"PacketSize=1000");
    conn.send(b"g").unwrap();
    let err = conn.receive().unwrap_err();
    assert!(err.to_string().contains("rejected"), "{err}");
    // The packet, then three retransmissions.
    let written = conn.into_inner().written;
    let g = frame(b"g");
    assert_eq!(written.windows(g.len()).filter(|w| *w == &g[..]).count(), 4);
}

fn pc_sp_fp_lr(r: Registers) -> (u64, u64, u64, u64) {
    (r.pc, r.sp, r.fp, r.lr)
}

#[test]
fn interrupt_goes_out_with_the_reads_in_one_write() {
    let console = packet("O4f4b0a");
    let stop = packet("T02thread:01;");
    let ok = packet("OK");
    let regs = packet(&g_reply(0x10_0000, 0x0f_fff0, 0x10_1234));
    let words = packet("efbeadde00000000");
    let (mut client, writes) = watched_no_ack_client(
        "QStartNoAckMode+",
        &[&stop, &console, &stop, &ok, &regs, &words, &ok, &regs],
    );
    // The first interrupt goes alone, to learn that the stub stops the target.
    assert_eq!(client.interrupt().unwrap(), StopReply::Signal(2));
    let asks = [
        Ask::Registers(1),
        Ask::Memory {
            thread: 1,
            addr: 0x0f_fff0,
            len: 8,
        },
        Ask::Registers(2),
    ];
    let (stop, answers) = client.interrupt_and_ask(&asks).unwrap();
    assert_eq!(stop, StopReply::Signal(2));
    let regs: Vec<Registers> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Registers(r) => Some(*r),
            Answer::Memory(_) => None,
        })
        .collect();
    assert_eq!(regs.len(), 2);
    assert_eq!(pc_sp_fp_lr(regs[1]), (0x10_1234, 0x0f_fff0, 0x10_0000, 0));
    assert_eq!(
        answers[1],
        Answer::Memory(Some(0xdead_beef_u64.to_le_bytes().to_vec()))
    );
    // Two reads of the same registers look the same: the thread did not run in between.
    assert_eq!(regs[0].fingerprint, regs[1].fingerprint);
    let last = writes.borrow().last().cloned().unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&last),
        "\u{3}$Hg1#e0$g#67$mffff0,8#99$Hg2#e1$g#67",
        "the interrupt and the reads are one write, each thread selected once"
    );
}

#[test]
fn interrupt_with_registers_reports_the_end_of_the_target() {
    let exited = packet("W00");
    let mut client = no_ack_client("QStartNoAckMode+", &[&exited]);
    let err = client.interrupt_and_ask(&[Ask::Registers(1)]).unwrap_err();
    assert!(err.is_end_of_target(), "{err}");
    assert!(err.to_string().contains("exited with status 0"), "{err}");
}

#[test]
fn acknowledged_requests_are_sent_together_and_each_reply_acked() {
    let supported = packet("PacketSize=1000");
    let unknown = packet("");
    let ok = packet("OK");
    let regs = packet(&g_reply(1, 2, 3));
    let stream = Recorded::new(&[
        b"+", &supported, b"+", &unknown, b"+", &ok, b"+", &regs, b"+", &regs,
    ]);
    let writes = stream.writes();
    let mut client = Client::handshake(stream, TIMEOUT).expect("handshake");
    assert!(!client.features().no_ack);
    assert_eq!(pc_sp_fp_lr(client.registers(1).unwrap()), (3, 2, 1, 0));
    assert_eq!(pc_sp_fp_lr(client.registers(1).unwrap()), (3, 2, 1, 0));
    let writes: Vec<String> = writes
        .borrow()
        .iter()
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    // This stub's replies come a read each: the client acks what it has before each wait for
    // more, and the last reply in front of the next request (the handshake's last too).
    assert_eq!(
        writes[writes.len() - 3..],
        ["+$Hg1#e0$g#67", "+", "+$g#67"],
        "both requests in one write, each reply acked once"
    );
}

#[test]
fn acks_owed_are_paid_before_waiting_for_more() {
    // A stub that sends its next reply only once the last is acked: the client acks what it
    // has before it waits.
    let supported = packet("PacketSize=1000");
    let unknown = packet("");
    let ok = packet("OK");
    let stream = Recorded::new(&[b"+", &supported, b"+", &unknown, b"+", &ok, b"+", &ok]);
    let writes = stream.writes();
    let mut conn = Connection::new(stream, TIMEOUT);
    conn.send(b"qSupported").unwrap();
    conn.receive().unwrap();
    conn.send(b"QStartNoAckMode").unwrap();
    conn.receive().unwrap();
    let replies = conn.exchange(&[b"Hg1".to_vec(), b"Hg2".to_vec()]).unwrap();
    assert_eq!(replies, [b"OK".to_vec(), b"OK".to_vec()]);
    let writes: Vec<String> = writes
        .borrow()
        .iter()
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    assert_eq!(writes[writes.len() - 2..], ["+$Hg1#e0$Hg2#e1", "+"]);
}
