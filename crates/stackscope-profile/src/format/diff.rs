//! The differential flamegraph of two profiles, with inferno's differential semantics: each
//! stack of the second profile is drawn at its new width and coloured by how much it grew
//! (red) or shrank (blue) since the first. By default the first profile is first scaled to the
//! second's total, so a longer or busier run does not turn everything red. As folded text, one
//! line per stack: `stack BEFORE AFTER`, as inferno-diff-folded writes it.

use super::{Format, WriteOptions};
use crate::{printable, Profile};
use inferno::differential;
use inferno::flamegraph;
use std::io::{self, Write};

/// How two profiles are compared and drawn.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Compare the counts as they are, instead of scaling the first profile to the second's
    /// total.
    pub no_normalize: bool,
    /// Replace hexadecimal numbers in frame names with `0x...`.
    pub strip_hex: bool,
    /// Colour by the change from the second profile to the first.
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
    let lines = lines(before, after, opts, diff)?;
    if format == Format::Folded {
        return out.write_all(&lines);
    }
    let mut options = flamegraph::Options::default();
    if let Some(title) = &opts.title {
        // XML cannot hold control characters; names arrive without them, as folded spells them.
        options.title = printable(title).into_owned();
    }
    options.subtitle = Some(format!(
        "{} samples before{}, {} after; red grew, blue shrank",
        before.total_samples(),
        if diff.no_normalize {
            ""
        } else {
            " (scaled to after's total)"
        },
        after.total_samples()
    ));
    options.count_name = "samples".to_string();
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

/// The differential folded lines, `stack BEFORE AFTER`, of two profiles folded alike.
fn lines(
    before: &Profile,
    after: &Profile,
    opts: &WriteOptions,
    diff: &DiffOptions,
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
        normalize: !diff.no_normalize,
        strip_hex: diff.strip_hex,
    };
    let mut out = Vec::new();
    differential::from_readers(options, &fold(before)?[..], &fold(after)?[..], &mut out)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot compare the two profiles: {e}")))?;
    Ok(out)
}
