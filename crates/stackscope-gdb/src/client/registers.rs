//! Register reads: `Hg` + `g` for each thread, sent at once, and the registers an unwinder
//! needs decoded from the `g` reply where the target's [`Layout`] puts them.

use super::{Answer, Ask, Client};
use stackscope_stacks::arch::Arch;

use crate::error::Error;
use crate::packet::{error_code, hex_digit, Stream};

/// The registers a walk starts from, on every architecture, from the `g` packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registers {
    /// The program counter (`rip`, `pc`).
    pub pc: u64,
    pub sp: u64,
    /// The frame pointer (`rbp`, `s0`, `x29`).
    pub fp: u64,
    /// The link register (`ra`, `x30`), which holds a leaf's return address until the leaf
    /// saves it; 0 on x86-64.
    pub lr: u64,
    /// A digest of the whole `g` reply: the same in two rounds when the thread did not run
    /// in between.
    pub fingerprint: u64,
}

impl<S: Stream> Client<S> {
    /// Registers of one thread; see [`Client::registers_of`].
    pub fn registers(&mut self, thread: u64) -> Result<Registers, Error> {
        Ok(self.registers_of(&[thread])?[0])
    }

    /// Registers of each thread (`Hg` + `g`, all sent at once without acks), where the stub's
    /// target description puts them (see [`Client::describe`]), little-endian.
    pub fn registers_of(&mut self, threads: &[u64]) -> Result<Vec<Registers>, Error> {
        let asks: Vec<Ask> = threads.iter().map(|&t| Ask::Registers(t)).collect();
        Ok(self
            .ask(&asks)?
            .into_iter()
            .filter_map(|answer| match answer {
                Answer::Registers(regs) => Some(regs),
                Answer::Memory(_) => None,
            })
            .collect())
    }

    /// The registers in a `g` reply to `packet`.
    pub(super) fn registers_reply(&self, packet: &[u8], reply: &[u8]) -> Result<Registers, Error> {
        if let Some(code) = error_code(reply) {
            return Err(self.stub_error(packet, code));
        }
        match register_bytes(reply).and_then(|bytes| self.layout.decode(&bytes)) {
            Some(regs) => Ok(Registers {
                fingerprint: fingerprint(reply),
                ..regs
            }),
            None => {
                let why = match self.layout.arch() {
                    Arch::X86_64 => "expected at least 17 x86-64 registers in hex",
                    Arch::Riscv64 => "expected hex up to pc, sp, s0 and ra readable",
                    Arch::Aarch64 => "expected hex up to pc, sp, x29 and x30 readable",
                };
                Err(self.malformed(packet, reply, why))
            }
        }
    }
}

/// The bytes of a `g` reply, `None` for each `xx` (a register the stub cannot read); `None`
/// altogether when it is not hex.
fn register_bytes(reply: &[u8]) -> Option<Vec<Option<u8>>> {
    if !reply.len().is_multiple_of(2) {
        return None;
    }
    reply
        .chunks_exact(2)
        .map(|pair| match pair {
            b"xx" => Some(None),
            _ => Some(Some(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?)),
        })
        .collect()
}

fn fingerprint(reply: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    reply.hash(&mut hasher);
    hasher.finish()
}
