//! stackscope's Windows source: ETW, the kernel's event tracing, sampled by a private
//! system-trace session with the profile timer's stacks.
//!
//! What does not call Windows, and so is built and tested everywhere: decoding the kernel
//! events used ([`event`]), stitching a sample's kernel and user stacks that arrive as separate
//! events ([`stitch`]), each process's images from image loads and the rundown of those loaded
//! before ([`images`], [`paths`]), and feeding the samples to the middle's stack table
//! ([`collect`]). The session itself (`session`, Windows only) starts and stops the trace and
//! launches or attaches to the target. Naming frames is the middle's and the symbolizer's.

pub mod collect;
mod error;
pub mod event;
pub mod images;
pub mod order;
pub mod paths;
pub mod stitch;

#[cfg(windows)]
mod session;

#[cfg(test)]
mod payload;

pub use collect::{Collector, Counts, Target};
pub use error::{Error, SESSION_NAME};
pub use paths::DevicePaths;
#[cfg(windows)]
pub use session::{record, Options, What};
