//! stackscope's perf_event source: samples call stacks of processes, threads or the whole
//! system through `perf_event_open` on the software `cpu-clock` event, tracks what each process
//! has mapped, unwinds user stacks with DWARF CFI from copied stack memory, and counts them into
//! `stackscope-stacks`' table.
//!
//! Two inputs feed one collector: the live rings (`sampler`, opened and drained by `perf`) and
//! a saved `perf.data` file (`perf_data`); one decoder (`decode`) turns the records of both
//! into [`event::Event`]s, which `record`'s collector turns into counted stacks. What to sample, the launched command and the process maps are
//! `stackscope-process`'s, shared with the eBPF source.
//!
//! It does not format output (that is `stackscope-profile`) nor parse arguments (the CLI).

#![cfg(target_os = "linux")]

mod decode;
pub mod event;
mod perf;
pub mod perf_data;
pub mod record;
pub mod sampler;
pub mod unwind;
