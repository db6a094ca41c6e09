//! Where the registers a walk starts from sit in a stub's `g` reply, for the target's
//! architecture: by the names its target description gives them, or in GDB's own order when
//! the stub sends none.

use std::ops::Range;

use stackscope_stacks::arch::Arch;

use super::Registers;

/// The names a target description gives the registers a walk starts from: the program
/// counter, the stack pointer, the frame pointer and the link register (none on x86-64,
/// whose calls push the return address).
fn register_names(arch: Arch) -> [&'static [&'static str]; 4] {
    match arch {
        Arch::X86_64 => [&["rip"], &["rsp"], &["rbp"], &[]],
        Arch::Riscv64 => [&["pc"], &["sp"], &["fp", "s0"], &["ra"]],
        Arch::Aarch64 => [&["pc"], &["sp"], &["x29", "fp"], &["x30", "lr"]],
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
    /// The `g` reply's layout when the stub sends no target description: GDB's own order of
    /// the architecture's core registers, 64 bits each (x86-64: rax rbx rcx rdx rsi rdi rbp
    /// rsp r8..r15 rip; riscv64: x0..x31 pc; aarch64: x0..x30 sp pc).
    pub fn default_of(arch: Arch) -> Layout {
        let names: Vec<String> = match arch {
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
        Layout::of(arch, &registers).expect("the default layout names every register")
    }

    /// The layout of `registers` (name, bits), listed in register-number order as a target
    /// description numbers them; the `g` reply holds them in that order. Errs naming a
    /// register the walk needs that is missing or not 64 bits wide.
    pub fn of(arch: Arch, registers: &[(String, usize)]) -> Result<Layout, String> {
        let mut slots: [Option<Range<usize>>; 4] = Default::default();
        let mut offset = 0;
        for (name, bits) in registers {
            let size = bits.div_ceil(8);
            for (slot, names) in slots.iter_mut().zip(register_names(arch)) {
                if slot.is_none() && names.contains(&name.as_str()) {
                    if *bits != 64 {
                        return Err(format!("its register {name} is {bits} bits, not 64"));
                    }
                    *slot = Some(offset..offset + size);
                }
            }
            offset += size;
        }
        for (slot, names) in slots.iter().zip(register_names(arch)).take(3) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(names: &[&str], bits: usize) -> Vec<(String, usize)> {
        names.iter().map(|n| (n.to_string(), bits)).collect()
    }

    #[test]
    fn layouts_find_the_walk_registers_by_name() {
        let layout = Layout::default_of(Arch::Aarch64);
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

        let x86 = Layout::default_of(Arch::X86_64);
        assert_eq!(x86.slots[0], Some(128..136));
        assert_eq!(x86.slots[3], None, "x86-64 has no link register");
        let riscv = Layout::default_of(Arch::Riscv64);
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
}
