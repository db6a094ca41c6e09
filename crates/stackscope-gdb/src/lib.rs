//! GDB remote protocol client and guest sampler.
//!
//! Profiles what runs behind a GDB stub — a guest kernel in QEMU (`-gdb tcp::1234`, one thread
//! per vCPU) or a program under `gdbserver` — by stopping it, reading each vCPU's registers
//! and stack memory, and resuming it, many times a second. Stacks are walked by
//! `stackscope_stacks::walk` over memory read through the stub, with DWARF CFI from the
//! target's ELF file (by frame pointers where it has none), counted in the stack table and
//! named by its naming step into a [`stackscope_profile::Profile`], each vCPU a thread.
//!
//! Layers: [`packet`] (framing over any byte stream, so it is tested on recorded exchanges),
//! [`client`] (the commands, and where the registers sit in the stub's replies for the
//! target's architecture, [`stackscope_stacks::arch::Arch`]), [`image`] (an ELF file at its load address), [`space`] (the
//! target's files), [`sample`] (the sampling loop: its rounds, the memory it reads, and the
//! pace, held to the share of the time the target may be stopped).
//! It does not parse arguments nor format output.

pub mod client;
mod error;
pub mod image;
pub mod packet;
pub mod sample;
pub mod space;

pub use client::{Client, Remote, DEFAULT_TIMEOUT};
pub use error::Error;
pub use image::{Image, ImageError};
pub use packet::Stream;
pub use sample::{prepare, record, Progress, Recording, SamplerOptions};
