//! Folded stacks, as bcc `profile -f` prints them and flamegraph tools read them:
//! `comm;userroot;...;userleaf[;-];kernelentry;...;kernelleaf COUNT`.
//!
//! The format has no escaping, so a name is written so that it reads back as itself, here and
//! in inferno: shown as every writer shows names ([`shown_name`]: control characters replaced),
//! then `;` becomes `:`, white space at its ends is dropped, and the few spellings a reader
//! takes for something else are replaced (see [`push_field`]). The two-count lines of a
//! differential profile (`stack BEFORE AFTER`) are refused, never read as one count.

use super::{delimited, kernel_start, starts_as_json, ReadError, WriteOptions};
use crate::{
    shown_name, Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread, REPLACEMENT, UNKNOWN,
};
use std::collections::HashMap;
use std::io::{self, Write};

/// bcc's kernel annotation, which flamegraph palettes colour.
const KERNEL_SUFFIX: &str = "_[k]";
/// The flamegraph convention for inlined frames (inferno's java palette colours it).
const INLINED_SUFFIX: &str = "_[i]";
/// A lone `-` frame separates user from kernel frames (bcc `-d`).
const DELIMITER: &str = "-";
/// Lines starting so are comments, to this reader and to inferno.
const COMMENT: &str = "# ";

/// How frames are spelled in a folded line.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Spelling {
    pub delimiter: bool,
    pub annotate_kernel: bool,
    pub annotate_inlined: bool,
}

impl From<&WriteOptions> for Spelling {
    fn from(opts: &WriteOptions) -> Self {
        Spelling {
            delimiter: opts.delimiter,
            annotate_kernel: opts.annotate_kernel,
            annotate_inlined: false,
        }
    }
}

/// The folded lines of `profile` without their counts, merged and sorted by ascending count,
/// then text, as bcc prints them.
pub(super) fn lines(profile: &Profile, spelling: Spelling) -> Vec<(String, u64)> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut line = String::new();
    for sample in &profile.samples {
        line.clear();
        let thread = profile.thread(sample.thread);
        push_field(&mut line, &thread.comm);
        // A line that starts as a comment would be skipped, one that starts as JSON would make
        // the whole file read as JSON.
        if line.starts_with(COMMENT) || starts_as_json(&line) {
            line.replace_range(..1, "");
            line.insert(0, REPLACEMENT);
        }
        let frames = &profile.stack(sample.stack).frames;
        let split = kernel_start(profile, frames);
        let delimit = spelling.delimiter && delimited(profile, frames, split);
        for (i, &id) in frames.iter().enumerate() {
            if i == split && delimit {
                line.push(';');
                line.push_str(DELIMITER);
            }
            let frame = profile.frame(id);
            line.push(';');
            push_field(&mut line, &frame.name);
            if frame.kind == FrameKind::Kernel && spelling.annotate_kernel {
                line.push_str(KERNEL_SUFFIX);
            } else if frame.inlined && spelling.annotate_inlined {
                line.push_str(INLINED_SUFFIX);
            }
        }
        guard_trailing_number(&mut line);
        // Counts were checked to sum within u64.
        *counts.entry(line.clone()).or_default() += sample.count;
    }
    let mut lines: Vec<(String, u64)> = counts.into_iter().collect();
    lines.sort_unstable_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    lines
}

/// Appends `name` as one field that reads back as itself: [`shown_name`], with `;` (which
/// separates fields) as `:` and white space at its ends (which readers trim from a line's ends)
/// dropped; a name left empty is [`UNKNOWN`], and one that is the user/kernel delimiter is
/// [`REPLACEMENT`].
fn push_field(line: &mut String, name: &str) {
    let shown = shown_name(name);
    match shown.trim() {
        "" => line.push_str(UNKNOWN),
        DELIMITER => line.push(REPLACEMENT),
        field => line.extend(field.chars().map(|c| if c == ';' { ':' } else { c })),
    }
}

/// A line ending in ` 12` before its count reads as a differential profile (`stack OLD NEW`)
/// to flamegraph tools, which would drop `12` from the leaf's name; an underscore keeps it.
fn guard_trailing_number(line: &mut String) {
    if let Some(space) = count_at_end(line) {
        line.replace_range(space..space + 1, "_");
    }
}

/// Where the space is before a count (digits with at most one `.`, as inferno reads counts)
/// that ends `stack`: a second count, when `stack` is a line without its last one.
fn count_at_end(stack: &str) -> Option<usize> {
    let space = stack.rfind(' ')?;
    let count = &stack[space + 1..];
    let digits = count.bytes().filter(u8::is_ascii_digit).count();
    let count_like = digits > 0
        && count.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && digits + 1 >= count.len();
    count_like.then_some(space)
}

pub(super) fn write(profile: &Profile, opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    for (line, count) in lines(profile, opts.into()) {
        writeln!(out, "{line} {count}")?;
    }
    Ok(())
}

/// Reads folded stacks. The first field of a line is the thread's `comm`; `-` fields are
/// dropped and frames after one are kernel frames, as are frames ending in `_[k]` (suffix
/// stripped). Other bracketed names than `[unknown]` become markers. Equal stacks of equal
/// `comm` add up. Blank lines and `# ` comment lines (which inferno skips) are ignored. A line
/// with two counts, `stack BEFORE AFTER`, is refused: it is a differential profile, which
/// the model cannot hold.
pub(super) fn read(text: &str) -> Result<Profile, ReadError> {
    let mut builder = ProfileBuilder::new(Metadata {
        source: "folded".to_string(),
        ..Metadata::default()
    });
    let mut threads: HashMap<&str, u32> = HashMap::new();
    let mut frames = Vec::new();
    let mut total: u64 = 0;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let err = |problem: String| ReadError::Folded {
            line: line_no,
            problem,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with(COMMENT) {
            continue;
        }
        let (stack, count) = line.rsplit_once(' ').ok_or_else(|| {
            err(format!(
                "expected `comm;frame;... COUNT`, found no count in {}",
                excerpt(line)
            ))
        })?;
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(format!(
                "expected a whole sample count at the end of the line, found {}",
                excerpt(count)
            )));
        }
        let count: u64 = count
            .parse()
            .map_err(|_| err(format!("sample count {count} does not fit in 64 bits")))?;
        total = total
            .checked_add(count)
            .ok_or_else(|| err("the sample counts add up to more than 2^64".to_string()))?;

        let stack = stack.trim_end();
        if count_at_end(stack).is_some() {
            return Err(ReadError::Differential { line: line_no });
        }
        let mut fields = stack.split(';');
        let comm = fields.next().unwrap_or_default();
        if comm.is_empty() {
            return Err(err(
                "the first field, the command name, is empty".to_string()
            ));
        }
        frames.clear();
        let mut kernel_side = false;
        for (i, name) in fields.enumerate() {
            if name.is_empty() {
                return Err(err(format!("frame {} has an empty name", i + 1)));
            }
            if name == DELIMITER {
                kernel_side = true;
                continue;
            }
            frames.push(builder.frame(parse_frame(name, kernel_side)));
        }
        let thread = *threads.entry(comm).or_insert_with(|| {
            builder.thread(Thread {
                comm: comm.to_string(),
                ..Thread::default()
            })
        });
        let stack = builder.stack(&frames);
        builder.add(thread, stack, None, count);
    }
    Ok(builder.finish())
}

fn parse_frame(name: &str, kernel_side: bool) -> Frame {
    let (name, kind) = match name.strip_suffix(KERNEL_SUFFIX) {
        Some(stripped) if !stripped.is_empty() => (stripped, FrameKind::Kernel),
        _ if name.len() > 2
            && name.starts_with('[')
            && name.ends_with(']')
            && name != crate::UNKNOWN =>
        {
            (name, FrameKind::Marker)
        }
        _ if kernel_side => (name, FrameKind::Kernel),
        _ => (name, FrameKind::User),
    };
    Frame {
        name: name.to_string(),
        kind,
        ..Frame::default()
    }
}

/// A short, quoted piece of a bad line for an error message.
fn excerpt(s: &str) -> String {
    const MAX: usize = 60;
    match s.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}...", &s[..end]),
        None => format!("{s:?}"),
    }
}
