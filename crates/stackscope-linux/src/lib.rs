//! stackscope's Linux source: samples call stacks of processes, threads or the whole system
//! through `perf_event_open` on the software `cpu-clock` event, tracks what each process has
//! mapped, unwinds user stacks with DWARF CFI from copied stack memory, and hands counted,
//! symbolized stacks to the profile model.
//!
//! It does not format output (that is `stackscope-profile`) nor parse arguments (the CLI).

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
