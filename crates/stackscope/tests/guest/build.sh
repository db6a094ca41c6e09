#!/usr/bin/env bash
# Builds the test kernel of one architecture twice into OUT_DIR: kernel-fp.elf (frame
# pointers, no CFI at all: only the frame chain unwinds it) and kernel-cfi.elf (no frame
# pointers, .eh_frame: only CFI unwinds it). x86-64 is built with gcc and GNU ld, riscv64 and
# aarch64 with clang --target and lld. Used by the guest-kernel tests and benches/gdb_vs_osdk.sh.
# Usage: build.sh x86_64|riscv64|aarch64 OUT_DIR
set -euo pipefail
usage="usage: build.sh x86_64|riscv64|aarch64 OUT_DIR"
arch=${1:?$usage}
out=${2:?$usage}
src=$(cd "$(dirname "$0")" && pwd)
case "$arch" in
    x86_64)
        cc=gcc
        objcopy=objcopy
        target=(-mno-red-zone -mgeneral-regs-only -fcf-protection=none)
        # gcc keeps a frame in a leaf that touches the stack, as spin_a and spin_b do.
        leaf=()
        link=(-no-pie -Wl,--no-warn-rwx-segments)
        ;;
    riscv64)
        cc=clang
        objcopy=llvm-objcopy
        target=(--target=riscv64-unknown-elf -march=rv64imac -mabi=lp64 -mcmodel=medany -mno-relax)
        # A leaf keeps a frame record too, as Linux builds riscv64 with frame pointers.
        leaf=(-mno-omit-leaf-frame-pointer)
        link=(-fuse-ld=lld)
        ;;
    aarch64)
        cc=clang
        objcopy=llvm-objcopy
        # The MMU is off: all memory is device memory, where unaligned accesses fault.
        target=(--target=aarch64-unknown-elf -mgeneral-regs-only -mstrict-align)
        # A leaf keeps a frame record too: an unwinder without CFI follows the record chain.
        leaf=(-mno-omit-leaf-frame-pointer)
        link=(-fuse-ld=lld)
        ;;
    *) echo "build.sh: unknown architecture $arch ($usage)" >&2; exit 2 ;;
esac
mkdir -p "$out"
common=(
    "${target[@]}" -O2 -g -ffreestanding -fno-builtin -nostdlib -static -fno-pic
    -fno-stack-protector -I "$src/$arch"
    # Keep every caller on the stack: a tail call would drop kmain from the samples.
    -fno-optimize-sibling-calls
)
link+=(
    -Wl,-T,"$src/$arch/kernel.ld" -Wl,--eh-frame-hdr -Wl,--build-id=none
    # No assembler-local labels (.L*) in the symbol table: they would name frames.
    -Wl,--discard-locals
)
build() {
    local name=$1
    shift
    # A private name, then a rename: a concurrent build never leaves a half-written kernel.
    # The entry is assembled without debug info: an assembler's DWARF unit describes no
    # function, only lines, and the ELF symbol names the entry.
    "$cc" "${common[@]}" "$@" -g0 -c -o "$out/.$name.$$.o" "$src/$arch/start.S"
    "$cc" "${common[@]}" "${link[@]}" "$@" -o "$out/.$name.$$" "$out/.$name.$$.o" "$src/kernel.c"
    rm -f "$out/.$name.$$.o"
    mv "$out/.$name.$$" "$out/$name"
}
build kernel-fp.elf -fno-omit-frame-pointer "${leaf[@]}" -fno-asynchronous-unwind-tables \
    -fno-unwind-tables -DKERNEL_NO_EH_FRAME
# -g still leaves CFI in .debug_frame: drop it, so that no unwind table of any kind is left.
"$objcopy" --remove-section=.debug_frame "$out/kernel-fp.elf"
build kernel-cfi.elf -fomit-frame-pointer -fasynchronous-unwind-tables
