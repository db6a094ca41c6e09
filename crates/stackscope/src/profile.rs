//! `stackscope profile`: not built yet.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct ProfileArgs {}

pub fn run(_args: ProfileArgs) -> Result<i32> {
    bail!("`stackscope profile` is not built yet")
}
