//! Memory reads, as each thread sees memory: `m` (hex) or, where the stub offers it, `x`
//! (binary), sent at once with the `Hg` each needs.

use super::{Answer, Ask, Client};
use crate::error::Error;
use crate::packet::{decode_hex, error_code, unescape, Stream};

impl<S: Stream> Client<S> {
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
        // The selected thread's reads first, then each other thread's together: every
        // thread is selected once at most, and the selected one not again.
        let selected = self.selected;
        let mut order: Vec<usize> = (0..reads.len()).collect();
        order.sort_by_key(|&i| (Some(reads[i].0) != selected, reads[i].0));
        let asks: Vec<Ask> = order
            .iter()
            .map(|&i| {
                let (thread, addr, len) = reads[i];
                Ask::Memory { thread, addr, len }
            })
            .collect();
        let mut out = vec![None; reads.len()];
        for (&i, answer) in order.iter().zip(self.ask(&asks)?) {
            if let Answer::Memory(bytes) = answer {
                out[i] = bytes;
            }
        }
        Ok(out)
    }

    pub(super) fn memory_packet(&self, addr: u64, len: usize) -> Vec<u8> {
        let kind = if self.features.binary_upload {
            'x'
        } else {
            'm'
        };
        format!("{kind}{addr:x},{len:x}").into_bytes()
    }

    pub(super) fn memory_reply(
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
}
