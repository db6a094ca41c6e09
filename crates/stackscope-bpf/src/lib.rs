//! the eBPF source: a BPF program that counts stacks in the kernel and unwinds user stacks
//! there, and its loader.
//!
//! The program (src/bpf/profile.bpf.c, built ahead of time with clang and loaded with CO-RE
//! against the kernel's BTF) runs on the software cpu-clock event of each CPU, filters the
//! wanted processes or threads in the kernel, stores kernel stacks with `bpf_get_stackid` and
//! user stacks walked in the kernel from the unwind tables loaded for each process, and counts
//! (pid, tid, user stack, kernel stack, comm, event) keys as bcc's `profile` does. The same
//! counting runs at probes (`EventSpec`: uprobes, uretprobes, USDT probes, kprobes,
//! tracepoints), each hit one count under its event, and at the scheduler's switch
//! ([`TimeProfile`]: the time a thread stays off the CPU, added to the stacks it left
//! with), and at the allocator's entry points ([`MemoryProfile`]: bytes allocated, or still
//! held, by the stacks that allocated them). User space loads
//! the tables, follows execs and dlopens, and at the end turns the counts into a profile
//! through `stackscope-stacks`'s stack table, so symbols and completeness figures are the same
//! as with the perf_event source.
//!
//! It does not format output (that is `stackscope-profile`) nor parse arguments (the CLI).

#![cfg(target_os = "linux")]

mod error;
mod layout;
mod probe;
mod processes;
mod program;
mod record;
mod tables;
pub mod unwind_table;

pub use error::BpfError;
pub use probe::{AllocFn, EventSpec};
pub use record::{
    default_max_live, record, record_led_in, record_live, BpfConfig, LeadIn, MemoryProfile, Rate,
    TimeProfile, DEFAULT_HASH_STORAGE, DEFAULT_MAX_FRAMES, DEFAULT_STACK_STORAGE,
};
