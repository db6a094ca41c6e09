//! The architectures a target may run: which one an ELF file is built for, whether the stub
//! describes the same one, where the registers a walk starts from sit in the stub's `g` reply,
//! and each one's unwinder for the one walk of `stackscope_stacks::walk`.

use std::ops::Range;

use framehop::aarch64::{CacheAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use framehop::Module;
use object::elf;
use stackscope_stacks::module::SectionData;
use stackscope_stacks::walk::{
    walk, CacheRiscv64, Leaf, RegsAarch64, RegsRiscv64, RegsX86_64, Unread, UnwinderRiscv64,
    WalkEnd,
};

use crate::client::Registers;
use crate::image::Image;

/// An architecture stackscope samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86-64",
            Arch::Riscv64 => "riscv64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The instruction that waits for an interrupt, as it sits in memory (little-endian):
    /// x86-64 `hlt`, riscv64 and aarch64 `wfi`. A vCPU stopped right after one idles: its
    /// registers stay the same because it waits, not because the host left it without time.
    pub fn idle_instruction(self) -> &'static [u8] {
        match self {
            Arch::X86_64 => &[0xf4],
            // 0x10500073: SYSTEM with funct12 0x105.
            Arch::Riscv64 => &[0x73, 0x00, 0x50, 0x10],
            // 0xd503207f: HINT #3.
            Arch::Aarch64 => &[0x7f, 0x20, 0x03, 0xd5],
        }
    }

    /// True when a target description's `<architecture>` (GDB's BFD name) is this one.
    pub fn is_described_by(self, architecture: &str) -> bool {
        let bfd = match self {
            Arch::X86_64 => "i386:x86-64",
            Arch::Riscv64 => "riscv:rv64",
            Arch::Aarch64 => "aarch64",
        };
        architecture == bfd || architecture.starts_with(&format!("{bfd}:"))
    }

    /// The names a target description gives the registers a walk starts from: the program
    /// counter, the stack pointer, the frame pointer and the link register (none on x86-64,
    /// whose calls push the return address).
    fn register_names(self) -> [&'static [&'static str]; 4] {
        match self {
            Arch::X86_64 => [&["rip"], &["rsp"], &["rbp"], &[]],
            Arch::Riscv64 => [&["pc"], &["sp"], &["fp", "s0"], &["ra"]],
            Arch::Aarch64 => [&["pc"], &["sp"], &["x29", "fp"], &["x30", "lr"]],
        }
    }

    /// The `g` reply's layout when the stub sends no target description: GDB's own order of
    /// the architecture's core registers, 64 bits each (x86-64: rax rbx rcx rdx rsi rdi rbp
    /// rsp r8..r15 rip; riscv64: x0..x31 pc; aarch64: x0..x30 sp pc).
    pub fn default_layout(self) -> Layout {
        let names: Vec<String> = match self {
            Arch::X86_64 => ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp"]
                .iter()
                .map(|n| n.to_string())
                .chain((8..16).map(|i| format!("r{i}")))
                .chain(["rip".to_string()])
                .collect(),
            Arch::Riscv64 => ["zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "fp"]
                .iter()
                .map(|n| n.to_string())
                .chain((9..32).map(|i| format!("x{i}")))
                .chain(["pc".to_string()])
                .collect(),
            Arch::Aarch64 => (0..31)
                .map(|i| format!("x{i}"))
                .chain(["sp".to_string(), "pc".to_string()])
                .collect(),
        };
        let registers: Vec<(String, usize)> = names.into_iter().map(|n| (n, 64)).collect();
        Layout::of(self, &registers).expect("the default layout names every register")
    }
}

/// Where the program counter, stack pointer, frame pointer and link register sit in a `g`
/// reply, as byte ranges of the decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    arch: Arch,
    slots: [Option<Range<usize>>; 4],
    /// Bytes the reply must hold to reach every slot.
    needed: usize,
}

impl Layout {
    /// The layout of `registers` (name, bits), listed in register-number order as a target
    /// description numbers them; the `g` reply holds them in that order. Errs naming a
    /// register the walk needs that is missing or not 64 bits wide.
    pub fn of(arch: Arch, registers: &[(String, usize)]) -> Result<Layout, String> {
        let mut slots: [Option<Range<usize>>; 4] = Default::default();
        let mut offset = 0;
        for (name, bits) in registers {
            let size = bits.div_ceil(8);
            for (slot, names) in slots.iter_mut().zip(arch.register_names()) {
                if slot.is_none() && names.contains(&name.as_str()) {
                    if *bits != 64 {
                        return Err(format!("its register {name} is {bits} bits, not 64"));
                    }
                    *slot = Some(offset..offset + size);
                }
            }
            offset += size;
        }
        for (slot, names) in slots.iter().zip(arch.register_names()).take(3) {
            if slot.is_none() {
                return Err(format!("it lists no register {}", names[0]));
            }
        }
        let needed = slots.iter().flatten().map(|s| s.end).max().unwrap_or(0);
        Ok(Layout {
            arch,
            slots,
            needed,
        })
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The registers in a decoded `g` reply; `None` when it is too short or a register is
    /// unavailable (`xx` in the reply, `None` here).
    pub fn decode(&self, bytes: &[Option<u8>]) -> Option<Registers> {
        if bytes.len() < self.needed {
            return None;
        }
        let value = |slot: &Option<Range<usize>>| -> Option<u64> {
            let Some(range) = slot else {
                return Some(0);
            };
            let mut word = [0u8; 8];
            for (b, byte) in word.iter_mut().zip(&bytes[range.clone()]) {
                *b = (*byte)?;
            }
            Some(u64::from_le_bytes(word))
        };
        Some(Registers {
            pc: value(&self.slots[0])?,
            sp: value(&self.slots[1])?,
            fp: value(&self.slots[2])?,
            lr: value(&self.slots[3])?,
            fingerprint: 0,
        })
    }
}

/// The unwind rules of a target's files, for its architecture.
pub enum Unwinder {
    X86_64(UnwinderX86_64<SectionData>),
    Riscv64(UnwinderRiscv64),
    Aarch64(UnwinderAarch64<SectionData>),
}

impl Unwinder {
    /// The rules of `images`, all of architecture `arch`.
    pub fn of(arch: Arch, images: &[Image]) -> Unwinder {
        match arch {
            Arch::X86_64 => Unwinder::X86_64(with_modules(UnwinderX86_64::new(), images)),
            Arch::Aarch64 => Unwinder::Aarch64(with_modules(UnwinderAarch64::new(), images)),
            Arch::Riscv64 => {
                let mut unwinder = UnwinderRiscv64::new();
                for image in images {
                    if let Some(sections) = image.unwind_sections() {
                        unwinder.add_module(image.address_range(), image.bias(), sections);
                    }
                }
                Unwinder::Riscv64(unwinder)
            }
        }
    }
}

/// A framehop unwinder with the CFI of `images`.
fn with_modules<U>(mut unwinder: U, images: &[Image]) -> U
where
    U: framehop::Unwinder<Module = Module<SectionData>>,
{
    for module in images.iter().filter_map(Image::framehop_module) {
        unwinder.add_module(module);
    }
    unwinder
}

/// Rules already looked up, kept from round to round; made on the first walk, for the
/// architecture walked.
#[derive(Default)]
pub struct WalkCache {
    x86_64: Option<Box<CacheX86_64>>,
    riscv64: Option<CacheRiscv64>,
    aarch64: Option<Box<CacheAarch64>>,
}

/// Walks one stack from `regs` with `unwinder`'s rules into `out` (see
/// [`stackscope_stacks::walk::walk`]).
pub fn walk_stack<E>(
    unwinder: &Unwinder,
    cache: &mut WalkCache,
    regs: Registers,
    leaf: Leaf,
    read: impl FnMut(u64) -> Result<u64, Unread<E>>,
    out: &mut Vec<u64>,
) -> Result<WalkEnd, E> {
    let is_code = |_| true;
    let Registers { pc, sp, fp, lr, .. } = regs;
    match unwinder {
        Unwinder::X86_64(unwinder) => {
            let cache = cache.x86_64.get_or_insert_with(Default::default);
            let regs = RegsX86_64 { ip: pc, sp, bp: fp };
            walk(unwinder, &mut **cache, regs, leaf, is_code, read, out)
        }
        Unwinder::Aarch64(unwinder) => {
            let cache = cache.aarch64.get_or_insert_with(Default::default);
            let regs = RegsAarch64 { pc, sp, fp, lr };
            walk(unwinder, &mut **cache, regs, leaf, is_code, read, out)
        }
        Unwinder::Riscv64(unwinder) => {
            let cache = cache.riscv64.get_or_insert_with(Default::default);
            let regs = RegsRiscv64 { pc, sp, fp, ra: lr };
            walk(unwinder, cache, regs, leaf, is_code, read, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(names: &[&str], bits: usize) -> Vec<(String, usize)> {
        names.iter().map(|n| (n.to_string(), bits)).collect()
    }

    #[test]
    fn layouts_find_the_walk_registers_by_name() {
        let layout = Arch::Aarch64.default_layout();
        let mut bytes = vec![Some(0u8); 33 * 8];
        bytes[29 * 8] = Some(0x29);
        bytes[30 * 8] = Some(0x30);
        bytes[31 * 8] = Some(0x31);
        bytes[32 * 8] = Some(0x32);
        let got = layout.decode(&bytes).unwrap();
        assert_eq!((got.fp, got.lr, got.sp, got.pc), (0x29, 0x30, 0x31, 0x32));
        assert_eq!(layout.decode(&bytes[..32 * 8]), None, "too short");
        bytes[31 * 8 + 3] = None;
        assert_eq!(layout.decode(&bytes), None, "sp unavailable");

        let x86 = Arch::X86_64.default_layout();
        assert_eq!(x86.slots[0], Some(128..136));
        assert_eq!(x86.slots[3], None, "x86-64 has no link register");
        let riscv = Arch::Riscv64.default_layout();
        assert_eq!(
            riscv.slots,
            [Some(256..264), Some(16..24), Some(64..72), Some(8..16)]
        );
    }

    #[test]
    fn a_layout_without_a_walk_register_or_with_a_narrow_one_is_refused() {
        let err = Layout::of(Arch::Riscv64, &regs(&["ra", "sp", "s0"], 64)).unwrap_err();
        assert_eq!(err, "it lists no register pc");
        let err = Layout::of(Arch::X86_64, &regs(&["rip", "rsp", "rbp"], 32)).unwrap_err();
        assert_eq!(err, "its register rip is 32 bits, not 64");
    }

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
    fn descriptions_name_architectures_as_gdb_does() {
        assert!(Arch::X86_64.is_described_by("i386:x86-64"));
        assert!(Arch::Riscv64.is_described_by("riscv:rv64"));
        assert!(Arch::Aarch64.is_described_by("aarch64"));
        assert!(!Arch::X86_64.is_described_by("riscv:rv64"));
        assert!(!Arch::Riscv64.is_described_by("riscv:rv32"));
        assert_eq!(Arch::of_machine(elf::EM_RISCV), Some(Arch::Riscv64));
        assert_eq!(Arch::of_machine(elf::EM_PPC64), None);
    }
}
