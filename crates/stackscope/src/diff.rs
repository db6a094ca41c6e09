//! `stackscope diff`: not built yet.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct DiffArgs {}

pub fn run(_args: DiffArgs) -> Result<i32> {
    bail!("`stackscope diff` is not built yet")
}
