//! AArch64 registers for the walk: pointer-authenticated return addresses, and a leaf whose
//! return address is still in the link register (x30) because it has not stored its frame
//! record yet, or has already restored its caller's.

use framehop::aarch64::{CacheAarch64, PtrAuthMask, UnwindRegsAarch64, UnwinderAarch64};
use framehop::{Error as FramehopError, FrameAddress, Unwinder as _};

use super::ArchRegs;
use crate::module::SectionData;

/// AArch64 registers: the link register holds the leaf's return address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegsAarch64 {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
}

impl ArchRegs for RegsAarch64 {
    type Unwinder = UnwinderAarch64<SectionData>;
    type Cache = CacheAarch64;
    type Unwind = UnwindRegsAarch64;

    fn pc(&self) -> u64 {
        self.pc
    }
    fn sp(&self) -> u64 {
        self.sp
    }
    fn fp(&self) -> u64 {
        self.fp
    }
    fn unwind_regs(&self) -> UnwindRegsAarch64 {
        UnwindRegsAarch64::new_with_ptr_auth_mask(ptr_auth_mask(self.pc), self.lr, self.sp, self.fp)
    }
    fn caller(return_address: u64, sp: u64, fp: u64) -> UnwindRegsAarch64 {
        UnwindRegsAarch64::new_with_ptr_auth_mask(
            ptr_auth_mask(return_address),
            return_address,
            sp,
            fp,
        )
    }
    fn code_address(return_address: u64) -> u64 {
        ptr_auth_mask(return_address).strip_ptr_auth(return_address)
    }
    const LINK_REGISTER: bool = true;
    fn link_register_caller(&self, [before, at, next]: [u32; 3]) -> Option<(u64, u64)> {
        let caller_sp = self.sp.checked_add(leaf_frame_size(before, at, next)?)?;
        Some((Self::code_address(self.lr), caller_sp))
    }
    fn unwind_sp(regs: &UnwindRegsAarch64) -> u64 {
        regs.sp()
    }
    fn unwind_frame<F: FnMut(u64) -> Result<u64, ()>>(
        unwinder: &Self::Unwinder,
        cache: &mut CacheAarch64,
        address: FrameAddress,
        regs: &mut UnwindRegsAarch64,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError> {
        unwinder.unwind_frame(address, regs, cache, read)
    }
}

/// The bits of an aarch64 user return address (bit 55 clear) that are address, the rest
/// being its pointer authentication code; the eBPF walker strips with the same mask.
pub const AARCH64_USER_CODE_MASK: u64 = u64::MAX >> 16;

/// What of an aarch64 return address is address: code signed with pointer authentication
/// (`paciasp`, as distributions build their arm64 libraries) stores its return addresses with
/// the signature in the bits above the address. Linux gives user space 48 bits of address
/// unless a program asks for more, so in the lower half (bit 55 clear) everything above them
/// is signature; kernel addresses (upper half) are left as they are.
fn ptr_auth_mask(address: u64) -> PtrAuthMask {
    if address & (1 << 55) == 0 {
        PtrAuthMask(AARCH64_USER_CODE_MASK)
    } else {
        PtrAuthMask::new_no_strip()
    }
}

/// How far sp is below the caller's when the instruction `at` (between `before` and `next`)
/// is about to run in a function whose frame pointer is still its caller's and whose return
/// address is in x30: the start of a prologue (`paciasp`, `bti c`, the frame record's
/// store, or the frame's `sub sp` right before it), the frame pointer's set-up right after
/// the record's store, or an epilogue past the record's load (`add sp`, `autiasp`, `ret`).
/// None anywhere else: the function's own frame record says where its caller is.
fn leaf_frame_size(before: u32, at: u32, next: u32) -> Option<u64> {
    let returns = |insn| is_return(insn) || is_authenticate(insn);
    let entry = is_entry_hint(at) || frame_record_push(at).is_some();
    if entry || (sp_sub(at).is_some() && is_frame_record_store(next)) {
        Some(0)
    } else if is_frame_record_store(at) {
        sp_sub(before)
    } else if is_frame_pointer_setup(at) {
        frame_record_push(before)
    } else if returns(at) {
        Some(0)
    } else if returns(next) {
        sp_add(at)
    } else {
        None
    }
}

/// `paciasp`, `pacibsp` or `bti c`/`bti jc`: a function's first instruction.
fn is_entry_hint(insn: u32) -> bool {
    matches!(insn, 0xd503_233f | 0xd503_237f | 0xd503_245f | 0xd503_24df)
}

/// `autiasp` or `autibsp`: authenticates x30 right before the return.
fn is_authenticate(insn: u32) -> bool {
    matches!(insn, 0xd503_23bf | 0xd503_23ff)
}

/// `ret`, `retaa` or `retab`.
fn is_return(insn: u32) -> bool {
    matches!(insn, 0xd65f_03c0 | 0xd65f_0bff | 0xd65f_0fff)
}

/// `stp x29, x30, [sp, #-N]!`: the bytes it moves sp down by.
fn frame_record_push(insn: u32) -> Option<u64> {
    if insn & 0xffc0_7fff != 0xa980_7bfd {
        return None;
    }
    // imm7, signed, in units of 8 bytes.
    let imm7 = ((insn >> 15) & 0x7f) as i64;
    let offset = (imm7 << 57 >> 57) * 8;
    u64::try_from(-offset).ok()
}

/// `stp x29, x30, [sp, #N]`: the frame record stored into a frame already made.
fn is_frame_record_store(insn: u32) -> bool {
    insn & 0xffc0_7fff == 0xa900_7bfd
}

/// `mov x29, sp` or `add x29, sp, #N`.
fn is_frame_pointer_setup(insn: u32) -> bool {
    insn & 0xff80_03ff == 0x9100_03fd
}

/// `sub sp, sp, #N`: N.
fn sp_sub(insn: u32) -> Option<u64> {
    (insn & 0xff80_03ff == 0xd100_03ff).then(|| add_sub_immediate(insn))
}

/// `add sp, sp, #N`: N.
fn sp_add(insn: u32) -> Option<u64> {
    (insn & 0xff80_03ff == 0x9100_03ff).then(|| add_sub_immediate(insn))
}

/// The immediate of an add/sub (immediate) instruction: imm12, shifted by 12 when `sh` is set.
fn add_sub_immediate(insn: u32) -> u64 {
    let imm12 = u64::from((insn >> 10) & 0xfff);
    match insn & (1 << 22) {
        0 => imm12,
        _ => imm12 << 12,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACIASP: u32 = 0xd503_233f;
    const STP_PUSH_32: u32 = 0xa9be_7bfd; // stp x29, x30, [sp, #-32]!
    const MOV_FP_SP: u32 = 0x9100_03fd; // mov x29, sp
    const SUB_SP_64: u32 = 0xd101_03ff; // sub sp, sp, #64
    const STP_AT_48: u32 = 0xa903_7bfd; // stp x29, x30, [sp, #48]
    const ADD_FP_48: u32 = 0x9100_c3fd; // add x29, sp, #48
    const LDP_POP_32: u32 = 0xa8c2_7bfd; // ldp x29, x30, [sp], #32
    const ADD_SP_64: u32 = 0x9101_03ff; // add sp, sp, #64
    const AUTIASP: u32 = 0xd503_23bf;
    const RET: u32 = 0xd65f_03c0;
    const NOP: u32 = 0xd503_201f;
    const ADD_X0: u32 = 0x9100_0400; // add x0, x0, #1

    #[test]
    fn a_prologue_before_the_frame_pointer_is_set_returns_through_x30() {
        assert_eq!(leaf_frame_size(NOP, PACIASP, STP_PUSH_32), Some(0));
        assert_eq!(leaf_frame_size(PACIASP, STP_PUSH_32, MOV_FP_SP), Some(0));
        assert_eq!(leaf_frame_size(STP_PUSH_32, MOV_FP_SP, ADD_X0), Some(32));
        assert_eq!(leaf_frame_size(RET, SUB_SP_64, STP_AT_48), Some(0));
        assert_eq!(leaf_frame_size(SUB_SP_64, STP_AT_48, ADD_FP_48), Some(64));
    }

    #[test]
    fn an_epilogue_past_the_records_load_returns_through_x30() {
        assert_eq!(leaf_frame_size(LDP_POP_32, AUTIASP, RET), Some(0));
        assert_eq!(leaf_frame_size(LDP_POP_32, RET, NOP), Some(0));
        assert_eq!(leaf_frame_size(STP_AT_48, ADD_SP_64, RET), Some(64));
    }

    #[test]
    fn a_body_or_a_record_not_yet_loaded_keeps_the_frame_pointer() {
        assert_eq!(leaf_frame_size(MOV_FP_SP, ADD_X0, ADD_X0), None);
        assert_eq!(leaf_frame_size(ADD_X0, LDP_POP_32, RET), None);
        // A frame made by `sub sp` in a body, with no frame record stored after it.
        assert_eq!(leaf_frame_size(ADD_X0, SUB_SP_64, ADD_X0), None);
        // A frame record stored after something other than the frame's `sub sp`.
        assert_eq!(leaf_frame_size(ADD_X0, STP_AT_48, ADD_FP_48), None);
    }

    #[test]
    fn the_caller_is_x30_unsigned_with_sp_back_where_the_caller_had_it() {
        let regs = RegsAarch64 {
            pc: 0x4000,
            sp: 0x1000,
            fp: 0x1100,
            lr: 0x002a_0000_0000_5008,
        };
        assert_eq!(
            regs.link_register_caller([STP_PUSH_32, MOV_FP_SP, ADD_X0]),
            Some((0x5008, 0x1020))
        );
        assert_eq!(regs.link_register_caller([NOP, ADD_X0, RET]), None);
    }
}
