//! Target memory for one stack, read through the stub, and the walk over it.

use stackscope_stacks::arch::{Regs, WalkCache};
use stackscope_stacks::walk::{Leaf, Unread, WalkEnd};

use crate::client::{Client, Registers};
use crate::error::Error;
use crate::packet::Stream;
use crate::space::Space;

/// Bytes per request for words beyond what was read first: aligned, so a few neighbouring
/// words cost one request, and never across a page.
const CHUNK: u64 = 512;

/// What the stub gave for each read: `None` where it could not read.
pub(super) type Contents = Vec<Option<Vec<u8>>>;

/// A stretch of target memory as asked for, and what the stub gave (`None`: it could not
/// read it).
struct Region {
    base: u64,
    len: u64,
    bytes: Option<Vec<u8>>,
}

/// Target memory read for one stack: the stretch above the stack pointer read in the round's
/// first memory request, then aligned chunks as the walk needs them; made anew for every
/// stack, since the target ran in between and each vCPU may map memory differently.
pub(super) struct Memory {
    thread: u64,
    sp: u64,
    regions: Vec<Region>,
    /// One past the highest byte above the stack pointer the walk read: what a later look
    /// at the same code is likely to need again.
    pub(super) reach: u64,
}

impl Memory {
    /// One memory per stack, each holding `(thread, sp, len)`'s bytes, all read in one round
    /// trip with `probes`, whose contents are returned beside.
    pub(super) fn of_stacks<S: Stream>(
        client: &mut Client<S>,
        stacks: &[(u64, u64, usize)],
        probes: &[(u64, u64, usize)],
    ) -> Result<(Vec<Memory>, Contents), Error> {
        let reads: Vec<(u64, u64, usize)> = stacks.iter().chain(probes).copied().collect();
        let mut read = client.read_memory_of(&reads)?;
        let probed = read.split_off(stacks.len());
        let memories = stacks
            .iter()
            .zip(read)
            .map(|(&(thread, sp, len), bytes)| Memory::new(thread, sp, sp, len as u64, bytes))
            .collect();
        Ok((memories, probed))
    }

    /// The memory of the stack at `sp` from `bytes` read at `addr`, when they hold its first
    /// `len` bytes.
    pub(super) fn within(
        thread: u64,
        sp: u64,
        len: usize,
        addr: u64,
        bytes: Vec<u8>,
    ) -> Option<Memory> {
        let end = sp.checked_add(len as u64)?;
        let read_end = addr.checked_add(bytes.len() as u64)?;
        if sp < addr || end > read_end {
            return None;
        }
        Some(Memory::new(
            thread,
            sp,
            addr,
            bytes.len() as u64,
            Some(bytes),
        ))
    }

    /// The memory of the stack at `sp`, holding what was asked of `len` bytes at `base`.
    fn new(thread: u64, sp: u64, base: u64, len: u64, bytes: Option<Vec<u8>>) -> Memory {
        Memory {
            thread,
            sp,
            regions: vec![Region { base, len, bytes }],
            reach: 0,
        }
    }

    /// The byte at `addr`; `Ok(None)` when the target cannot read it.
    fn byte<S: Stream>(&mut self, client: &mut Client<S>, addr: u64) -> Result<Option<u8>, Error> {
        let chunk = addr & !(CHUNK - 1);
        for r in &self.regions {
            if addr < r.base || addr - r.base >= r.len {
                continue;
            }
            match &r.bytes {
                Some(bytes) => return Ok(bytes.get((addr - r.base) as usize).copied()),
                // A chunk the stub could not read; a longer stretch that failed may have
                // failed further up only.
                None if r.base == chunk && r.len == CHUNK => return Ok(None),
                None => {}
            }
        }
        let bytes = client
            .read_memory_of(&[(self.thread, chunk, CHUNK as usize)])?
            .pop()
            .flatten();
        let byte = bytes
            .as_ref()
            .and_then(|b| b.get((addr - chunk) as usize).copied());
        self.regions.push(Region {
            base: chunk,
            len: CHUNK,
            bytes,
        });
        Ok(byte)
    }

    /// The 8-byte little-endian word at `addr`; `Ok(None)` when the target cannot read it.
    fn word<S: Stream>(&mut self, client: &mut Client<S>, addr: u64) -> Result<Option<u64>, Error> {
        let Some(end) = addr.checked_add(8) else {
            return Ok(None);
        };
        let mut bytes = [0u8; 8];
        for (i, byte) in bytes.iter_mut().enumerate() {
            match self.byte(client, addr + i as u64)? {
                Some(b) => *byte = b,
                None => return Ok(None),
            }
        }
        if addr >= self.sp {
            self.reach = self.reach.max(end - self.sp);
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
        let unwinder = space.unwinder();
        let Registers { pc, sp, fp, lr, .. } = regs;
        let arch = unwinder.arch();
        let regs = Regs {
            arch,
            pc,
            sp,
            fp,
            lr,
        };
        unwinder.walk(cache, (regs, leaf), |_| true, read, out)
    }
}
