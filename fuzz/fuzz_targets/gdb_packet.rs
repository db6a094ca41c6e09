//! The GDB remote packet layer and client on arbitrary bytes from a stub: splitting into
//! tokens, run-length expansion, escapes and hex, then a whole sampler's conversation replayed
//! from the same bytes. Nothing may panic, and nothing may grow past the packet size bound.

#![no_main]

use std::io::{self, Read, Write};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stackscope_gdb::client::parse_svr4;
use stackscope_gdb::packet::{
    decode_hex, error_code, expand_runs, scan, unescape, Scan, Token, MIN_MAX_PACKET,
};
use stackscope_gdb::{Client, Stream};

/// What the stub says, handed out in pieces of the sizes the input's first byte picks; then
/// the stub hangs up.
struct Replay<'a> {
    data: &'a [u8],
    piece: usize,
}

impl Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.data.len().min(buf.len()).min(self.piece);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for Replay<'_> {
    fn set_read_timeout(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, stub)) = data.split_first() else {
        return;
    };
    // A small bound, so that long packets are exercised too.
    let max = 64 + usize::from(first) * 4;
    let mut rest = stub;
    while let Scan::Token(token, len) = scan(rest, max) {
        assert!(len >= 1 && len <= rest.len() && len <= max + 4);
        if let Token::Packet { body, .. } = token {
            assert!(body.len() <= max);
            if let Some(expanded) = expand_runs(body, max) {
                assert!(expanded.len() <= max);
                let _ = unescape(&expanded);
                let _ = decode_hex(&expanded);
                let _ = error_code(&expanded);
                let _ = parse_svr4(&String::from_utf8_lossy(&expanded));
            }
        }
        rest = &rest[len..];
    }

    let stream = Replay {
        data: stub,
        piece: usize::from(first % 16) + 1,
    };
    let Ok(mut client) = Client::handshake(stream, Duration::from_secs(1)) else {
        return;
    };
    let _ = client.status();
    if let Ok(threads) = client.threads() {
        assert!(threads.len() <= stackscope_gdb::client::MAX_THREADS + MIN_MAX_PACKET);
        let _ = client.registers_of(&threads[..threads.len().min(4)]);
    }
    let _ = client.read_memory_of(&[(1, 0x1000, 512), (2, 0x2000, 512)]);
    let _ = client.auxv();
    let _ = client.text_offset();
    let _ = client.libraries();
    let _ = client.resume(0);
    let _ = client.interrupt();
    let _ = client.detach();
});
