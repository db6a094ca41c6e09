#!/usr/bin/env bash
# Builds the test kernel twice into OUT_DIR: kernel-fp.elf (frame pointers, no CFI at all: only
# the frame chain unwinds it) and kernel-cfi.elf (no frame pointers, .eh_frame: only CFI unwinds
# it). Used by the guest-kernel tests and benches/gdb_vs_osdk.sh.
# Usage: build.sh OUT_DIR
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
common=(
    -O2 -g -ffreestanding -fno-builtin -nostdlib -static -no-pie -fno-pic
    -mno-red-zone -mgeneral-regs-only -fno-stack-protector -fcf-protection=none
    # Keep every caller on the stack: a tail call would drop kmain from the samples.
    -fno-optimize-sibling-calls
    -Wl,-T,"$src/kernel.ld" -Wl,--eh-frame-hdr -Wl,--no-warn-rwx-segments -Wl,--build-id=none
)
build() {
    local name=$1
    shift
    # A private name, then a rename: a concurrent build never leaves a half-written kernel.
    gcc "${common[@]}" "$@" -o "$out/.$name.$$" "$src/entry.S" "$src/kernel.c"
    mv "$out/.$name.$$" "$out/$name"
}
build kernel-fp.elf -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables \
    -DKERNEL_NO_EH_FRAME
# -g still leaves CFI in .debug_frame: drop it, so that no unwind table of any kind is left.
objcopy --remove-section=.debug_frame "$out/kernel-fp.elf"
build kernel-cfi.elf -fomit-frame-pointer -fasynchronous-unwind-tables
