//! The architectures stackscope walks (x86-64, aarch64, riscv64) as data: which one a file or
//! a sample is of, the registers a walk starts from, and each one's unwinder for the one walk
//! ([`crate::walk`]). A source names the architecture from what it reads (an ELF header, the
//! registers a perf sample carries, a perf.data header, a stub's target description), never
//! from the machine stackscope itself was built for, so a file recorded on one architecture
//! is walked right on another.

use std::ops::Range;

use framehop::aarch64::{CacheAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use object::elf;

use crate::module::{ModuleFile, SectionData};
use crate::walk::{
    addresses_only, walk_trail, CacheRiscv64, Code, Leaf, RegsAarch64, RegsRiscv64, RegsX86_64,
    Trail, Unread, UnwinderRiscv64, WalkEnd,
};

impl ModuleFile {
    /// The architecture the file is built for, from its header; `None` for one stackscope
    /// does not walk.
    pub fn arch(&self) -> Option<Arch> {
        Arch::of_machine(self.machine)
    }
}

/// An architecture stackscope walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Riscv64,
    Aarch64,
}

impl Arch {
    /// The architecture of an ELF file's `e_machine` (64-bit files only).
    pub fn of_machine(machine: elf::Machine) -> Option<Arch> {
        match machine {
            elf::EM_X86_64 => Some(Arch::X86_64),
            elf::EM_RISCV => Some(Arch::Riscv64),
            elf::EM_AARCH64 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// The architecture a Linux kernel names itself (`uname -m`, and the `arch` that perf
    /// writes into a perf.data header).
    pub fn of_kernel_name(machine: &str) -> Option<Arch> {
        match machine {
            "x86_64" => Some(Arch::X86_64),
            "riscv64" => Some(Arch::Riscv64),
            "aarch64" | "arm64" => Some(Arch::Aarch64),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86-64",
            Arch::Riscv64 => "riscv64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The instruction that waits for an interrupt, as it sits in memory (little-endian):
    /// x86-64 `hlt`, riscv64 and aarch64 `wfi`. A CPU stopped right after one idles: its
    /// registers stay the same because it waits, not because it was left without time.
    pub fn idle_instruction(self) -> &'static [u8] {
        match self {
            Arch::X86_64 => &[0xf4],
            // 0x10500073: SYSTEM with funct12 0x105.
            Arch::Riscv64 => &[0x73, 0x00, 0x50, 0x10],
            // 0xd503207f: HINT #3.
            Arch::Aarch64 => &[0x7f, 0x20, 0x03, 0xd5],
        }
    }
}

/// The registers a walk starts from, and the architecture they are of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    pub arch: Arch,
    /// The program counter (`rip`, `pc`).
    pub pc: u64,
    pub sp: u64,
    /// The frame pointer (`rbp`, `x29`, `s0`).
    pub fp: u64,
    /// The link register (`x30`, `ra`), which holds a leaf's return address until the leaf
    /// saves it; 0 on x86-64, whose calls push the return address.
    pub lr: u64,
}

/// The unwind rules of the files of one address space, for its architecture.
pub enum Unwinder {
    X86_64(UnwinderX86_64<SectionData>),
    Riscv64(UnwinderRiscv64),
    Aarch64(UnwinderAarch64<SectionData>),
}

impl Unwinder {
    /// Rules for no file yet: every frame is walked by its frame record.
    pub fn new(arch: Arch) -> Unwinder {
        match arch {
            Arch::X86_64 => Unwinder::X86_64(UnwinderX86_64::new()),
            Arch::Riscv64 => Unwinder::Riscv64(UnwinderRiscv64::new()),
            Arch::Aarch64 => Unwinder::Aarch64(UnwinderAarch64::new()),
        }
    }

    pub fn arch(&self) -> Arch {
        match self {
            Unwinder::X86_64(_) => Arch::X86_64,
            Unwinder::Riscv64(_) => Arch::Riscv64,
            Unwinder::Aarch64(_) => Arch::Aarch64,
        }
    }

    /// Adds the CFI `sections` of the file `name` occupying `avma`, its stated addresses
    /// shifted by `bias`.
    pub fn add_module(
        &mut self,
        name: &str,
        avma: Range<u64>,
        bias: u64,
        sections: ExplicitModuleSectionInfo<SectionData>,
    ) {
        let module = || Module::new(name.to_string(), avma.clone(), bias, sections.clone());
        match self {
            Unwinder::X86_64(unwinder) => unwinder.add_module(module()),
            Unwinder::Aarch64(unwinder) => unwinder.add_module(module()),
            Unwinder::Riscv64(unwinder) => unwinder.add_module(avma.clone(), bias, sections),
        }
    }

    /// Walks one stack from `regs` into `out` ([`crate::walk::walk`]). `regs` must be of
    /// this unwinder's architecture.
    pub fn walk<E>(
        &self,
        cache: &mut WalkCache,
        (regs, leaf): (Regs, Leaf),
        is_code: impl Fn(u64) -> bool,
        read: impl FnMut(u64) -> Result<u64, Unread<E>>,
        out: &mut Vec<u64>,
    ) -> Result<WalkEnd, E> {
        addresses_only(is_code, out, |code, trail| {
            self.walk_trail(cache, (regs, leaf), code, read, trail)
        })
    }

    /// Walks one stack from `regs` into `out`, keeping each frame's stack pointer and why
    /// the walk stopped ([`crate::walk::walk_trail`]). `regs` must be of this unwinder's
    /// architecture.
    pub fn walk_trail<E>(
        &self,
        cache: &mut WalkCache,
        (regs, leaf): (Regs, Leaf),
        code: impl Fn(u64) -> Code,
        read: impl FnMut(u64) -> Result<u64, Unread<E>>,
        out: &mut Trail,
    ) -> Result<WalkEnd, E> {
        debug_assert_eq!(regs.arch, self.arch(), "registers of another architecture");
        let Regs { pc, sp, fp, lr, .. } = regs;
        match self {
            Unwinder::X86_64(unwinder) => {
                let regs = RegsX86_64 { ip: pc, sp, bp: fp };
                walk_trail(unwinder, cache.x86_64(), (regs, leaf), code, read, out)
            }
            Unwinder::Aarch64(unwinder) => {
                let regs = RegsAarch64 { pc, sp, fp, lr };
                walk_trail(unwinder, cache.aarch64(), (regs, leaf), code, read, out)
            }
            Unwinder::Riscv64(unwinder) => {
                let regs = RegsRiscv64 { pc, sp, fp, ra: lr };
                walk_trail(unwinder, cache.riscv64(), (regs, leaf), code, read, out)
            }
        }
    }
}

/// Rules already looked up, kept from walk to walk; made on the first walk of each
/// architecture, so one cache serves unwinders of any.
#[derive(Default)]
pub struct WalkCache {
    x86_64: Option<Box<CacheX86_64>>,
    riscv64: Option<CacheRiscv64>,
    aarch64: Option<Box<CacheAarch64>>,
}

impl WalkCache {
    fn x86_64(&mut self) -> &mut CacheX86_64 {
        self.x86_64.get_or_insert_with(Default::default)
    }

    fn aarch64(&mut self) -> &mut CacheAarch64 {
        self.aarch64.get_or_insert_with(Default::default)
    }

    fn riscv64(&mut self) -> &mut CacheRiscv64 {
        self.riscv64.get_or_insert_with(Default::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_instructions_are_the_isa_encodings() {
        let word = |arch: Arch| {
            let bytes: [u8; 4] = arch.idle_instruction().try_into().unwrap();
            u32::from_le_bytes(bytes)
        };
        // riscv64 WFI: funct12 0b0001_0000_0101, rs1 0, funct3 PRIV (0), rd 0, SYSTEM.
        assert_eq!(word(Arch::Riscv64), (0x105 << 20) | 0b111_0011);
        // aarch64 WFI: the HINT space (0xd503201f) with CRm:op2 = 3.
        assert_eq!(word(Arch::Aarch64), 0xd503_201f | (3 << 5));
        assert_eq!(Arch::X86_64.idle_instruction(), [0xf4]);
    }

    #[test]
    fn architectures_are_named_from_elf_headers_and_kernels() {
        assert_eq!(Arch::of_machine(elf::EM_RISCV), Some(Arch::Riscv64));
        assert_eq!(Arch::of_machine(elf::EM_AARCH64), Some(Arch::Aarch64));
        assert_eq!(Arch::of_machine(elf::EM_PPC64), None);
        assert_eq!(Arch::of_kernel_name("aarch64"), Some(Arch::Aarch64));
        assert_eq!(Arch::of_kernel_name("x86_64"), Some(Arch::X86_64));
        assert_eq!(Arch::of_kernel_name("i686"), None);
    }

    #[test]
    fn an_aarch64_unwinder_follows_aarch64_frame_records() {
        // No CFI: each frame record at x29 holds the caller's x29 and its return address.
        let memory = std::collections::HashMap::from([
            (0x1010u64, 0x1030u64),
            (0x1018, 0x5008),
            (0x1030, 0x1050),
            (0x1038, 0x6008),
            (0x1050, 0),
            (0x1058, 0),
        ]);
        let read = |addr| memory.get(&addr).copied().ok_or(Unread::<()>::Unreadable);
        let regs = Regs {
            arch: Arch::Aarch64,
            pc: 0x4000,
            sp: 0x1000,
            fp: 0x1010,
            lr: 0x5008,
        };
        let unwinder = Unwinder::new(Arch::Aarch64);
        assert_eq!(unwinder.arch(), Arch::Aarch64);
        let mut out = Vec::new();
        let mut cache = WalkCache::default();
        let end = unwinder.walk(&mut cache, (regs, Leaf::Rules), |_| true, read, &mut out);
        assert_eq!(end, Ok(WalkEnd::Complete));
        assert_eq!(out, [0x4000, 0x5007, 0x6007]);
    }
}
