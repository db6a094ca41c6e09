//! bcc `profile`'s default text output: per stack, kernel frames leaf first, an optional `--`,
//! user frames leaf first, a `- comm (pid)` line and the count, in bcc's exact layout.

use super::{delimited, kernel_start, WriteOptions};
use crate::{shown_name, FrameKind, Profile};
use std::collections::HashMap;
use std::io::{self, Write};

/// Frames, the delimiter and the `-` line are indented by four spaces, the count by eight.
const INDENT: &str = "    ";

pub(super) fn write(profile: &Profile, opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    // bcc counts per (process, comm, stack); samples here may also differ by thread id (not
    // shown) and CPU, so equal blocks add up.
    let mut counts: HashMap<String, u64> = HashMap::new();
    for sample in &profile.samples {
        *counts
            .entry(block(profile, sample.thread, sample.stack, opts))
            .or_default() += sample.count;
    }
    let mut blocks: Vec<(u64, String)> = counts
        .into_iter()
        .map(|(block, count)| (count, block))
        .collect();
    blocks.sort_unstable();
    for (count, block) in blocks {
        write!(out, "{block}{INDENT}{INDENT}{count}\n\n")?;
    }
    Ok(())
}

/// Everything of one stack's entry but the count.
fn block(profile: &Profile, thread: u32, stack: u32, opts: &WriteOptions) -> String {
    let frames = &profile.stack(stack).frames;
    let split = kernel_start(profile, frames);
    let mut text = String::new();
    let line = |text: &mut String, id: u32| {
        let frame = profile.frame(id);
        text.push_str(INDENT);
        text.push_str(&frame.shown_name());
        if frame.kind == FrameKind::Kernel && opts.annotate_kernel {
            text.push_str("_[k]");
        }
        text.push('\n');
    };
    for &id in frames[split..].iter().rev() {
        line(&mut text, id);
    }
    if opts.delimiter && delimited(profile, frames, split) {
        text.push_str(INDENT);
        text.push_str("--\n");
    }
    for &id in frames[..split].iter().rev() {
        line(&mut text, id);
    }
    let thread = profile.thread(thread);
    let comm = shown_name(&thread.comm);
    // bcc pads the `-` to 16 columns; the pid it shows is the process id.
    text.push_str(&format!("{INDENT}{:<16} {comm} ({})\n", "-", thread.pid));
    text
}
