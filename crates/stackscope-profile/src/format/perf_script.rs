//! `perf script` text, as perf 6.1 prints it, for the tools that read only that (inferno's and
//! FlameGraph's perf collapsers, cargo-flamegraph behind them).
//!
//! One block per sample of the profile: a header `comm pid/tid [cpu] time: COUNT event:`, the
//! frames leaf first as `\taddr name+0x0 (module)`, and a blank line. The period column holds
//! the sample's count: perf's collapsers weight each stack by that column, so the folded
//! stacks they make carry the same counts as [`super::Format::Folded`], while a profile of many
//! samples still prints one block per distinct stack and thread.
//!
//! Chosen so inferno's collapser folds them as our folded writer does: the `comm` has its
//! spaces as `_` (the collapser would make that change anyway, and a word of digits in a
//! `comm` would read as its pid); unknown functions name the module `[unknown]`, which keeps
//! them `[unknown]` instead of `[module]`; a `comm` starting with `#`, which would make the
//! header a comment, has that `#` as U+FFFD; each name ends in `+0x0`, the offset the collapser
//! strips, so a name that itself ends like an offset survives. Inlined frames say `(inlined)`,
//! as perf does. A sample without frames prints one `[unknown]` frame, since the collapsers
//! drop a sample that has none. The profile keeps no addresses, so every frame prints address 0.

use super::WriteOptions;
use crate::{printable, shown_name, Frame, FrameKind, Profile, REPLACEMENT, UNKNOWN};
use std::io::{self, Write};

/// The event named when the profile names none.
const DEFAULT_EVENT: &str = "cpu-clock";
/// The module perf names for kernel code.
const KERNEL_MODULE: &str = "[kernel.kallsyms]";

pub fn write(profile: &Profile, _opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    let event = event_name(&profile.meta.event);
    let mut block = String::new();
    for sample in &profile.samples {
        if sample.count == 0 {
            continue;
        }
        block.clear();
        let thread = profile.thread(sample.thread);
        push_word(&mut block, &thread.comm);
        // The collapsers skip a line starting with `#` as a comment, and the sample with it.
        if block.starts_with('#') {
            block.replace_range(..1, "");
            block.insert(0, REPLACEMENT);
        }
        block.push_str(&format!(" {}/{}", thread.pid, thread.tid));
        if let Some(cpu) = sample.cpu {
            block.push_str(&format!(" [{cpu:03}]"));
        }
        block.push_str(&format!(" 0.000000: {} {event}:\n", sample.count));
        let mut frames = profile.stack_frames(sample.stack).rev().peekable();
        if frames.peek().is_none() {
            // Collapsers drop a sample without frames; one unknown frame keeps its count.
            push_frame(&mut block, &Frame::marker(UNKNOWN));
        }
        for frame in frames {
            push_frame(&mut block, frame);
        }
        block.push('\n');
        out.write_all(block.as_bytes())?;
    }
    Ok(())
}

/// One frame line: `\t0 name+0x0 (module)`.
fn push_frame(block: &mut String, frame: &Frame) {
    block.push_str("\t0 ");
    block.push_str(&frame.shown_name());
    let unknown = frame.name.is_empty() || frame.name == UNKNOWN;
    if !unknown && frame.kind != FrameKind::Marker {
        block.push_str("+0x0");
    }
    block.push_str(" (");
    if frame.inlined {
        block.push_str("inlined");
    } else if unknown || frame.kind == FrameKind::Marker {
        block.push_str(UNKNOWN);
    } else {
        match (&frame.module, frame.kind) {
            // The module is the last word of the line: a space in it would hide the frame.
            (Some(module), _) if !module.is_empty() => push_word(block, module),
            (_, FrameKind::Kernel) => block.push_str(KERNEL_MODULE),
            _ => block.push_str(UNKNOWN),
        }
    }
    block.push_str(")\n");
}

/// Appends `text`, shown as a name ([`shown_name`]), as one word: whitespace becomes `_`.
fn push_word(buf: &mut String, text: &str) {
    buf.extend(
        shown_name(text)
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c }),
    );
}

/// The event as one word without colons, which end the header's fields.
fn event_name(event: &str) -> String {
    let name: String = printable(event)
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == ':' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if name.is_empty() {
        DEFAULT_EVENT.to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metadata, ProfileBuilder, Thread};

    #[test]
    fn block_per_sample_leaf_first() {
        let mut b = ProfileBuilder::new(Metadata {
            event: "cpu-clock".into(),
            ..Metadata::default()
        });
        let main = b.frame(Frame {
            name: "main".into(),
            module: Some("/usr/bin/my prog".into()),
            ..Frame::default()
        });
        let inl = b.frame(Frame {
            name: "inner".into(),
            module: Some("/usr/bin/my prog".into()),
            inlined: true,
            ..Frame::default()
        });
        let unknown = b.frame(Frame {
            name: UNKNOWN.into(),
            module: Some("/lib/libc.so.6".into()),
            ..Frame::default()
        });
        let k = b.frame(Frame {
            name: "do_syscall_64".into(),
            kind: FrameKind::Kernel,
            ..Frame::default()
        });
        let t = b.thread(Thread {
            pid: 7,
            tid: 8,
            comm: "my prog".into(),
            process_name: "my prog".into(),
        });
        let s = b.stack(&[unknown, main, inl, k]);
        b.add(t, s, Some(2), 5);
        let mut out = Vec::new();
        write(&b.finish(), &WriteOptions::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "my_prog 7/8 [002] 0.000000: 5 cpu-clock:\n\
             \t0 do_syscall_64+0x0 ([kernel.kallsyms])\n\
             \t0 inner+0x0 (inlined)\n\
             \t0 main+0x0 (/usr/bin/my_prog)\n\
             \t0 [unknown] ([unknown])\n\n"
        );
    }

    #[test]
    fn a_sample_without_frames_keeps_its_count() {
        let mut b = ProfileBuilder::new(Metadata::default());
        let t = b.thread(Thread {
            pid: 1,
            tid: 1,
            comm: "x".into(),
            process_name: "x".into(),
        });
        let s = b.stack(&[]);
        b.add(t, s, None, 3);
        let mut out = Vec::new();
        write(&b.finish(), &WriteOptions::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x 1/1 0.000000: 3 cpu-clock:\n\t0 [unknown] ([unknown])\n\n"
        );
    }
}
