//! What the Linux sources (perf_event and eBPF) share about the processes they sample: what to
//! sample and the launched command, held before `exec` until sampling is ready (`target`);
//! what each process maps and the files behind the mappings (`maps`); what the kernel offers
//! and allows (`kernel`: sysctls, online CPUs); the cpu-clock event both sample on, its rate
//! and its opening (`cpu_clock`); and the setup errors, each naming its cause and its fix
//! (`SampleError`).
//!
//! It samples nothing itself: how samples arrive is each source's crate.

#![cfg(target_os = "linux")]

pub mod cpu_clock;
mod error;
pub mod kernel;
pub mod maps;
pub mod target;

pub use error::SampleError;
