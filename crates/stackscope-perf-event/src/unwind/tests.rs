//! Unwinds real processes: programs are built with gcc/rustc, run, stopped with ptrace, and
//! their registers, stack memory and maps are fed to the unwinder; every address must fall in
//! the function the ELF symbol table says it should.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use stackscope_testkit::Running;

use nix::sys::ptrace;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use object::{Object, ObjectSegment, ObjectSymbol};
use stackscope_process::maps::{parse_proc_maps, read_proc_maps};
use stackscope_testkit::{compile, run};

use super::*;

const STACK_COPY: u64 = 32 * 1024;

/// middle -> leaf, leaf spinning until killed (after writing "ready"). `noipa` keeps gcc from
/// inlining, cloning or tail-calling them.
macro_rules! spinning_leaf_and_middle_c {
    () => {
        r#"
#include <unistd.h>
volatile unsigned long spins;
volatile int stop;
__attribute__((noipa)) int leaf(int x) {
    write(1, "ready\n", 6);
    while (!stop) spins++;
    return x + 1;
}
__attribute__((noipa)) int middle(int x) { return leaf(x * 3) + 2; }
"#
    };
}

/// main -> outer -> middle, for a program defining middle before.
macro_rules! outer_and_main_c {
    () => {
        r#"__attribute__((noipa)) int outer(int x) { return middle(x + 5) * 7; }
int main(int argc, char **argv) { (void)argv; return outer(argc) & 0x7f; }
"#
    };
}

/// main -> outer -> middle -> leaf, leaf spinning until killed.
const SIMPLE_C: &str = concat!(spinning_leaf_and_middle_c!(), outer_and_main_c!());

/// middle and leaf live in a shared library opened with dlopen; outer calls through a pointer.
const LIB_C: &str = spinning_leaf_and_middle_c!();

const DLOPEN_MAIN_C: &str = r#"
#include <dlfcn.h>
__attribute__((noipa)) int outer(int (*f)(int), int x) { return f(x + 5) * 7; }
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return 2;
    int (*f)(int) = (int (*)(int))dlsym(lib, "middle");
    if (!f) return 3;
    return outer(f, argc) & 0x7f;
}
"#;

/// leaf spends nearly all its time inside the vDSO's clock_gettime.
const VDSO_C: &str = concat!(
    r#"
#include <time.h>
#include <unistd.h>
volatile long sink;
__attribute__((noipa)) int leaf(int x) {
    struct timespec ts;
    write(1, "ready\n", 6);
    for (;;) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }
    return x;
}
__attribute__((noipa)) int middle(int x) { return leaf(x * 3) + 2; }
"#,
    outer_and_main_c!()
);

/// Optimised, with debug info, without frame pointers: how most of the tests build.
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

const RECURSE_RS: &str = r#"
use std::hint::black_box;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
static STOP: AtomicBool = AtomicBool::new(false);
#[inline(never)]
fn spin() -> u64 {
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut n = 0u64;
    while !STOP.load(Ordering::Relaxed) { n = black_box(n + 1); }
    n
}
#[inline(never)]
fn recurse(depth: u32) -> u64 {
    let mut buf = [0u8; 24];
    buf[0] = depth as u8;
    black_box(&mut buf);
    if depth == 0 { return spin(); }
    let r = recurse(black_box(depth - 1));
    black_box(r) + buf[0] as u64
}
fn main() {
    let depth: u32 = std::env::args().nth(1).unwrap().parse().unwrap();
    std::process::exit(recurse(depth) as i32)
}
"#;

/// Compiles `source` as `dir/name` (from `dir/name.c`), linking libdl for dlopen.
fn gcc(dir: &Path, name: &str, source: &str, args: &[&str]) -> PathBuf {
    let src_name = format!("{name}.c");
    compile("gcc", dir, (&src_name, source), args, &["-ldl"], name)
}

/// Builds SIMPLE_C as `name` with gcc `args` and runs it, stopped in leaf.
fn simple_in_leaf(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, Tracee) {
    let exe = gcc(dir, name, SIMPLE_C, args);
    let t = Tracee::start(&exe, &[], Target::Function(&exe, &leaf));
    (exe, t)
}

/// The innermost frames of SIMPLE_C stopped in leaf, leaf first.
fn simple_frames(exe: &Path) -> [(&Path, &str); 4] {
    [
        (exe, "leaf"),
        (exe, "middle"),
        (exe, "outer"),
        (exe, "main"),
    ]
}

fn section_names(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    use object::ObjectSection;
    file.sections()
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect()
}

/// Where a test wants its process stopped.
enum Target<'a> {
    Function(&'a Path, &'a dyn Fn(&str) -> bool),
    Vdso,
}

/// Load bias of `path` in process `pid`, from its lowest mapping (which maps the file's first
/// page) and the first PT_LOAD's address: independent of how the unwinder does it.
fn bias(pid: u32, path: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let path = path.to_str().unwrap();
    let lowest = maps
        .lines()
        .filter(|l| l.ends_with(path))
        .filter_map(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .min()
        .unwrap_or_else(|| panic!("{path} not mapped"));
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let first_vaddr = file.segments().map(|s| s.address()).min().unwrap();
    lowest - (first_vaddr & !0xfff)
}

/// Address range in process `pid` of the function of `path` whose name `matches`.
fn function_range(pid: u32, path: &Path, matches: impl Fn(&str) -> bool) -> Range<u64> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.size() > 0 && s.name().is_ok_and(&matches))
        .unwrap_or_else(|| panic!("function not found in {}", path.display()));
    let start = bias(pid, path) + sym.address();
    start..start + sym.size()
}

fn leaf(n: &str) -> bool {
    n == "leaf"
}

/// A running program, stopped under ptrace at a point chosen by the test; killed on drop.
struct Tracee {
    _child: Running,
    pid: u32,
    regs: Regs,
    stack: Vec<u8>,
    maps: AddressSpace,
}

impl Tracee {
    /// Runs `exe args`, waits for its "ready" line, then stops it until its ip is in
    /// `target` (the line is written before the code of interest starts spinning).
    fn start(exe: &Path, args: &[&str], target: Target) -> Self {
        let child = Running::ready(Command::new(exe).args(args));
        let pid = child.0.id();
        let nix_pid = Pid::from_raw(pid as i32);
        ptrace::seize(nix_pid, ptrace::Options::empty()).unwrap();
        let maps = read_proc_maps(pid).unwrap();
        let wanted = match target {
            Target::Function(path, matches) => function_range(pid, path, matches),
            Target::Vdso => {
                let m = maps.iter().find(|m| &*m.path == "[vdso]").unwrap();
                m.start..m.end
            }
        };
        let mut regs = None;
        let mut stopped = false;
        // Bounded by time, not tries: on a loaded machine the program may not run at all
        // between two quick stops, so each try lets it run a little first.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            ptrace::interrupt(nix_pid).unwrap();
            waitpid(nix_pid, None).unwrap();
            let caught = walk_regs(&ptrace::getregs(nix_pid).unwrap());
            regs = Some(caught);
            if wanted.contains(&caught.pc) {
                stopped = true;
                break;
            }
            ptrace::cont(nix_pid, None).unwrap();
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        assert!(
            stopped,
            "never caught {} at the expected place",
            exe.display()
        );
        let mut tracee = Tracee {
            _child: child,
            pid,
            regs: regs.expect("caught at least once"),
            stack: Vec::new(),
            maps,
        };
        tracee.stack = tracee.read_stack(STACK_COPY);
        tracee
    }

    /// Up to `len` bytes of stack from sp, as a sampler would copy them.
    fn read_stack(&self, len: u64) -> Vec<u8> {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap();
        let sp = self.regs.sp;
        let stack_end = maps
            .lines()
            .filter_map(|l| {
                let (s, e) = l.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                ))
            })
            .find(|&(s, e)| s <= sp && sp < e)
            .expect("sp is in a mapping")
            .1;
        let mut buf = vec![0; len.min(stack_end - sp) as usize];
        std::fs::File::open(format!("/proc/{}/mem", self.pid))
            .unwrap()
            .read_exact_at(&mut buf, sp)
            .unwrap();
        buf
    }

    fn unwind_with(&self, unwinder: &mut ProcessUnwinders, stack: &[u8]) -> (Vec<u64>, WalkEnd) {
        let mut out = Trail {
            addrs: vec![0xdead],
            ..Trail::default()
        };
        let end = unwinder.unwind(self.pid, &self.maps, self.regs, stack, &mut out);
        assert_eq!(out.addrs.len(), out.sps.len());
        (out.addrs, end)
    }

    fn unwind(&self) -> (Vec<u64>, WalkEnd) {
        self.unwind_with(&mut ProcessUnwinders::new(), &self.stack)
    }

    fn function(&self, path: &Path, matches: impl Fn(&str) -> bool) -> Range<u64> {
        function_range(self.pid, path, matches)
    }

    fn named(&self, path: &Path, name: &str) -> Range<u64> {
        self.function(path, |n| n == name)
    }

    fn path_of(&self, addr: u64) -> &str {
        self.maps.find(addr).map_or("?", |m| &m.path)
    }
}

fn describe(t: &Tracee, out: &[u64]) -> String {
    out.iter()
        .map(|a| format!("{a:#x} {}\n", t.path_of(*a)))
        .collect()
}

/// Asserts the unwind ended complete; returns the stack described, for later messages.
fn complete_trace(t: &Tracee, out: &[u64], end: &WalkEnd) -> String {
    let trace = describe(t, out);
    assert_eq!(*end, WalkEnd::Complete, "stack:\n{trace}");
    trace
}

/// Asserts the outermost frame of `out` is in `exe`'s `_start`.
fn assert_outermost_is_start(t: &Tracee, exe: &Path, out: &[u64], trace: &str) {
    assert!(
        t.named(exe, "_start").contains(out.last().unwrap()),
        "outermost frame is not _start; stack:\n{trace}"
    );
}

/// Checks `out` starts with the given functions, in order, and ends in the exe's `_start`
/// after passing through libc.
fn assert_complete_through(
    t: &Tracee,
    exe: &Path,
    out: &[u64],
    end: &WalkEnd,
    expected: &[(&Path, &str)],
) {
    let trace = complete_trace(t, out, end);
    assert!(out.len() > expected.len(), "stack:\n{trace}");
    for (i, (path, name)) in expected.iter().enumerate() {
        let range = t.named(path, name);
        assert!(
            range.contains(&out[i]),
            "frame {i} {:#x} is not in {name} {range:x?}; stack:\n{trace}",
            out[i]
        );
    }
    assert!(
        t.path_of(out[expected.len()]).contains("libc.so"),
        "main's caller is not libc; stack:\n{trace}"
    );
    assert_outermost_is_start(t, exe, out, &trace);
}

fn simple(pie: bool) {
    let dir = tempfile::tempdir().unwrap();
    let pie_flag = if pie { "-pie" } else { "-no-pie" };
    let (exe, t) = simple_in_leaf(dir.path(), "simple", &[NO_FP, &[pie_flag]].concat());
    let (out, end) = t.unwind();
    assert_complete_through(&t, &exe, &out, &end, &simple_frames(&exe));
}

#[test]
fn unwinds_pie_executable_without_frame_pointers() {
    simple(true);
}

#[test]
fn unwinds_non_pie_executable() {
    simple(false);
}

#[test]
fn unwinds_through_dlopened_shared_library() {
    let dir = tempfile::tempdir().unwrap();
    let lib = gcc(
        dir.path(),
        "libdeep.so",
        LIB_C,
        &[NO_FP, &["-shared", "-fPIC"]].concat(),
    );
    let exe = gcc(dir.path(), "dlmain", DLOPEN_MAIN_C, NO_FP);
    let t = Tracee::start(
        &exe,
        &[lib.to_str().unwrap()],
        Target::Function(&lib, &leaf),
    );
    let (out, end) = t.unwind();
    assert_complete_through(
        &t,
        &exe,
        &out,
        &end,
        &[
            (&lib, "leaf"),
            (&lib, "middle"),
            (&exe, "outer"),
            (&exe, "main"),
        ],
    );
}

#[test]
fn unwinds_out_of_the_vdso() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(dir.path(), "vdso", VDSO_C, NO_FP);
    let t = Tracee::start(&exe, &[], Target::Vdso);
    let (out, end) = t.unwind();
    let trace = complete_trace(&t, &out, &end);
    // vDSO frame(s), libc's clock_gettime, then ours.
    let first_ours = out
        .iter()
        .position(|a| t.path_of(*a) == exe.to_str().unwrap())
        .unwrap_or_else(|| panic!("no frame in the program; stack:\n{trace}"));
    assert!(first_ours >= 1, "stack:\n{trace}");
    for (i, name) in ["leaf", "middle", "outer", "main"].iter().enumerate() {
        assert!(
            t.named(&exe, name).contains(&out[first_ours + i]),
            "frame {} is not {name}; stack:\n{trace}",
            first_ours + i
        );
    }
    assert_outermost_is_start(&t, &exe, &out, &trace);
}

#[test]
fn rust_deep_recursion_unwinds_completely() {
    let dir = tempfile::tempdir().unwrap();
    // The crate name, and so the symbol names below, come from the source file's name.
    let exe = compile(
        "rustc",
        dir.path(),
        ("recurse.rs", RECURSE_RS),
        &["-C", "opt-level=3", "-C", "force-frame-pointers=no"],
        &[],
        "recurse",
    );
    let depth = 400;
    let is_spin = |n: &str| n.starts_with("_ZN7recurse4spin");
    let is_recurse = |n: &str| n.starts_with("_ZN7recurse7recurse");
    let mut t = Tracee::start(
        &exe,
        &[&depth.to_string()],
        Target::Function(&exe, &is_spin),
    );
    t.stack = t.read_stack(256 * 1024);
    let (out, end) = t.unwind();
    let trace = complete_trace(&t, &out, &end);
    assert!(
        t.function(&exe, is_spin).contains(&out[0]),
        "stack:\n{trace}"
    );
    let recurse = t.function(&exe, is_recurse);
    let frames = out[1..].iter().take_while(|a| recurse.contains(a)).count();
    assert_eq!(frames, depth + 1, "stack:\n{trace}");
    let rust_main = t.function(&exe, |n| n.starts_with("_ZN7recurse4main"));
    let c_main = t.named(&exe, "main");
    let after = &out[1 + frames..];
    let at_rust_main = after.iter().position(|a| rust_main.contains(a));
    let at_c_main = after.iter().position(|a| c_main.contains(a));
    assert!(
        matches!((at_rust_main, at_c_main), (Some(r), Some(c)) if r < c),
        "stack:\n{trace}"
    );
    assert_outermost_is_start(&t, &exe, &out, &trace);
}

#[test]
fn short_stack_copy_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, t) = simple_in_leaf(dir.path(), "simple", NO_FP);
    let (out, end) = t.unwind_with(&mut ProcessUnwinders::new(), &t.stack[..64]);
    assert_eq!(end, WalkEnd::Truncated, "stack:\n{}", describe(&t, &out));
    assert_eq!(out[0], t.regs.pc);
    // Whatever was unwound before running out is still right.
    assert!(out.len() >= 2 && t.named(&exe, "middle").contains(&out[1]));
}

#[test]
fn unmapped_ip_and_bad_return_address_are_broken() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, t) = simple_in_leaf(dir.path(), "simple", NO_FP);
    let mut unwinder = ProcessUnwinders::new();

    let mut out = Trail::default();
    let regs = Regs { pc: 0x10, ..t.regs };
    let end = unwinder.unwind(t.pid, &t.maps, regs, &t.stack, &mut out);
    let unmapped = WalkEnd::Stopped {
        module: None,
        why: Some(Stop::Unmapped),
    };
    assert_eq!(end, unmapped);
    assert_eq!(out.addrs, [0x10]);

    // leaf's CFI says its return address is at the top of the stack: make it garbage.
    let garbage = vec![0x41; t.stack.len()];
    let (out, end) = t.unwind_with(&mut unwinder, &garbage);
    assert_eq!(
        end,
        WalkEnd::Stopped {
            module: Some(exe.to_str().unwrap().into()),
            why: Some(Stop::NoRule),
        }
    );
    assert_eq!(out, [t.regs.pc]);

    // The same unwinder still unwinds the real stack afterwards.
    let (out, end) = t.unwind_with(&mut unwinder, &t.stack);
    assert_eq!(end, WalkEnd::Complete, "stack:\n{}", describe(&t, &out));
}

#[test]
fn one_unwinder_serves_several_processes() {
    let dir = tempfile::tempdir().unwrap();
    let (pie, a) = simple_in_leaf(dir.path(), "pie", &["-O2", "-fomit-frame-pointer", "-pie"]);
    let (nopie, b) = simple_in_leaf(
        dir.path(),
        "nopie",
        &["-O2", "-fomit-frame-pointer", "-no-pie"],
    );
    let mut unwinder = ProcessUnwinders::new();
    for _ in 0..2 {
        for (t, exe) in [(&a, &pie), (&b, &nopie)] {
            let (out, end) = t.unwind_with(&mut unwinder, &t.stack);
            assert_complete_through(t, exe, &out, &end, &simple_frames(exe));
        }
    }
    unwinder.forget(a.pid);
    let (_, end) = a.unwind_with(&mut unwinder, &a.stack);
    assert_eq!(end, WalkEnd::Complete);
}

#[test]
fn binary_without_unwind_info_is_listed_and_unwinds_by_frame_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(
        dir.path(),
        "nocfi",
        SIMPLE_C,
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    // crt1.o and friends still bring their own .eh_frame; remove it.
    if section_names(&exe).iter().any(|s| s == ".eh_frame") {
        run(Command::new("objcopy")
            .args([
                "--remove-section",
                ".eh_frame",
                "--remove-section",
                ".eh_frame_hdr",
            ])
            .arg(&exe));
    }
    let sections = section_names(&exe);
    for cfi in [".eh_frame", ".eh_frame_hdr", ".debug_frame"] {
        assert!(
            !sections.iter().any(|s| s == cfi),
            "{cfi} still in {sections:?}"
        );
    }

    let t = Tracee::start(&exe, &[], Target::Function(&exe, &leaf));
    let mut unwinder = ProcessUnwinders::new();
    let (out, end) = t.unwind_with(&mut unwinder, &t.stack);
    let listed = unwinder.modules_without_unwind_info();
    assert_eq!(listed, [Arc::<str>::from(exe.to_str().unwrap())]);
    // No table said the chain ends at _start's zero frame pointer: the walk stops there,
    // in a module without tables, and the stack is judged whole by its outermost frame.
    let no_table = WalkEnd::Stopped {
        module: Some(exe.to_str().unwrap().into()),
        why: Some(Stop::NoTable),
    };
    assert_eq!(end, no_table, "stack:\n{}", describe(&t, &out));
    assert_complete_through(&t, &exe, &out, &WalkEnd::Complete, &simple_frames(&exe));
}

#[test]
fn files_no_live_process_maps_are_dropped_beyond_the_idle_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, t) = simple_in_leaf(dir.path(), "simple", &["-O2", "-fomit-frame-pointer"]);
    let exe = std::fs::canonicalize(&exe).unwrap();
    let maps_text = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
    let mut unwinder = ProcessUnwinders::new();
    // Short processes, each running its own copy of the program (a new file to the cache),
    // unwound once and then gone, as under a shell loop or a build.
    let copies = IDLE_FILES + 8;
    for i in 0..copies {
        let copy = dir.path().join(format!("copy{i}"));
        std::fs::copy(&exe, &copy).unwrap();
        let copy = std::fs::canonicalize(&copy).unwrap();
        let maps =
            parse_proc_maps(&maps_text.replace(exe.to_str().unwrap(), copy.to_str().unwrap()));
        // Not a live pid: the file is opened by its path.
        let pid = u32::MAX - i as u32;
        let mut out = Trail::default();
        let end = unwinder.unwind(pid, &maps, t.regs, &t.stack, &mut out);
        // The copy is mapped where the original is, so the original names its addresses.
        assert_complete_through(&t, &exe, &out.addrs, &end, &simple_frames(&exe));
        unwinder.forget(pid);
    }
    assert_eq!(
        unwinder.cached_files(),
        IDLE_FILES,
        "{copies} copies seen, none mapped by a live process"
    );
    // A live process's files stay whatever else comes and goes.
    let (out, end) = t.unwind_with(&mut unwinder, &t.stack);
    assert_complete_through(&t, &exe, &out, &end, &simple_frames(&exe));
}

/// The registers a walk starts from, of a tracee stopped on the machine the tests run on.
#[cfg(target_arch = "x86_64")]
fn walk_regs(r: &libc::user_regs_struct) -> Regs {
    Regs {
        arch: Arch::X86_64,
        pc: r.rip,
        sp: r.rsp,
        fp: r.rbp,
        lr: 0,
    }
}

/// The registers a walk starts from, of a tracee stopped on the machine the tests run on.
#[cfg(target_arch = "aarch64")]
fn walk_regs(r: &libc::user_regs_struct) -> Regs {
    Regs {
        arch: Arch::Aarch64,
        pc: r.pc,
        sp: r.sp,
        fp: r.regs[29],
        lr: r.regs[30],
    }
}
