//! The one data model every stackscope source ends in and every writer starts from.
//!
//! A [`Profile`] holds interned [`Frame`]s, [`Stack`]s as chains of frame indices (root
//! first), the [`Thread`]s samples belong to, the [`Sample`] counts, and [`Metadata`] about
//! how the profile was taken. It knows nothing about kernels, ELF files or sampling: sources
//! build it through [`ProfileBuilder`], writers read it.
//!
//! Readers and writers live in [`format`]: folded stacks, bcc `profile` text, flamegraph SVG,
//! stackscope's own lossless JSON, pprof, speedscope, the Firefox Profiler's processed format,
//! the Asterinas OSDK's JSON, `perf script` text and DTrace aggregation text.

pub mod format;
mod model;

pub use model::*;
