//! The one stack walk: from a sample's registers to the code addresses of its call stack,
//! leaf first, with DWARF CFI where the modules have it and frame pointers where they do not.
//!
//! Like framehop, which does the per-frame work, the walk is generic over how memory is read:
//! the perf source reads words from the stack bytes the kernel copied, `gdb` from the target
//! through the stub. It is generic over the architecture of the registers too ([`ArchRegs`]);
//! [`crate::arch::Unwinder`] picks the architecture a sample's registers say they are of.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FramehopError, FrameAddress, Unwinder as _};

use crate::module::SectionData;

mod aarch64;
mod end;
mod riscv;

pub use aarch64::{RegsAarch64, AARCH64_USER_CODE_MASK};
pub use end::{Stop, WalkEnd};
pub use riscv::{CacheRiscv64, RegsRiscv64, UnwinderRiscv64};

/// Deepest stack followed; deeper stacks end [`WalkEnd::Stopped`] at [`Stop::FrameLimit`].
pub const MAX_FRAMES: usize = 1024;

/// The registers a walk starts from, for one architecture, with that architecture's
/// unwinder: what adding an architecture takes. One step unwinds one frame, so an
/// architecture framehop does not cover can evaluate its CFI rows another way.
pub trait ArchRegs: Copy {
    /// Rules for the modules of one address space.
    type Unwinder;
    /// Rules already looked up, kept across walks.
    type Cache;
    /// The registers the unwinder tracks from frame to frame.
    type Unwind;

    fn pc(&self) -> u64;
    fn sp(&self) -> u64;
    /// The frame pointer.
    fn fp(&self) -> u64;
    fn unwind_regs(&self) -> Self::Unwind;
    /// The caller's registers as a frame record gives them: where it returns to, its stack
    /// pointer and its frame pointer.
    fn caller(return_address: u64, sp: u64, fp: u64) -> Self::Unwind;
    fn unwind_sp(regs: &Self::Unwind) -> u64;
    /// The code address a return address read from a frame record stands for: the address
    /// itself, unless the architecture signs return addresses.
    fn code_address(return_address: u64) -> u64 {
        return_address
    }
    /// Where the frame record at frame pointer `fp` keeps the caller's frame pointer and the
    /// return address, and the caller's stack pointer: `[fp]`, `[fp + 8]` and `fp + 16`
    /// unless the architecture lays it out otherwise.
    fn frame_record(fp: u64) -> FrameRecord {
        FrameRecord {
            caller_fp: fp,
            return_address: fp.wrapping_add(8),
            caller_sp: fp.wrapping_add(16),
        }
    }
    /// Whether return addresses stay in a link register until a function stores them, so a
    /// leaf may have its caller there ([`ArchRegs::link_register_caller`]).
    const LINK_REGISTER: bool = false;
    /// The leaf's caller while its return address is in the link register: that address and
    /// the caller's stack pointer, when `code` (the instructions at pc - 4, pc and pc + 4)
    /// says the leaf has not stored its frame record yet or has restored its caller's. None
    /// wherever the code does not say so: the leaf's frame record then says where its
    /// caller is.
    fn link_register_caller(&self, _code: [u32; 3]) -> Option<(u64, u64)> {
        None
    }
    /// Unwinds one frame: the caller's return address (`None` or 0 at the outermost frame),
    /// with `regs` moved to the caller.
    fn unwind_frame<F: FnMut(u64) -> Result<u64, ()>>(
        unwinder: &Self::Unwinder,
        cache: &mut Self::Cache,
        address: FrameAddress,
        regs: &mut Self::Unwind,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError>;
}

/// A frame record's layout: where its two words are, and the caller's stack pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRecord {
    pub caller_fp: u64,
    pub return_address: u64,
    pub caller_sp: u64,
}

/// x86-64 registers: instruction, stack and frame (`rbp`) pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegsX86_64 {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

impl ArchRegs for RegsX86_64 {
    type Unwinder = UnwinderX86_64<SectionData>;
    type Cache = CacheX86_64;
    type Unwind = UnwindRegsX86_64;

    fn pc(&self) -> u64 {
        self.ip
    }
    fn sp(&self) -> u64 {
        self.sp
    }
    fn fp(&self) -> u64 {
        self.bp
    }
    fn unwind_regs(&self) -> UnwindRegsX86_64 {
        UnwindRegsX86_64::new(self.ip, self.sp, self.bp)
    }
    fn caller(return_address: u64, sp: u64, fp: u64) -> UnwindRegsX86_64 {
        UnwindRegsX86_64::new(return_address, sp, fp)
    }
    fn unwind_sp(regs: &UnwindRegsX86_64) -> u64 {
        regs.sp()
    }
    fn unwind_frame<F: FnMut(u64) -> Result<u64, ()>>(
        unwinder: &Self::Unwinder,
        cache: &mut CacheX86_64,
        address: FrameAddress,
        regs: &mut UnwindRegsX86_64,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError> {
        unwinder.unwind_frame(address, regs, cache, read)
    }
}

/// Why a word of memory could not be read.
#[derive(Debug)]
pub enum Unread<E> {
    /// Nothing readable is there: the unwind info led somewhere bogus.
    Unreadable,
    /// Past the end of the stack memory copied with the sample: the stack goes on.
    PastCopy,
    /// Reading failed (a lost connection); the walk stops and hands it on.
    Failed(E),
}

/// What an address holds, as far as the walk needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// No code: a return address here is bogus.
    Outside,
    /// Code of a module with unwind tables.
    Tabled,
    /// Code without unwind tables (JIT code, a binary without CFI): frame pointers only.
    Untabled,
}

/// A walk's frames, leaf first.
#[derive(Debug, Default, Clone)]
pub struct Trail {
    /// The address to symbolize of each frame: the pc, then each return address stepped back
    /// into its call ([`lookup_address`]).
    pub addrs: Vec<u64>,
    /// The stack pointer in each frame: where the frame's locals end and its callee's begin.
    pub sps: Vec<u64>,
}

impl Trail {
    fn clear(&mut self) {
        self.addrs.clear();
        self.sps.clear();
    }

    fn push(&mut self, addr: u64, sp: u64) {
        self.addrs.push(addr);
        self.sps.push(sp);
    }
}

/// Where the walk starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    /// Unwind the leaf with its module's rules.
    Rules,
    /// Take the leaf's caller from its frame record first: framehop takes code without CFI
    /// for a frameless leaf, and in a file whose CFI covers only part of the code, the frame
    /// pointer is the better guess.
    FramePointer,
}

/// Walks one stack into `out`, leaf first: the pc, then each return address stepped back into
/// its call ([`lookup_address`]). `is_code` tells whether a return address stepped back can be
/// a caller's code; the walk breaks off at one that cannot. `read` reads one 8-byte word.
/// `out` is cleared first. Only a failed read ([`Unread::Failed`]) is an error.
pub fn walk<R: ArchRegs, E>(
    unwinder: &R::Unwinder,
    cache: &mut R::Cache,
    regs: R,
    leaf: Leaf,
    is_code: impl Fn(u64) -> bool,
    read: impl FnMut(u64) -> Result<u64, Unread<E>>,
    out: &mut Vec<u64>,
) -> Result<WalkEnd, E> {
    addresses_only(is_code, out, |code, trail| {
        walk_trail(unwinder, cache, (regs, leaf), code, read, trail)
    })
}

/// Runs a walk that keeps a [`Trail`] as one that keeps only the addresses, into `out`: what
/// [`walk`] is to [`walk_trail`], for every way of calling one.
pub(crate) fn addresses_only<E>(
    is_code: impl Fn(u64) -> bool,
    out: &mut Vec<u64>,
    walk: impl FnOnce(&dyn Fn(u64) -> Code, &mut Trail) -> Result<WalkEnd, E>,
) -> Result<WalkEnd, E> {
    let code = |addr| match is_code(addr) {
        true => Code::Tabled,
        false => Code::Outside,
    };
    let mut trail = Trail {
        addrs: std::mem::take(out),
        ..Trail::default()
    };
    let end = walk(&code, &mut trail);
    *out = trail.addrs;
    end
}

/// [`walk`], keeping each frame's stack pointer. `code` says what each address holds: a
/// walk that finds no caller in code without unwind tables (a zero frame pointer) has not
/// been told by any table that the chain ends, so it ends [`WalkEnd::Stopped`] with
/// [`Stop::NoTable`], to be judged by its outermost frame.
pub fn walk_trail<R: ArchRegs, E>(
    unwinder: &R::Unwinder,
    cache: &mut R::Cache,
    (regs, leaf): (R, Leaf),
    code: impl Fn(u64) -> Code,
    mut read: impl FnMut(u64) -> Result<u64, Unread<E>>,
    out: &mut Trail,
) -> Result<WalkEnd, E> {
    out.clear();
    out.push(regs.pc(), regs.sp());
    let mut uregs = regs.unwind_regs();
    let mut address = FrameAddress::from_instruction_pointer(regs.pc());
    // Only where the link register may hold the leaf's caller is the leaf's code asked about.
    let untabled = || leaf == Leaf::FramePointer || code(regs.pc()) == Code::Untabled;
    let linked = match R::LINK_REGISTER && untabled() {
        true => link_register_caller(&regs, &code, &mut read, out)?,
        false => None,
    };
    if let Some(caller) = linked {
        (uregs, address) = caller;
    } else if leaf == Leaf::FramePointer {
        match leaf_caller(&regs, &code, &mut read, out)? {
            Ok((caller, next)) => (uregs, address) = (caller, next),
            Err(end) => return Ok(end),
        }
    }
    loop {
        if out.addrs.len() >= MAX_FRAMES {
            return Ok(WalkEnd::stopped(Stop::FrameLimit));
        }
        let sp_before = R::unwind_sp(&uregs);
        // Tells "the copy was too short" apart from "the unwind info led somewhere bogus".
        let mut past_copy = false;
        let mut failed = None;
        let mut read_word = |addr: u64| -> Result<u64, ()> {
            read(addr).map_err(|e| match e {
                Unread::Unreadable => {}
                Unread::PastCopy => past_copy = true,
                Unread::Failed(e) => failed = Some(e),
            })
        };
        let result = R::unwind_frame(unwinder, cache, address, &mut uregs, &mut read_word);
        if let Some(e) = failed {
            return Err(e);
        }
        // What the frame being unwound has: a stop there is its module's.
        let here = code(address.address_for_lookup());
        let no_rule = match here {
            Code::Untabled => Stop::NoTable,
            _ => Stop::NoRule,
        };
        match result {
            Ok(None) | Ok(Some(0)) => return Ok(outermost(here)),
            Ok(Some(return_address)) => {
                // Every real frame pops at least its return address; anything else loops. A
                // leaf whose return address is still in the link register (aarch64, riscv64)
                // may have popped nothing.
                let sp = R::unwind_sp(&uregs);
                if sp < sp_before || (sp == sp_before && address.is_return_address()) {
                    return Ok(WalkEnd::stopped(no_rule));
                }
                let lookup = lookup_address(return_address);
                if code(lookup) == Code::Outside {
                    return Ok(WalkEnd::stopped(no_rule));
                }
                let Some(next) = FrameAddress::from_return_address(return_address) else {
                    return Ok(outermost(here));
                };
                out.push(lookup, R::unwind_sp(&uregs));
                address = next;
            }
            Err(FramehopError::CouldNotReadStack(_)) if past_copy => return Ok(WalkEnd::Truncated),
            Err(FramehopError::CouldNotReadStack(_)) => {
                return Ok(WalkEnd::stopped(Stop::UnreadableMemory))
            }
            Err(_) => return Ok(WalkEnd::stopped(no_rule)),
        }
    }
}

/// The leaf's caller taken from the leaf's frame record ([`Leaf::FramePointer`]): its
/// registers and where the walk goes on, with the caller pushed onto `out`; or how the walk
/// ends there.
fn leaf_caller<R: ArchRegs, E>(
    regs: &R,
    code: &impl Fn(u64) -> Code,
    read: &mut impl FnMut(u64) -> Result<u64, Unread<E>>,
    out: &mut Trail,
) -> Result<Result<(R::Unwind, FrameAddress), WalkEnd>, E> {
    let (bp, sp) = (regs.fp(), regs.sp());
    let here = code(regs.pc());
    if bp == 0 {
        return Ok(Err(outermost(here)));
    }
    if bp < sp {
        return Ok(Err(WalkEnd::stopped(Stop::NoTable)));
    }
    let record = R::frame_record(bp);
    let (caller_bp, return_address) = match frame_record(read, record)? {
        Ok((caller_bp, signed)) => (caller_bp, R::code_address(signed)),
        Err(end) => return Ok(Err(end)),
    };
    let Some(next) = FrameAddress::from_return_address(return_address) else {
        return Ok(Err(outermost(here)));
    };
    let lookup = lookup_address(return_address);
    if code(lookup) == Code::Outside {
        return Ok(Err(WalkEnd::stopped(Stop::NoTable)));
    }
    out.push(lookup, record.caller_sp);
    Ok(Ok((
        R::caller(return_address, record.caller_sp, caller_bp),
        next,
    )))
}

/// The leaf's caller taken from the link register, where the code at pc says the return
/// address is still there ([`ArchRegs::link_register_caller`]), with the caller pushed onto
/// `out`: for code without unwind tables, where the frame pointer is still the caller's and
/// its record would skip the caller. The code is read as memory, a word at a time.
fn link_register_caller<R: ArchRegs, E>(
    regs: &R,
    code: &impl Fn(u64) -> Code,
    read: &mut impl FnMut(u64) -> Result<u64, Unread<E>>,
    out: &mut Trail,
) -> Result<Option<(R::Unwind, FrameAddress)>, E> {
    let pc = regs.pc();
    let mut instruction = |addr: u64| match read(addr & !7) {
        Ok(word) => Ok(Some((word >> ((addr & 4) * 8)) as u32)),
        Err(Unread::Failed(e)) => Err(e),
        Err(_) => Ok(None),
    };
    let (Some(before), Some(at), Some(next)) = (
        instruction(pc.wrapping_sub(4))?,
        instruction(pc)?,
        instruction(pc.wrapping_add(4))?,
    ) else {
        return Ok(None);
    };
    let Some((return_address, sp)) = regs.link_register_caller([before, at, next]) else {
        return Ok(None);
    };
    let lookup = lookup_address(return_address);
    let Some(next) = FrameAddress::from_return_address(return_address) else {
        return Ok(None);
    };
    if code(lookup) == Code::Outside {
        return Ok(None);
    }
    out.push(lookup, sp);
    Ok(Some((R::caller(return_address, sp, regs.fp()), next)))
}

/// How a walk that found no caller ends: at the outermost frame where unwind tables cover the
/// code (they say so, or the frame-pointer convention the tables' code keeps does), broken
/// where frame pointers alone said it.
fn outermost(here: Code) -> WalkEnd {
    match here {
        Code::Untabled => WalkEnd::stopped(Stop::NoTable),
        _ => WalkEnd::Complete,
    }
}

/// The caller's frame pointer and return address saved in `record`, or how the walk ends when
/// they cannot be read.
fn frame_record<E>(
    read: &mut impl FnMut(u64) -> Result<u64, Unread<E>>,
    record: FrameRecord,
) -> Result<Result<(u64, u64), WalkEnd>, E> {
    let mut end = None;
    let mut word = |addr: u64| match read(addr) {
        Ok(word) => Ok(word),
        Err(Unread::Failed(e)) => Err(e),
        Err(Unread::PastCopy) => {
            end.get_or_insert(WalkEnd::Truncated);
            Ok(0)
        }
        Err(Unread::Unreadable) => {
            end.get_or_insert(WalkEnd::stopped(Stop::UnreadableMemory));
            Ok(0)
        }
    };
    let caller_fp = word(record.caller_fp)?;
    let return_address = word(record.return_address)?;
    Ok(match end {
        None => Ok((caller_fp, return_address)),
        Some(end) => Err(end),
    })
}

/// The address to symbolize for a return address: stepped back into the call instruction, as
/// the return address points after it, which may already be the next function or the next
/// inlined range.
pub fn lookup_address(return_address: u64) -> u64 {
    return_address.saturating_sub(1)
}

/// The addresses to symbolize for a callchain (frame-pointer chains the kernel or a BPF
/// program took), leaf first: the sampled instruction itself, then each return address
/// stepped back into its call.
pub fn lookup_addresses(chain: &[u64]) -> impl Iterator<Item = u64> + '_ {
    chain.iter().enumerate().map(
        |(i, &addr)| {
            if i == 0 {
                addr
            } else {
                lookup_address(addr)
            }
        },
    )
}

#[cfg(test)]
mod tests;
