//! The differential flamegraph of two profiles, with inferno's differential semantics: each
//! stack of the second profile is drawn at its new width and coloured by how much it grew
//! (red) or shrank (blue) since the first. By default the first profile is first scaled to the
//! second's total, so a longer or busier run does not turn everything red. As folded text, one
//! line per stack: `stack BEFORE AFTER`, as inferno-diff-folded writes it.
//!
//! Drawn from the second profile, a stack the first held and the second lacks has no width at
//! all: [`missing`] counts what one profile holds that the other lacks, for the caller to say,
//! and [`DiffOptions::negate`] draws from the first profile instead, where it shows in blue.

use super::{Format, WriteOptions};
use crate::{printable, Profile};
use inferno::differential;
use inferno::flamegraph;
use std::collections::HashSet;
use std::io::{self, Write};

/// How two profiles are compared and drawn.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Compare the counts as they are, instead of scaling the first profile to the second's
    /// total.
    pub no_normalize: bool,
    /// Replace hexadecimal numbers in frame names with `0x...`.
    pub strip_hex: bool,
    /// Draw the first profile's stacks at their widths instead of the second's, coloured by the
    /// same change (red grew, blue shrank), so that what the second lacks shows: the folded
    /// lines are then `stack AFTER BEFORE` (the second profile scaled to the first's total),
    /// as inferno-flamegraph's --negate takes them, after Brendan Gregg's recipe.
    pub negate: bool,
}

/// The formats a comparison can be written in.
pub const FORMATS: [Format; 2] = [Format::Svg, Format::Folded];

/// Writes the comparison of `before` and `after` as an SVG flamegraph or folded lines; any
/// other format is refused with [`io::ErrorKind::InvalidInput`]. Both profiles are folded with
/// `opts`' delimiter and kernel annotation; `opts.title` titles the SVG.
pub fn write(
    before: &Profile,
    after: &Profile,
    format: Format,
    opts: &WriteOptions,
    diff: &DiffOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    if !FORMATS.contains(&format) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a differential flamegraph is svg or folded, not {format}"),
        ));
    }
    // The profile drawn is the second of the pair compared.
    let lines = match diff.negate {
        false => lines(before, after, opts, diff, !diff.no_normalize)?,
        true => lines(after, before, opts, diff, !diff.no_normalize)?,
    };
    if format == Format::Folded {
        return out.write_all(&lines);
    }
    let mut options = flamegraph::Options::default();
    if let Some(title) = &opts.title {
        // XML cannot hold control characters; names arrive without them, as folded spells them.
        options.title = printable(title).into_owned();
    }
    let (scaled, drawn) = match (diff.no_normalize, diff.negate) {
        (true, _) => ("", "after"),
        (false, false) => (" (scaled to after's total)", "after"),
        (false, true) => (" (scaled to before's total)", "before"),
    };
    let (before_scaled, after_scaled) = match diff.negate {
        false => (scaled, ""),
        true => ("", scaled),
    };
    let unit = after.meta.count_unit.short_name();
    options.subtitle = Some(format!(
        "{} {unit} before{before_scaled}, {} after{after_scaled}; drawn as {drawn} was: red grew, blue shrank",
        before.total_samples(),
        after.total_samples(),
    ));
    options.count_name = unit.to_string();
    // inferno colours by the second count less the first; with the pair swapped, negating
    // keeps red for what grew from before to after.
    options.negate_differentials = diff.negate;
    let text =
        std::str::from_utf8(&lines).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    flamegraph::from_lines(&mut options, text.lines(), out).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot render the differential flamegraph: {e}"),
        )
    })
}

/// What one profile holds that another lacks, its stacks spelled as the comparison spells
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Missing {
    /// The profile's samples in stacks the other lacks, as counted (not scaled).
    pub samples: u64,
    /// Those stacks.
    pub stacks: u64,
    /// The profile's functions no stack of the other holds.
    pub functions: u64,
}

/// What `from` holds that `other` lacks, compared as [`write`] compares them with `opts` and
/// `diff`: the samples and stacks a flamegraph drawn from `other` leaves out.
pub fn missing(
    from: &Profile,
    other: &Profile,
    opts: &WriteOptions,
    diff: &DiffOptions,
) -> io::Result<Missing> {
    let lines = lines(other, from, opts, diff, false)?;
    let text =
        std::str::from_utf8(&lines).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut found = Missing::default();
    let mut theirs: HashSet<&str> = HashSet::new();
    let mut ours: HashSet<&str> = HashSet::new();
    for line in text.lines() {
        // `stack OTHER FROM`; the stack's first frame is its thread's name.
        let mut parts = line.rsplitn(3, ' ');
        let (Some(from_count), Some(other_count), Some(stack)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let count = |n: &str| n.parse::<u64>().unwrap_or(0);
        let functions = stack.split(';').skip(1).filter(|f| *f != "-" && *f != "--");
        if count(other_count) > 0 {
            theirs.extend(functions);
        } else if count(from_count) > 0 {
            found.samples += count(from_count);
            found.stacks += 1;
            ours.extend(functions);
        }
    }
    found.functions = ours.difference(&theirs).count() as u64;
    Ok(found)
}

/// The differential folded lines, `stack FIRST SECOND`, of two profiles folded alike; with
/// `normalize`, the first's counts scaled to the second's total.
fn lines(
    first: &Profile,
    second: &Profile,
    opts: &WriteOptions,
    diff: &DiffOptions,
    normalize: bool,
) -> io::Result<Vec<u8>> {
    let folded = WriteOptions {
        title: None,
        ..opts.clone()
    };
    let fold = |profile: &Profile| -> io::Result<Vec<u8>> {
        let mut lines = Vec::new();
        super::write(profile, Format::Folded, &folded, &mut lines)?;
        Ok(lines)
    };
    let options = differential::Options {
        normalize,
        strip_hex: diff.strip_hex,
    };
    let mut out = Vec::new();
    differential::from_readers(options, &fold(first)?[..], &fold(second)?[..], &mut out)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot compare the two profiles: {e}")))?;
    Ok(out)
}
