//! Target memory for one stack, read through the stub, and the walk over it.

use std::collections::HashMap;

use stackscope_stacks::walk::{Leaf, Unread, WalkEnd};

use crate::arch::{walk_stack, WalkCache};
use crate::client::{Client, Registers};
use crate::error::Error;
use crate::packet::Stream;
use crate::space::Space;

/// Bytes per memory request: a few stack frames, and far below every stub's packet size.
const CHUNK: u64 = 512;

/// Target memory read for one stack, in aligned chunks so that the words an unwind reads
/// cost one request per chunk; made anew for every stack, since the target ran in between and
/// each vCPU may map memory differently.
pub(super) struct Memory {
    thread: u64,
    chunks: HashMap<u64, Option<Vec<u8>>>,
}

impl Memory {
    /// One memory per thread, holding each stack's first chunks read in one go: most unwinds
    /// need nothing more.
    pub(super) fn of_stacks<S: Stream>(
        client: &mut Client<S>,
        threads: &[u64],
        regs: &[Registers],
    ) -> Result<Vec<Memory>, Error> {
        let mut memories: Vec<Memory> = threads
            .iter()
            .map(|&thread| Memory {
                thread,
                chunks: HashMap::new(),
            })
            .collect();
        let reads: Vec<(u64, u64, usize)> = threads
            .iter()
            .zip(regs)
            .flat_map(|(&thread, r)| {
                let base = r.sp & !(CHUNK - 1);
                [base, base.wrapping_add(CHUNK)].map(|b| (thread, b, CHUNK as usize))
            })
            .collect();
        let chunks = client.read_memory_of(&reads)?;
        for (i, ((_, base, _), chunk)) in reads.iter().zip(chunks).enumerate() {
            memories[i / 2].chunks.insert(*base, chunk);
        }
        Ok(memories)
    }

    /// The 8-byte little-endian word at `addr`; `Ok(None)` when the target cannot read it.
    fn word<S: Stream>(&mut self, client: &mut Client<S>, addr: u64) -> Result<Option<u64>, Error> {
        let mut bytes = [0u8; 8];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let Some(a) = addr.checked_add(i as u64) else {
                return Ok(None);
            };
            let base = a & !(CHUNK - 1);
            let chunk = match self.chunks.get(&base) {
                Some(chunk) => chunk,
                None => {
                    let read = client
                        .read_memory_of(&[(self.thread, base, CHUNK as usize)])?
                        .pop()
                        .flatten();
                    self.chunks.entry(base).or_insert(read)
                }
            };
            match chunk.as_ref().and_then(|c| c.get((a - base) as usize)) {
                Some(&b) => *byte = b,
                None => return Ok(None),
            }
        }
        Ok(Some(u64::from_le_bytes(bytes)))
    }

    /// Unwinds this stack into `out`, leaf first: the pc, then each return address minus 1
    /// (inside the call, as symbolization wants).
    pub(super) fn unwind<S: Stream>(
        &mut self,
        space: &Space,
        cache: &mut WalkCache,
        client: &mut Client<S>,
        regs: Registers,
        out: &mut Vec<u64>,
    ) -> Result<WalkEnd, Error> {
        let leaf = if space.lacks_cfi(regs.pc) {
            Leaf::FramePointer
        } else {
            Leaf::Rules
        };
        let read = |addr| match self.word(client, addr) {
            Ok(Some(word)) => Ok(word),
            Ok(None) => Err(Unread::Unreadable),
            Err(e) => Err(Unread::Failed(e)),
        };
        walk_stack(space.unwinder(), cache, regs, leaf, read, out)
    }
}
