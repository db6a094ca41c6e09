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
    /// The file does not start with the ELF magic.
    #[error("{} is not an ELF file; only ELF binaries can be symbolized", path.display())]
    NotElf { path: PathBuf },
    /// The file looks like ELF but its headers cannot be parsed.
    #[error("cannot parse ELF file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}
