//! Choosing the output format and writing a profile to its file without ever leaving a
//! half-written or empty file behind.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::Profile;

use crate::cli::OutputArgs;

/// Where and how to write.
pub struct Output {
    pub path: PathBuf,
    pub format: Format,
    pub options: WriteOptions,
}

impl Output {
    pub fn from_args(args: &OutputArgs, default_title: String) -> Output {
        let format = args
            .format
            .or_else(|| args.output.as_deref().and_then(Format::from_path))
            .unwrap_or(Format::Svg);
        let path = args
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(format.default_file()));
        Output {
            path,
            format,
            options: WriteOptions {
                delimiter: args.style.delimited,
                annotate_kernel: args.style.annotate_kernel,
                title: Some(args.style.title.clone().unwrap_or(default_title)),
            },
        }
    }

    pub fn is_stdout(&self) -> bool {
        self.path == Path::new("-")
    }

    /// Checks up front that the file can be created, so a long recording is not lost to a
    /// typo in the output path.
    pub fn check_writable(&self) -> Result<()> {
        if self.is_stdout() {
            return Ok(());
        }
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            bail!(
                "cannot write {}: directory {} does not exist",
                self.path.display(),
                dir.display()
            );
        }
        if self.path.is_dir() {
            bail!("cannot write {}: it is a directory", self.path.display());
        }
        Ok(())
    }

    /// Writes the profile: to a temporary file beside the target, renamed into place once
    /// complete, so a failure never leaves a truncated file under the requested name.
    pub fn write(&self, profile: &Profile) -> Result<()> {
        if self.is_stdout() {
            let stdout = std::io::stdout();
            let mut out = BufWriter::new(stdout.lock());
            format::write(profile, self.format, &self.options, &mut out)
                .and_then(|()| out.flush())
                .context("cannot write the profile to standard output")?;
            return Ok(());
        }
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let result = (|| -> std::io::Result<()> {
            let mut out = BufWriter::new(File::create(&tmp)?);
            format::write(profile, self.format, &self.options, &mut out)?;
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("cannot write {}", self.path.display()));
        }
        Ok(())
    }
}
