//! Readers and writers of [`Profile`]s: folded stacks (bcc `profile -f`, flamegraph input),
//! bcc `profile`'s default text, flamegraph SVG (rendered by inferno), stackscope's own
//! lossless JSON, pprof, speedscope, the Firefox Profiler's processed format, the Asterinas
//! OSDK's JSON, `perf script` text, DTrace aggregation text, and a table of the hottest
//! functions for a terminal.
//!
//! Writers take a valid profile (every index in range) and refuse an invalid one with an
//! [`std::io::ErrorKind::InvalidData`] error instead of panicking. [`read`] accepts what
//! [`write()`] produced as stackscope JSON, OSDK JSON or folded stacks, and validates it.
//!
//! Names come from the profiled processes (any user's, under `record -a`) or from a saved
//! file: every writer but stackscope's lossless JSON shows them through [`crate::shown_name`],
//! which replaces control characters with U+FFFD, and the folded writer further spells them so
//! they read back as themselves.

mod bcc;
pub mod diff;
pub mod dtrace;
mod firefox;
mod folded;
mod json;
mod osdk;
pub mod perf_script;
pub mod pprof;
mod speedscope;
pub mod summary;
mod svg;
pub mod top;

use crate::{FrameKind, Profile};
use std::io::{self, Write};
use std::path::Path;

pub use summary::summary;

/// An output (and, for folded, JSON and OSDK JSON, input) format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Folded,
    Bcc,
    Svg,
    Json,
    /// Gzipped `perftools.profiles.Profile` protocol buffer, for `go tool pprof`.
    Pprof,
    /// speedscope's file format: one sampled profile per thread.
    Speedscope,
    /// The Firefox Profiler's processed profile format.
    Firefox,
    /// The Asterinas OSDK's `cargo osdk profile` JSON: per sampling round, each CPU's stack.
    Osdk,
    /// `perf script` text, as inferno's perf collapser reads it.
    PerfScript,
    /// DTrace aggregation text (`@[ustack()] = count()` output).
    Dtrace,
    /// The hottest functions with their self and total shares, as text for a terminal.
    Top,
}

impl Format {
    /// Every format, in the order a help text should list them.
    pub const ALL: [Format; 11] = [
        Format::Folded,
        Format::Bcc,
        Format::Svg,
        Format::Json,
        Format::Pprof,
        Format::Speedscope,
        Format::Firefox,
        Format::Osdk,
        Format::PerfScript,
        Format::Dtrace,
        Format::Top,
    ];

    /// Parses a format's [`Format::name`], plus the aliases `collapsed` (folded),
    /// `flamegraph` (svg) and `firefox-profiler` (firefox). Case does not matter.
    pub fn from_name(name: &str) -> Option<Format> {
        match name.to_ascii_lowercase().as_str() {
            "folded" | "collapsed" => Some(Format::Folded),
            "bcc" => Some(Format::Bcc),
            "svg" | "flamegraph" => Some(Format::Svg),
            "json" => Some(Format::Json),
            "pprof" => Some(Format::Pprof),
            "speedscope" => Some(Format::Speedscope),
            "firefox" | "firefox-profiler" => Some(Format::Firefox),
            "osdk" => Some(Format::Osdk),
            "perf-script" => Some(Format::PerfScript),
            "dtrace" => Some(Format::Dtrace),
            "top" => Some(Format::Top),
            _ => None,
        }
    }

    /// The file name endings [`Format::from_path`] knows, in the order it tries them: the
    /// double extensions before plain `.json`, which they end in.
    pub const EXTENSIONS: &'static [(&'static str, Format)] = &[
        (".svg", Format::Svg),
        (".folded", Format::Folded),
        (".collapsed", Format::Folded),
        (".stacks", Format::Folded),
        (".txt", Format::Bcc),
        (".pb.gz", Format::Pprof),
        (".pprof", Format::Pprof),
        (".speedscope.json", Format::Speedscope),
        (".firefox.json", Format::Firefox),
        (".osdk.json", Format::Osdk),
        (".json", Format::Json),
        (".perf-script", Format::PerfScript),
        (".dtrace", Format::Dtrace),
    ];

    /// Guesses the format from a file name's ending, one of [`Format::EXTENSIONS`] (case does
    /// not matter); a name that is only the ending (`.svg`) names a hidden file, not a format.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        Format::EXTENSIONS
            .iter()
            .find(|(ending, _)| name.len() > ending.len() && name.ends_with(ending))
            .map(|&(_, format)| format)
    }

    /// The file written when the user names none: `flame.svg` for SVG, standard output
    /// (`-`) for the table made to be read there, else `stackscope.<extension>`.
    pub fn default_file(self) -> &'static str {
        match self {
            Format::Svg => "flame.svg",
            Format::Folded => "stackscope.folded",
            Format::Bcc => "stackscope.txt",
            Format::Json => "stackscope.json",
            Format::Pprof => "stackscope.pb.gz",
            Format::Speedscope => "stackscope.speedscope.json",
            Format::Firefox => "stackscope.firefox.json",
            Format::Osdk => "stackscope.osdk.json",
            Format::PerfScript => "stackscope.perf-script",
            Format::Dtrace => "stackscope.dtrace",
            Format::Top => "-",
        }
    }

    /// The canonical name, the one [`Format::from_name`] gives back as this format.
    pub fn name(self) -> &'static str {
        match self {
            Format::Folded => "folded",
            Format::Bcc => "bcc",
            Format::Svg => "svg",
            Format::Json => "json",
            Format::Pprof => "pprof",
            Format::Speedscope => "speedscope",
            Format::Firefox => "firefox",
            Format::Osdk => "osdk",
            Format::PerfScript => "perf-script",
            Format::Dtrace => "dtrace",
            Format::Top => "top",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Options of the text writers, named after the bcc `profile` flags they mirror.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// bcc `-d`: a `-` frame between user and kernel frames in folded output (and SVG), a
    /// `--` line in bcc text; only where a stack has both.
    pub delimiter: bool,
    /// bcc `-a`: `_[k]` appended to kernel frame names in folded and bcc text output. SVG
    /// output always annotates kernel frames, to colour them.
    pub annotate_kernel: bool,
    /// SVG title; `stackscope` when unset.
    pub title: Option<String>,
}

/// Writes `profile` in `format`. Fails with [`io::ErrorKind::InvalidData`] when the profile
/// holds an index out of range, or a count the format cannot hold.
pub fn write(
    profile: &Profile,
    format: Format,
    opts: &WriteOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    check_written(profile)?;
    // Writers emit many small pieces; the caller's writer may be an unbuffered file.
    let mut out = io::BufWriter::new(out);
    match format {
        Format::Folded => folded::write(profile, opts, &mut out)?,
        Format::Bcc => bcc::write(profile, opts, &mut out)?,
        Format::Svg => svg::write(profile, opts, &mut out)?,
        Format::Json => json::write(profile, &mut out)?,
        Format::Pprof => pprof::write(profile, opts, &mut out)?,
        Format::Speedscope => speedscope::write(profile, opts, &mut out)?,
        Format::Firefox => firefox::write(profile, opts, &mut out)?,
        Format::Osdk => osdk::write(profile, &mut out)?,
        Format::PerfScript => perf_script::write(profile, opts, &mut out)?,
        Format::Dtrace => dtrace::write(profile, opts, &mut out)?,
        Format::Top => top::write(profile, &top::TopOptions::default(), &mut out)?,
    }
    out.flush()
}

/// Refuses to write an invalid profile, as an [`io::ErrorKind::InvalidData`] error.
pub(crate) fn check_written(profile: &Profile) -> io::Result<()> {
    check_indices(profile).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot write an invalid profile: {e}"),
        )
    })
}

/// Why [`read`] rejected its input. Each message is one line saying what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "input is not UTF-8 text (bad byte at offset {offset}); expected stackscope JSON or folded stacks"
    )]
    NotText { offset: usize },
    #[error("folded stacks, line {line}: {problem}")]
    Folded { line: usize, problem: String },
    #[error(
        "differential folded stacks (line {line} has two counts, `stack BEFORE AFTER`, as `stackscope diff` writes them): stackscope reads back profiles of one count; compare the two profiles themselves with `stackscope diff`"
    )]
    Differential { line: usize },
    #[error("stackscope JSON, {place}: {problem}")]
    Json { place: String, problem: String },
    #[error("OSDK profile JSON, {place}: {problem}")]
    Osdk { place: String, problem: String },
    #[error(
        "byte {byte:#04x} at offset {offset} begins none of stackscope JSON, OSDK JSON, folded stacks or perf.data"
    )]
    NotProfile { offset: usize, byte: u8 },
    #[error(
        "stackscope reads no {format} input; it reads stackscope JSON, OSDK JSON and folded stacks"
    )]
    NotReadable { format: Format },
}

/// How many bytes of an input [`check_start`] needs to see.
pub const START_BYTES: usize = 64;

/// Refuses, from its first bytes (up to [`START_BYTES`]), an input that cannot be a text
/// profile [`read`] accepts: one holding a control character other than tab, CR or LF, or bytes
/// that are not UTF-8 (a character cut at the end of `start` is allowed). Lets a caller refuse
/// an endless or binary input before reading it all.
pub fn check_start(start: &[u8]) -> Result<(), ReadError> {
    let text = match std::str::from_utf8(start) {
        Ok(text) => text,
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(&start[..e.valid_up_to()]).unwrap_or_default()
        }
        Err(e) => {
            let offset = e.valid_up_to();
            return Err(ReadError::NotProfile {
                offset,
                byte: start[offset],
            });
        }
    };
    match text
        .bytes()
        .position(|b| b.is_ascii_control() && !matches!(b, b'\t' | b'\r' | b'\n'))
    {
        Some(offset) => Err(ReadError::NotProfile {
            offset,
            byte: start[offset],
        }),
        None => Ok(()),
    }
}

/// Reads a profile written by `write` as JSON, OSDK JSON or folded stacks; detects which from
/// the content.
///
/// JSON is recognised by its start, `{` then `"` (whitespace between allowed); OSDK JSON is JSON
/// whose first key is `"stack_traces"`; a folded line starts with a command name. Folded input
/// yields one thread per distinct `comm` (pid and tid 0); OSDK input one thread per CPU.
pub fn read(bytes: &[u8]) -> Result<Profile, ReadError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ReadError::NotText {
        offset: e.valid_up_to(),
    })?;
    let is_json = starts_as_json(text);
    if is_json && osdk::detect(text) {
        osdk::read(text)
    } else if is_json {
        json::read(text)
    } else {
        folded::read(text)
    }
}

/// Whether [`read`] takes `text` for JSON (OSDK's or stackscope's): it starts with `{` then
/// `"` or `}`, white space between allowed.
pub(crate) fn starts_as_json(text: &str) -> bool {
    let mut start = text.trim_start().chars();
    start.next() == Some('{')
        && matches!(
            start.find(|c: &char| !c.is_whitespace()),
            None | Some('"' | '}')
        )
}

/// Reads `bytes` as `format`, without detecting it: [`Format::Json`], [`Format::Osdk`] or
/// [`Format::Folded`]; any other is refused.
pub fn read_as(format: Format, bytes: &[u8]) -> Result<Profile, ReadError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ReadError::NotText {
        offset: e.valid_up_to(),
    })?;
    match format {
        Format::Json => json::read(text),
        Format::Osdk => osdk::read(text),
        Format::Folded => folded::read(text),
        format => Err(ReadError::NotReadable { format }),
    }
}

/// An index in a profile that points nowhere.
#[derive(Debug)]
pub(crate) struct BadIndex {
    /// JSON-style path of the bad field, e.g. `samples[3].stack`.
    pub place: String,
    pub problem: String,
}

impl std::fmt::Display for BadIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.problem)
    }
}

/// Checks every frame, stack and thread index, and that the sample counts sum within `u64`,
/// so the rest of the crate may index and sum freely.
pub(crate) fn check_indices(profile: &Profile) -> Result<(), BadIndex> {
    let out_of_range = |place: String, what: &str, id: u32, len: usize| BadIndex {
        place,
        problem: format!("{what} id {id} is out of range (the profile has {len} {what}s)"),
    };
    for (i, stack) in profile.stacks.iter().enumerate() {
        for (j, &frame) in stack.frames.iter().enumerate() {
            if frame as usize >= profile.frames.len() {
                return Err(out_of_range(
                    format!("stacks[{i}].frames[{j}]"),
                    "frame",
                    frame,
                    profile.frames.len(),
                ));
            }
        }
    }
    let mut total: u64 = 0;
    for (i, sample) in profile.samples.iter().enumerate() {
        if sample.stack as usize >= profile.stacks.len() {
            return Err(out_of_range(
                format!("samples[{i}].stack"),
                "stack",
                sample.stack,
                profile.stacks.len(),
            ));
        }
        if sample.thread as usize >= profile.threads.len() {
            return Err(out_of_range(
                format!("samples[{i}].thread"),
                "thread",
                sample.thread,
                profile.threads.len(),
            ));
        }
        total = total.checked_add(sample.count).ok_or_else(|| BadIndex {
            place: format!("samples[{i}].count"),
            problem: "the sample counts add up to more than 2^64".to_string(),
        })?;
    }
    Ok(())
}

/// Where a stack's kernel frames begin: at its first kernel frame (user frames come first).
pub(crate) fn kernel_start(profile: &Profile, frames: &[u32]) -> usize {
    frames
        .iter()
        .position(|&f| profile.frame(f).kind == FrameKind::Kernel)
        .unwrap_or(frames.len())
}

/// Whether a stack split at `split` gets a user/kernel delimiter: it needs kernel frames and
/// real user frames; a user side of markers only (e.g. `[Missed User Stack]`) is no user stack,
/// as in bcc, which delimits only stacks that have both.
pub(crate) fn delimited(profile: &Profile, frames: &[u32], split: usize) -> bool {
    split < frames.len()
        && frames[..split]
            .iter()
            .any(|&f| profile.frame(f).kind != FrameKind::Marker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        for format in Format::ALL {
            assert_eq!(Format::from_name(format.name()), Some(format));
        }
        assert_eq!(Format::from_name("collapsed"), Some(Format::Folded));
        assert_eq!(Format::from_name("flamegraph"), Some(Format::Svg));
        assert_eq!(Format::from_name("SVG"), Some(Format::Svg));
        assert_eq!(Format::from_name("perf"), None);
    }

    #[test]
    fn extensions() {
        let f = |p: &str| Format::from_path(Path::new(p));
        assert_eq!(f("out.svg"), Some(Format::Svg));
        assert_eq!(f("a/b.folded"), Some(Format::Folded));
        assert_eq!(f("x.collapsed"), Some(Format::Folded));
        assert_eq!(f("x.stacks"), Some(Format::Folded));
        assert_eq!(f("x.JSON"), Some(Format::Json));
        assert_eq!(f("profile.txt"), Some(Format::Bcc));
        assert_eq!(f("profile"), None);
        assert_eq!(f("profile.data"), None);
        assert_eq!(f("prof.pb.gz"), Some(Format::Pprof));
        assert_eq!(f("cpu.pprof"), Some(Format::Pprof));
        assert_eq!(f("x.gz"), None);
        // The double extensions win over plain `.json`.
        assert_eq!(f("prof.speedscope.json"), Some(Format::Speedscope));
        assert_eq!(f("dir.json/prof.Firefox.JSON"), Some(Format::Firefox));
        assert_eq!(f("speedscope.json"), Some(Format::Json));
        assert_eq!(f("guest.osdk.json"), Some(Format::Osdk));
        assert_eq!(f("out.perf-script"), Some(Format::PerfScript));
        assert_eq!(f("out.dtrace"), Some(Format::Dtrace));
        assert_eq!(f(".svg"), None);
    }

    #[test]
    fn every_format_has_a_name_and_a_default_file() {
        // Each name reads back as its own format: `names_and_aliases`.
        for format in Format::ALL {
            if format == Format::Top {
                // Made for a terminal: standard output unless told, and no file ending.
                assert_eq!(format.default_file(), "-");
                continue;
            }
            // Every default file name says its format, and every format has an ending.
            let guessed = Format::from_path(Path::new(format.default_file()));
            assert_eq!(guessed, Some(format), "{format}");
            assert!(
                Format::EXTENSIONS.iter().any(|&(_, f)| f == format),
                "{format}"
            );
        }
        assert_eq!(Format::from_name("firefox-profiler"), Some(Format::Firefox));
        assert_eq!(Format::from_name("Perf-Script"), Some(Format::PerfScript));
    }
}
