//! Register reads: `Hg` + `g` for each thread, sent at once, and the registers an unwinder
//! needs decoded from the `g` reply.

use super::Client;
use crate::error::Error;
use crate::packet::{decode_hex, error_code, Stream};

/// x86-64 registers an unwinder needs, from the `g` packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// A digest of the whole `g` reply: the same in two rounds when the thread did not run
    /// in between.
    pub fingerprint: u64,
}

impl<S: Stream> Client<S> {
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
                (Some(ip), Some(sp), Some(bp)) => out.push(Registers {
                    ip,
                    sp,
                    bp,
                    fingerprint: fingerprint(reply),
                }),
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
}

fn fingerprint(reply: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    reply.hash(&mut hasher);
    hasher.finish()
}
