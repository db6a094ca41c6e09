//! The perf source's walk on aarch64 stacks, on a host of any architecture: the aarch64 test
//! guest of the gdb tests (`tests/guest/`) is stopped through stackscope-gdb's client, and
//! each vCPU's pc, sp, x29 and x30 and a copy of the stack above sp are handed to the perf
//! source's unwinder as a sample's registers and stack copy, the guest kernel's ELF file the
//! one file mapped. Every walk must reach the vCPU's entry (`_start` → `kmain`/`ap_main` →
//! `work_loop`), and find the frames the gdb source's walk finds over the guest's memory.
//! The kernel built without frame pointers has leaves that never save x30: only a walk that
//! takes their return address from it finds their callers. The kernel built with frame
//! pointers has no CFI at all, and a vCPU stopped in a prologue (before the frame record is
//! stored) or an epilogue (after it is loaded) has its caller in x30 only: both walks read
//! the code at pc to find that out.

#![cfg(target_os = "linux")]

mod common;
mod qemu;

use std::path::Path;
use std::time::Duration;

use common::*;
use qemu::{Kernel, Qemu, Stub};
use stackscope_gdb::client::Registers;
use stackscope_gdb::space::Space;
use stackscope_gdb::{Client, Image, Remote, DEFAULT_TIMEOUT};
use stackscope_perf_event::unwind::ProcessUnwinders;
use stackscope_stacks::arch::{Arch, Regs, WalkCache};
use stackscope_stacks::walk::{Leaf, Trail, Unread, WalkEnd};
use stackscope_stacks::AddressSpace;
use stackscope_symbols::Symbolizer;

/// Stops of the guest; each looks at both vCPUs.
const STOPS: usize = 25;
/// Bytes of stack copied above sp, as a perf sample copies them: far more than the guest's
/// stacks hold, whose frames are a few words each.
const COPY: usize = 2048;
/// The process the perf source's unwinder files the guest under.
const GUEST: u32 = u32::MAX;

/// The addresses of the perf source's walk and of the gdb source's walk of one vCPU's stack,
/// with how the perf source's walk ended.
struct Look {
    perf: Vec<u64>,
    end: WalkEnd,
    gdb: Vec<u64>,
}

/// Boots the aarch64 guest of `kernel` and walks each vCPU's stack both ways at [`STOPS`]
/// stops; returns every look with the vCPU it was of.
fn looks(kernel: Kernel) -> (Vec<(usize, Look)>, Image) {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot_arch(qemu::Arch::Aarch64, kernel, 2, Stub::Tcp, dir.path());
    let path = kernel.path_for(qemu::Arch::Aarch64);
    let image = Image::open(&path).expect("the guest kernel is an ELF file");
    assert_eq!(image.arch(), Arch::Aarch64, "the ELF header names aarch64");
    let mut maps = AddressSpace::default();
    for mapping in image.mappings() {
        maps.insert(mapping);
    }
    let space = Space::new(Image::open(&path).unwrap());
    let mut client = Client::connect(&Remote::parse(&qemu.remote), DEFAULT_TIMEOUT).unwrap();
    client.describe(Arch::Aarch64, &path).unwrap();
    let threads = client.threads().unwrap();
    assert_eq!(threads.len(), 2, "one thread per vCPU");
    let mut perf = ProcessUnwinders::new();
    let mut cache = WalkCache::default();
    let mut looks = Vec::new();
    for _ in 0..STOPS {
        client.resume(0).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        client.interrupt().unwrap();
        for (cpu, &thread) in threads.iter().enumerate() {
            let registers = client.registers(thread).unwrap();
            let regs = walk_regs(registers);
            let stack = client
                .read_memory_of(&[(thread, regs.sp, COPY)])
                .unwrap()
                .pop()
                .flatten()
                .expect("the guest's stack is readable");
            let mut trail = Trail::default();
            let end = perf.unwind(GUEST, &maps, regs, &stack, &mut trail);
            let leaf = match space.lacks_cfi(regs.pc) {
                true => Leaf::FramePointer,
                false => Leaf::Rules,
            };
            let read = |addr| match client.read_memory_of(&[(thread, addr, 8)]) {
                Ok(mut read) => match read.pop().flatten() {
                    Some(word) if word.len() == 8 => {
                        Ok(u64::from_le_bytes(word.try_into().unwrap()))
                    }
                    _ => Err(Unread::Unreadable),
                },
                Err(e) => Err(Unread::Failed(e)),
            };
            let mut gdb = Vec::new();
            let unwinder = space.unwinder();
            unwinder
                .walk(&mut cache, (regs, leaf), |_| true, read, &mut gdb)
                .unwrap();
            looks.push((
                cpu,
                Look {
                    perf: trail.addrs,
                    end,
                    gdb,
                },
            ));
        }
    }
    client.detach().unwrap();
    (looks, image)
}

/// The registers a walk starts from, as a perf sample of an aarch64 kernel carries them.
fn walk_regs(registers: Registers) -> Regs {
    Regs {
        arch: Arch::Aarch64,
        pc: registers.pc,
        sp: registers.sp,
        fp: registers.fp,
        lr: registers.lr,
    }
}

/// The function each address lies in, leaf first.
fn names(symbolizer: &mut Symbolizer, image: &Image, path: &Path, addrs: &[u64]) -> Vec<String> {
    let offsets: Vec<u64> = addrs
        .iter()
        .map(|&a| {
            image
                .file_offset(a)
                .expect("the address lies in the kernel")
        })
        .collect();
    let frames = symbolizer.symbolize_file(path, None, &offsets).unwrap();
    frames
        .iter()
        .map(|f| {
            let outer = f.iter().find(|f| !f.inlined).or(f.last());
            outer.map_or_else(|| "?".to_string(), |f| f.name.clone())
        })
        .collect()
}

/// Walks `kernel`'s stacks both ways and checks each walk.
fn assert_walks_reach_the_entry(kernel: Kernel) {
    let (looks, image) = looks(kernel);
    let path = image.path().to_path_buf();
    let mut symbolizer = Symbolizer::new();
    for (cpu, look) in &looks {
        let names = names(&mut symbolizer, &image, &path, &look.perf);
        let entry = if *cpu == 0 { "kmain" } else { "ap_main" };
        let root: Vec<&str> = names.iter().rev().take(2).map(String::as_str).collect();
        assert!(
            root == ["_start", entry] && names.iter().any(|n| n == "work_loop"),
            "{kernel:?} vCPU {cpu}: the perf source's walk does not reach _start;{entry};work_loop: {names:?} ({:?})",
            look.end
        );
        assert_eq!(
            look.perf, look.gdb,
            "{kernel:?} vCPU {cpu}: the perf source's and the gdb source's walks differ ({names:?}): {:x?} against {:x?}", look.perf, look.gdb
        );
        if matches!(kernel, Kernel::Cfi) {
            assert_eq!(look.end, WalkEnd::Complete, "{names:?}");
        }
    }
}

#[test]
fn aarch64_stacks_unwound_by_cfi_reach_the_entry() {
    assert_walks_reach_the_entry(Kernel::Cfi);
}

#[test]
fn aarch64_stacks_unwound_by_frame_records_reach_the_entry() {
    assert_walks_reach_the_entry(Kernel::FramePointers);
}
