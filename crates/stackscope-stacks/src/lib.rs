//! stackscope's middle, which every source feeds: the files a target maps ([`Mapping`],
//! [`module::ModuleFile`]: file, load bias, build-id, unwind sections) and the one address
//! space they are kept in for a process or a guest ([`AddressSpace`]), the architectures as
//! data ([`arch::Arch`]: registers and unwinder, chosen per sample), the one stack walk over a
//! register set and a memory-read closure ([`walk::walk`]), the one word on how a walk ended
//! ([`walk::WalkEnd`]), a table of raw stacks counted as they arrive through one entry
//! ([`table::StackTable::count`]), and the one step that names every unique address once and
//! builds the [`stackscope_profile::Profile`]; and what every source hands back
//! ([`Recording`], with its own figures in [`SourceFigures`]) and what it is told to sample
//! ([`Target`]), with its [`Hint`]s in the source's own terms.
//!
//! Sources (perf_event, eBPF, GDB, perf.data) keep only how their samples arrive. This crate
//! neither talks to a kernel nor formats output.

pub mod arch;
mod figures;
mod hint;
mod mapping;
pub mod module;
mod recording;
mod space;
pub mod table;
mod target;
pub mod walk;

pub use figures::{BpfFigures, LeadInFigures, ProgramCost, Rounds, SourceFigures, Storage};
pub use hint::{naming_hints, Hint};
pub use mapping::Mapping;
pub use recording::{Recording, Unnamed};
pub use space::AddressSpace;
pub use target::Target;
