//! The user registers a sample copies, for the architecture of the kernel that took it: which
//! ones the perf source asks for (those a walk starts from, by perf's register numbers), and
//! reading them back, from a live ring's record or from a perf.data sample. The kernel writes
//! the registers of a sample in the order of their numbers.

use stackscope_stacks::arch::{Arch, Regs};

/// perf's numbers of the registers a walk starts from: program counter, stack pointer,
/// frame pointer, and link register where the architecture has one (the kernel's
/// `arch/*/include/uapi/asm/perf_regs.h`).
fn numbers(arch: Arch) -> [Option<u32>; 4] {
    match arch {
        // PERF_REG_X86_IP, _SP, _BP.
        Arch::X86_64 => [Some(8), Some(7), Some(6), None],
        // PERF_REG_ARM64_PC, _SP, x29, x30 (lr).
        Arch::Aarch64 => [Some(32), Some(31), Some(29), Some(30)],
        // PERF_REG_RISCV_PC, _SP, _S0, _RA.
        Arch::Riscv64 => [Some(0), Some(2), Some(8), Some(1)],
    }
}

/// The `sample_regs_user` mask asking for the registers a walk of `arch` starts from.
pub(crate) fn mask(arch: Arch) -> u64 {
    numbers(arch).into_iter().flatten().map(|n| 1 << n).sum()
}

/// The registers a walk starts from, of a sample of `arch` that carries registers by their
/// number (`get`); `None` when one it needs is missing.
pub(crate) fn by_number(arch: Arch, get: impl Fn(u32) -> Option<u64>) -> Option<Regs> {
    let [pc, sp, fp, lr] = numbers(arch);
    let value = |n: Option<u32>| n.map_or(Some(0), &get);
    Some(Regs {
        arch,
        pc: value(pc)?,
        sp: value(sp)?,
        fp: value(fp)?,
        lr: value(lr)?,
    })
}

/// The architecture whose registers a recording's `sample_regs_user` mask asks for, for a
/// perf.data file whose header does not say: perf asks for all of an architecture's
/// registers. x86-64 numbers none from 24 to 31 (its vector registers start at 32), aarch64
/// numbers its pc 32, riscv64 ends at 31.
pub(crate) fn arch_of_mask(mask: u64) -> Option<Arch> {
    let walk_registers = |arch| mask & self::mask(arch) == self::mask(arch);
    let arch = match (mask & 0xff00_0000 != 0, mask & (1 << 32) != 0) {
        (true, true) => Arch::Aarch64,
        (true, false) => Arch::Riscv64,
        (false, _) => Arch::X86_64,
    };
    walk_registers(arch).then_some(arch)
}

/// The architecture of the running kernel, whose registers its samples carry; `None` for
/// one stackscope does not walk.
pub(crate) fn running_arch() -> Option<Arch> {
    // SAFETY: `utsname` is plain bytes, for which all zeroes is a valid value.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `name` lives and is writable for the call, which fills it.
    if unsafe { libc::uname(&mut name) } != 0 {
        return None;
    }
    // SAFETY: uname leaves `machine` NUL-terminated within its bounds.
    let machine = unsafe { std::ffi::CStr::from_ptr(name.machine.as_ptr()) };
    Arch::of_kernel_name(machine.to_str().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_starts_from_the_registers_of_its_architecture() {
        // Each register reads back as its own number, so the fields say which was taken.
        let number = |n: u32| Some(u64::from(n));
        let regs = by_number(Arch::Aarch64, number).unwrap();
        assert_eq!((regs.pc, regs.sp, regs.fp, regs.lr), (32, 31, 29, 30));
        // x86-64 has no link register.
        let regs = by_number(Arch::X86_64, number).unwrap();
        assert_eq!((regs.pc, regs.sp, regs.fp, regs.lr), (8, 7, 6, 0));
        let regs = by_number(Arch::Riscv64, number).unwrap();
        assert_eq!((regs.pc, regs.sp, regs.fp, regs.lr), (0, 2, 8, 1));
        // A register the sample lacks: no start.
        assert_eq!(by_number(Arch::Aarch64, |n| (n != 30).then_some(1)), None);
        assert_eq!(mask(Arch::X86_64), 0x1c0);
        assert_eq!(
            mask(Arch::Aarch64),
            (1 << 29) | (1 << 30) | (1 << 31) | (1 << 32)
        );
    }

    #[test]
    fn a_recording_without_its_arch_is_known_by_the_registers_it_asked_for() {
        // What perf record --call-graph dwarf asks for on each.
        let x86_64 = 0xff0fff;
        let aarch64 = (1 << 33) - 1;
        let riscv64 = (1 << 32) - 1;
        assert_eq!(arch_of_mask(x86_64), Some(Arch::X86_64));
        assert_eq!(arch_of_mask(aarch64), Some(Arch::Aarch64));
        assert_eq!(arch_of_mask(riscv64), Some(Arch::Riscv64));
        assert_eq!(arch_of_mask(mask(Arch::Aarch64)), Some(Arch::Aarch64));
        assert_eq!(arch_of_mask(mask(Arch::X86_64)), Some(Arch::X86_64));
        assert_eq!(arch_of_mask(0), None);
    }
}
