//! Memory reads, as each thread sees memory: `m` (hex) or, where the stub offers it, `x`
//! (binary), sent at once with the `Hg` each needs.

use super::Client;
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
        // The selected thread's reads first, then each other thread's together: every
        // thread is selected once at most, and the selected one not again.
        let selected = self.selected;
        let mut order: Vec<usize> = (0..reads.len()).collect();
        order.sort_by_key(|&i| (Some(reads[i].0) != selected, reads[i].0));
        let mut packets = Vec::with_capacity(reads.len() * 2);
        for &i in &order {
            let (thread, addr, len) = reads[i];
            self.select_packet(thread, &mut packets);
            packets.push(self.memory_packet(addr, len));
        }
        let replies = self.conn.exchange(&packets)?;
        let mut out = vec![None; reads.len()];
        let mut asked = order.iter();
        for (packet, reply) in packets.iter().zip(&replies) {
            if packet.starts_with(b"Hg") {
                self.expect_ok(packet, reply)?;
            } else if let Some(&i) = asked.next() {
                out[i] = self.memory_reply(packet, reply, reads[i].2)?;
            }
        }
        Ok(out)
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
}
