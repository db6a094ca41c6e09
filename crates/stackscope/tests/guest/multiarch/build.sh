#!/usr/bin/env bash
# Builds the riscv64 or aarch64 test kernel twice into OUT_DIR, with clang and lld:
# kernel-fp.elf (frame pointers, no CFI at all: only the frame chain unwinds it) and
# kernel-cfi.elf (no frame pointers, .eh_frame: only CFI unwinds it). Used by the guest-kernel
# tests of those architectures.
# Usage: build.sh riscv64|aarch64 OUT_DIR
set -euo pipefail
arch=${1:?usage: build.sh riscv64|aarch64 OUT_DIR}
out=${2:?usage: build.sh riscv64|aarch64 OUT_DIR}
src=$(cd "$(dirname "$0")" && pwd)
case "$arch" in
    riscv64)
        target=(--target=riscv64-unknown-elf -march=rv64imac -mabi=lp64 -mcmodel=medany -mno-relax)
        # A leaf keeps a frame record too, as Linux builds riscv64 with frame pointers.
        leaf=-mno-omit-leaf-frame-pointer
        ;;
    aarch64)
        # The MMU is off: all memory is device memory, where unaligned accesses fault.
        target=(--target=aarch64-unknown-elf -mgeneral-regs-only -mstrict-align)
        # A leaf keeps a frame record too: an unwinder without CFI follows the record chain.
        leaf=-mno-omit-leaf-frame-pointer
        ;;
    *) echo "build.sh: unknown architecture $arch" >&2; exit 2 ;;
esac
mkdir -p "$out"
common=(
    "${target[@]}" -O2 -g -ffreestanding -fno-builtin -nostdlib -static -fno-pic
    -fno-stack-protector -I "$src/$arch"
    # Keep every caller on the stack: a tail call would drop kmain from the samples.
    -fno-optimize-sibling-calls
)
link=(
    -fuse-ld=lld -Wl,-T,"$src/$arch/kernel.ld" -Wl,--eh-frame-hdr -Wl,--build-id=none
    # No assembler-local labels (.L*) in the symbol table: they would name frames.
    -Wl,--discard-locals
)
build() {
    local name=$1
    shift
    # A private name, then a rename: a concurrent build never leaves a half-written kernel.
    # The entry is assembled without debug info: an assembler's DWARF unit describes no
    # function, only lines, and the ELF symbol names _start.
    clang "${common[@]}" "$@" -g0 -c -o "$out/.$name.$$.o" "$src/$arch/start.S"
    clang "${common[@]}" "${link[@]}" "$@" -o "$out/.$name.$$" "$out/.$name.$$.o" "$src/kernel.c"
    rm -f "$out/.$name.$$.o"
    mv "$out/.$name.$$" "$out/$name"
}
build kernel-fp.elf -fno-omit-frame-pointer "$leaf" -fno-asynchronous-unwind-tables \
    -fno-unwind-tables -DKERNEL_NO_EH_FRAME
# -g still leaves CFI in .debug_frame: drop it, so that no unwind table of any kind is left.
llvm-objcopy --remove-section=.debug_frame "$out/kernel-fp.elf"
build kernel-cfi.elf -fomit-frame-pointer -fasynchronous-unwind-tables
