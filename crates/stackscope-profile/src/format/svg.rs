//! Interactive flamegraph SVG, rendered by inferno from the profile's folded lines.
//!
//! The thread's `comm` stays the root frame, as in bcc's folded output, so processes and
//! threads stay apart. Kernel frames carry `_[k]` and inlined frames `_[i]`, which inferno's
//! java palette colours orange and aqua (C++/Rust names with `::` come out yellow, other
//! user code red, names that look like Java green).
//!
//! Names reach the SVG as the folded writer spells them, so without control characters, which
//! XML cannot hold; the title and subtitle are made [`printable`] alike. inferno escapes what
//! XML gives a meaning (`<`, `&`, quotes).

use super::folded::{self, Spelling};
use super::WriteOptions;
use crate::{printable, CountUnit, Profile, IN_USE_EVENT};
use inferno::flamegraph::{self, color::MultiPalette, Palette};
use std::io::{self, Write};

const DEFAULT_TITLE: &str = "stackscope";

pub(super) fn write(profile: &Profile, opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    let title = printable(opts.title.as_deref().unwrap_or(DEFAULT_TITLE));
    let spelling = Spelling {
        delimiter: opts.delimiter,
        annotate_kernel: true,
        annotate_inlined: true,
    };
    let lines: Vec<String> = folded::lines(profile, spelling)
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(line, count)| format!("{line} {count}"))
        .collect();
    if lines.is_empty() {
        // inferno refuses input without samples; an empty run still deserves a valid file.
        return write_empty(&title, out);
    }
    let mut options = flamegraph::Options::default();
    options.title = title.into_owned();
    options.count_name = profile.meta.count_unit.short_name().to_string();
    options.colors = Palette::Multi(MultiPalette::Java);
    // Colour by name hash, so a function keeps its colour across runs and graphs.
    options.hash = true;
    if !profile.meta.event.is_empty() {
        options.subtitle = Some(printable(&subtitle(profile)).into_owned());
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

fn subtitle(profile: &Profile) -> String {
    let meta = &profile.meta;
    let mut s = meta.event.clone();
    if meta.count_unit == CountUnit::Bytes {
        s = match meta.event == IN_USE_EVENT {
            true => "bytes still held at the end, by the stacks that allocated them".to_string(),
            false => "bytes allocated".to_string(),
        };
        if let Some(every) = meta.period {
            s.push_str(&format!(", one allocation sampled per {every} bytes"));
        }
    } else if let Some(hz) = meta.frequency_hz {
        s.push_str(&format!(" at {hz} Hz"));
    } else if let Some(period) = meta.period {
        s.push_str(&format!(", every {period} events"));
    }
    if meta.count_unit == CountUnit::Microseconds {
        s.push_str(", time in µs");
    }
    if meta.duration_secs > 0.0 {
        s.push_str(&format!(", {:.1} s", meta.duration_secs));
    }
    s
}

fn write_empty(title: &str, out: &mut dyn Write) -> io::Result<()> {
    write!(
        out,
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"90\" viewBox=\"0 0 1200 90\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#f8f8f8\"/>\n",
            "<text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"17\">{}</text>\n",
            "<text x=\"600\" y=\"64\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"12\">No samples: the profile is empty.</text>\n",
            "</svg>\n"
        ),
        xml_escape(title)
    )
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}
