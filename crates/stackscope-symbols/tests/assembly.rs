//! Functions written in assembly and assembled with `-g`: their DWARF has a line table for them
//! but, from clang, no function entry (only a label), so the name comes from the symbol table
//! while the file and line still come from the DWARF. For riscv64, the assembler also leaves
//! nameless local symbols inside the function (what its debug sections' relocations point at),
//! which must not take the function's name away.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{line_of, symbol_offset};
use stackscope_symbols::Symbolizer;
use stackscope_testkit::run;
use tempfile::TempDir;

/// A loop whose every instruction has its own line; `ASM_LOOP` marks its first.
const ASM_SOURCE: &str = r#"	.text
	.globl	asm_spin
	.type	asm_spin, @function
asm_spin:
	xorl	%eax, %eax
1:
	addq	$3, %rax /* ASM_LOOP */
	imulq	$7, %rax
	decq	%rdi
	jnz	1b
	ret
	.size	asm_spin, .-asm_spin
	.section .note.GNU-stack,"",@progbits
"#;

const C_CALLER: &str = r#"#include <stdio.h>
#include <stdlib.h>

unsigned long asm_spin(unsigned long n);

int main(int argc, char **argv)
{
    unsigned long n = strtoul(argc > 1 ? argv[1] : "1000", 0, 10);
    printf("%lu\n", asm_spin(n));
    return 0;
}
"#;

fn build(dir: &Path, compiler: &str, dwarf: &str) -> PathBuf {
    std::fs::write(dir.join("hot.S"), ASM_SOURCE).unwrap();
    std::fs::write(dir.join("main.c"), C_CALLER).unwrap();
    let out = dir.join(format!("prog-{compiler}-{dwarf}"));
    run(Command::new(compiler)
        .current_dir(dir)
        .args(["-O1", &format!("-gdwarf-{dwarf}"), "-o"])
        .arg(&out)
        .args(["main.c", "hot.S"]));
    out
}

/// Every byte of `asm_spin` is named `asm_spin`, in `hot.S`, on the lines of its instructions.
fn check(compiler: &str, dwarf: &str) {
    let dir = TempDir::new().unwrap();
    let binary = build(dir.path(), compiler, dwarf);
    let (start, size) = symbol_offset(&binary, |n| n == "asm_spin");
    assert!(size > 0);
    let offsets: Vec<u64> = (start..start + size).collect();
    let all = Symbolizer::with_debug_dirs(Vec::new())
        .symbolize_file(&binary, None, &offsets)
        .unwrap();
    let first = line_of(ASM_SOURCE, "asm_spin:") + 1;
    let last = line_of(ASM_SOURCE, "ret");
    let mut on_loop = 0;
    for (offset, frames) in offsets.iter().zip(&all) {
        let frame = frames
            .first()
            .unwrap_or_else(|| panic!("{compiler} DWARF {dwarf}: nothing names {offset:#x}"));
        assert_eq!(
            frame.name, "asm_spin",
            "{compiler} DWARF {dwarf} at {offset:#x}: {frames:?}"
        );
        assert_eq!(frames.len(), 1, "{compiler} DWARF {dwarf}: {frames:?}");
        let file = frame.file.as_deref().unwrap_or_default();
        assert!(
            file.ends_with("hot.S"),
            "{compiler} DWARF {dwarf}: {frame:?}"
        );
        let line = frame.line.expect("a line from the line table");
        assert!(
            (first..=last).contains(&line),
            "{compiler} DWARF {dwarf}: {frame:?}"
        );
        on_loop += usize::from(line == line_of(ASM_SOURCE, "ASM_LOOP"));
    }
    assert!(
        on_loop > 0,
        "{compiler} DWARF {dwarf}: no byte on the loop's first line"
    );
}

#[test]
fn gcc_dwarf4() {
    check("gcc", "4");
}

#[test]
fn gcc_dwarf5() {
    check("gcc", "5");
}

#[test]
fn clang_dwarf4() {
    check("clang", "4");
}

#[test]
fn clang_dwarf5() {
    check("clang", "5");
}

/// A riscv64 entry in the shape of a kernel's: numeric local labels, and calls that the debug
/// info's line table marks, so nameless local symbols sit in the middle of `_start`.
const RISCV_ENTRY: &str = r#"	.section .text.start, "ax"
	.globl	_start
	.type	_start, @function
_start:
	li	a0, 3
	li	t0, 8
	bgeu	a0, t0, 2f
	li	fp, 0
	bnez	a0, 1f
	call	kmain /* RISCV_CALL */
	j	2f
1:	call	kmain
2:	wfi
	j	2b
	.size	_start, . - _start
"#;

const RISCV_KERNEL: &str = r#"volatile unsigned long ticks;

void kmain(void)
{
    for (;;)
        ticks++;
}
"#;

/// `_start` of a freestanding riscv64 program built as a test kernel is: by clang and lld,
/// with local labels discarded; every 2-byte step of it is named `_start`, with its line.
fn check_riscv(dwarf: &str) {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    std::fs::write(d.join("start.S"), RISCV_ENTRY).unwrap();
    std::fs::write(d.join("kernel.c"), RISCV_KERNEL).unwrap();
    let binary = d.join("kernel.elf");
    run(Command::new("clang")
        .current_dir(d)
        .args([
            "--target=riscv64-unknown-elf",
            "-march=rv64imac",
            "-mabi=lp64",
        ])
        .args([
            "-mcmodel=medany",
            "-mno-relax",
            "-O2",
            &format!("-gdwarf-{dwarf}"),
        ])
        .args(["-ffreestanding", "-nostdlib", "-static", "-fuse-ld=lld"])
        .args(["-Wl,--discard-locals", "-Wl,-e,_start", "-o"])
        .arg(&binary)
        .args(["start.S", "kernel.c"]));
    let (start, size) = symbol_offset(&binary, |n| n == "_start");
    assert!(size > 0);
    let offsets: Vec<u64> = (start..start + size).step_by(2).collect();
    let all = Symbolizer::with_debug_dirs(Vec::new())
        .symbolize_file(&binary, None, &offsets)
        .unwrap();
    let call = line_of(RISCV_ENTRY, "RISCV_CALL");
    let mut on_call = 0;
    for (offset, frames) in offsets.iter().zip(&all) {
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["_start"],
            "DWARF {dwarf} at {offset:#x}: {frames:?}"
        );
        let frame = &frames[0];
        let file = frame.file.as_deref().unwrap_or_default();
        assert!(file.ends_with("start.S"), "DWARF {dwarf}: {frame:?}");
        on_call += usize::from(frame.line == Some(call));
    }
    assert!(on_call > 0, "DWARF {dwarf}: no step on the call's line");
}

#[test]
fn clang_riscv64_dwarf4() {
    check_riscv("4");
}

#[test]
fn clang_riscv64_dwarf5() {
    check_riscv("5");
}
