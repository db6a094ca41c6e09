//! DTrace aggregation text, as `dtrace -n '... { @[ustack()] = count(); }' -o FILE` writes it,
//! for the tools that read only that (inferno's dtrace collapser, cargo-flamegraph behind it).
//!
//! The file begins with a blank line: readers skip everything up to the first blank line as
//! DTrace's header, so without it the first stack would be lost. Then, per stack, the frames
//! leaf first as `` module`name+0x0 `` (module without its directory, as DTrace prints it), a
//! count line and a blank line; stacks in ascending count, as `printa` sorts them.
//!
//! An aggregation on `ustack()` has no thread: equal stacks of different threads add up, and
//! the `comm` is not a frame. Each name ends in `+0x0`, the offset the collapser strips from
//! the last `+`, so names holding a `+` survive. Markers and frames without a module print
//! their bare name; a stack without frames prints one `[unknown]` frame.

use super::WriteOptions;
use crate::{printable, Frame, FrameKind, Profile, UNKNOWN};
use std::collections::HashMap;
use std::io::{self, Write};

const FRAME_INDENT: &str = "              ";
const COUNT_INDENT: &str = "             ";

pub fn write(profile: &Profile, _opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for sample in &profile.samples {
        // Counts were checked to sum within u64.
        *counts.entry(sample.stack).or_default() += sample.count;
    }
    // Distinct stack ids may still print alike (same names, other files or lines).
    let mut texts: HashMap<String, u64> = HashMap::new();
    for (stack, count) in counts {
        if count == 0 {
            continue;
        }
        let mut text = String::new();
        for frame in profile.stack_frames(stack).rev() {
            push_frame(&mut text, frame);
        }
        if text.is_empty() {
            // A count without frames would break readers (inferno's collapser fails on it).
            push_frame(&mut text, &Frame::marker(UNKNOWN));
        }
        *texts.entry(text).or_default() += count;
    }
    let mut stacks: Vec<(String, u64)> = texts.into_iter().collect();
    stacks.sort_unstable_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    out.write_all(b"\n")?;
    for (text, count) in stacks {
        writeln!(out, "{text}{COUNT_INDENT}{count}\n")?;
    }
    Ok(())
}

fn push_frame(text: &mut String, frame: &Frame) {
    text.push_str(FRAME_INDENT);
    if frame.kind != FrameKind::Marker {
        if let Some(module) = frame.module.as_deref().map(basename).map(printable) {
            if !module.is_empty() {
                // A backtick would end the module early.
                text.extend(module.chars().map(|c| match c {
                    '`' => '\'',
                    c if c.is_whitespace() => '_',
                    c => c,
                }));
                text.push('`');
            }
        }
    }
    text.push_str(&frame.shown_name());
    if frame.kind != FrameKind::Marker {
        text.push_str("+0x0");
    }
    text.push('\n');
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metadata, ProfileBuilder, Thread};

    #[test]
    fn starts_blank_threads_merge_ascending() {
        let mut b = ProfileBuilder::new(Metadata::default());
        let main = b.frame(Frame {
            name: "main".into(),
            module: Some("/usr/bin/prog".into()),
            ..Frame::default()
        });
        let f = b.frame(Frame {
            name: "a+b".into(),
            module: Some("/lib/libc.so.6".into()),
            ..Frame::default()
        });
        let m = b.frame(Frame::marker(UNKNOWN));
        let t1 = b.thread(Thread {
            tid: 1,
            ..Thread::default()
        });
        let t2 = b.thread(Thread {
            tid: 2,
            ..Thread::default()
        });
        let s1 = b.stack(&[main, f]);
        let s2 = b.stack(&[m, main]);
        let empty = b.stack(&[]);
        b.add(t2, empty, None, 1);
        b.add(t1, s1, None, 2);
        b.add(t2, s1, None, 3);
        b.add(t1, s2, None, 4);
        let mut out = Vec::new();
        write(&b.finish(), &WriteOptions::default(), &mut out).unwrap();
        let i = FRAME_INDENT;
        let c = COUNT_INDENT;
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "\n{i}[unknown]\n{c}1\n\n{i}prog`main+0x0\n{i}[unknown]\n{c}4\n\n\
                 {i}libc.so.6`a+b+0x0\n{i}prog`main+0x0\n{c}5\n\n"
            )
        );
    }
}
