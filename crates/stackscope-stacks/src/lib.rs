//! stackscope's middle, which every source feeds: the files a target maps ([`Mapping`],
//! [`module::ModuleFile`]: file, load bias, build-id, unwind sections) and the one address
//! space they are kept in for a process or a guest ([`AddressSpace`]), the architectures as
//! data ([`arch::Arch`]: registers and unwinder, chosen per sample), the one stack walk over a
//! register set and a memory-read closure ([`walk::walk`]), a table of raw stacks
//! counted as they arrive ([`table::StackTable`]), and the one step that names every unique
//! address once and builds the [`stackscope_profile::Profile`]; and what every source hands
//! back ([`Recording`]) and what it is told to sample ([`Target`]), with its [`Hint`]s in the source's own terms.
//!
//! Sources (perf_event, eBPF, GDB, perf.data) keep only how their samples arrive. This crate
//! neither talks to a kernel nor formats output.

pub mod arch;
mod hint;
mod mapping;
pub mod module;
mod recording;
mod space;
pub mod table;
mod target;
pub mod walk;

pub use hint::{naming_hints, Hint};
pub use mapping::Mapping;
pub use recording::{ProgramCost, Recording, Rounds, Storage};
pub use space::AddressSpace;
pub use target::Target;
