//! stackscope's Linux source: samples call stacks of processes, threads or the whole system
//! through `perf_event_open` on the software `cpu-clock` event, tracks what each process has
//! mapped, unwinds user stacks with DWARF CFI from copied stack memory, and hands counted,
//! symbolized stacks to the profile model.
//!
//! Two inputs feed one collector: the live rings (`sampler`, decoded by `perf`) and a saved
//! `perf.data` file (`perf_data`); both become [`event::Event`]s, which `record`'s collector
//! turns into counted stacks. `target` owns what to sample and the launched command.
//!
//! It does not format output (that is `stackscope-profile`) nor parse arguments (the CLI).

#![cfg(target_os = "linux")]

mod error;
pub mod event;
pub mod maps;
mod perf;
pub mod perf_data;
pub mod record;
pub mod sampler;
pub mod target;
pub mod unwind;
pub mod unwind_table;
