//! Errors of the symbolizer: only failures that make a whole file unusable.

use std::io;
use std::path::PathBuf;

/// A file that cannot be symbolized at all. Per-address failures are not errors; they give an
/// empty frame list instead.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The file cannot be opened or read.
    #[error(
        "cannot read {}: {error} (if the binary belonged to a process that has exited or lives \
         in another mount namespace, pass /proc/PID/root/... or /proc/PID/map_files/... \
         while the process is alive)",
        path.display()
    )]
    Read { path: PathBuf, error: io::Error },
    /// The file starts with neither the ELF magic nor a PE image's.
    #[error("{} is not an ELF file or a PE image; only those can be symbolized", path.display())]
    NotElf { path: PathBuf },
    /// The file looks like ELF (or PE) but its headers cannot be parsed.
    #[error("cannot parse {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}
