//! Choosing the output format and writing a profile where the user asked, through
//! [`crate::sink`], which never leaves a half-written file or a temporary behind.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::Profile;

use crate::cli::OutputArgs;
use crate::sink;

/// Where and how to write.
pub struct Output {
    pub path: PathBuf,
    pub format: Format,
    pub options: WriteOptions,
}

/// What a command writes when its flags do not say: where, in which format, under which
/// title; and a format its own flag prefers (`profile -f`) over the output's extension.
pub struct Fallback {
    pub format: Format,
    pub path: fn(Format) -> PathBuf,
    pub title: String,
    pub preferred: Option<Format>,
}

impl Fallback {
    /// Flame.svg, or stackscope.<ext> for another format.
    pub fn file(title: String) -> Fallback {
        Fallback {
            format: Format::Svg,
            path: |format| PathBuf::from(format.default_file()),
            title,
            preferred: None,
        }
    }
}

impl Output {
    /// The one place the output format is chosen: `--format`, else the format the command
    /// prefers, else the output's extension, else (no extension) the command's fallback. An
    /// extension that names no format stackscope writes (`.png`, `.html`) is refused rather
    /// than given a format its name does not say.
    pub fn from_args(args: &OutputArgs, fallback: Fallback) -> Result<Output> {
        let format = match (args.format.or(fallback.preferred), args.output.as_deref()) {
            (Some(format), _) => format,
            (None, Some(path)) => match (Format::from_path(path), path.extension()) {
                (Some(format), _) => format,
                (None, Some(extension)) => bail!(
                    "stackscope writes no .{} files: name the output {}, or give --format",
                    extension.to_string_lossy(),
                    known_extensions()
                ),
                (None, None) => fallback.format,
            },
            (None, None) => fallback.format,
        };
        let path = args
            .output
            .clone()
            .unwrap_or_else(|| (fallback.path)(format));
        Ok(Output {
            path,
            format,
            options: WriteOptions {
                delimiter: args.style.delimited,
                annotate_kernel: args.style.annotate_kernel,
                title: Some(args.style.title.clone().unwrap_or(fallback.title)),
            },
        })
    }

    /// The output as the line saying it was written names it: its path, and, where the name
    /// does not say the format (`perf.data` written by `stackscope-perf`), what the file holds
    /// and what reads it.
    pub fn written(&self) -> String {
        let path = self.path.display();
        if Format::from_path(&self.path) == Some(self.format) {
            return path.to_string();
        }
        match self.format {
            Format::Json => {
                // perf's tools take a file named as theirs for perf.data, and refuse this one.
                let perf_name = self.path.file_name().is_some_and(|name| {
                    let name = name.to_string_lossy();
                    name.starts_with("perf.data") || name.ends_with(".data")
                });
                let not_perf = if perf_name { ", not `perf report`" } else { "" };
                format!("{path} (stackscope JSON; read it with `stackscope report`{not_perf})")
            }
            format => format!("{path} ({format} format)"),
        }
    }

    pub fn is_stdout(&self) -> bool {
        self.path == Path::new("-")
    }

    /// Checks up front, by really creating (and removing) the temporary the profile will be
    /// written through, that the output can be written, so a long recording is not lost to
    /// a typo, a missing or read-only directory, or a directory named as the file.
    pub fn check_writable(&self) -> Result<()> {
        if self.is_stdout() {
            return Ok(());
        }
        sink::check(&self.path)
    }

    /// Writes the profile as [`crate::sink`] says: a regular file replaced whole, never left
    /// half-written; a device, FIFO or `/dev/stdout` written in place.
    pub fn write(&self, profile: &Profile) -> Result<()> {
        self.write_with(|out| format::write(profile, self.format, &self.options, out))
    }

    /// Writes what `body` writes to the output.
    pub fn write_with(
        &self,
        body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<()> {
        if self.is_stdout() {
            return to_stdout(body).context("cannot write the profile to standard output");
        }
        sink::write(&self.path, body)
    }
}

/// Writes what `body` writes to standard output, buffered. A reader that closed it early
/// (`| head`) ends the output quietly, as ripgrep does, and the command goes on to exit 0:
/// what it was asked for is in the reader's hands, and a pipeline under `pipefail` does not
/// fail for it.
pub fn to_stdout(body: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match body(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result,
    }
}

/// The endings the output's name may have, as a list for an error message.
fn known_extensions() -> String {
    let endings: Vec<&str> = Format::EXTENSIONS.iter().map(|&(e, _)| e).collect();
    endings.join(", ")
}
