//! `stackscope gdb`: not built yet.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct GdbArgs {}

pub fn run(_args: GdbArgs) -> Result<i32> {
    bail!("`stackscope gdb` is not built yet")
}
