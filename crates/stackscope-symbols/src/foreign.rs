//! The one opener of files that others name: the libraries a profiled process maps, the
//! debug files those name, a JIT's perf map and jitdump, what a perf.data or a GDB stub lists, a debuginfod
//! answer. Any local user can point a process at such a path, and stackscope often runs as
//! root, so every reader opens these files here and nowhere else:
//!
//! - without blocking (`O_NONBLOCK`): a FIFO or a device named where a file is expected is
//!   refused after `fstat` instead of hanging the open or reading forever;
//! - only regular files, and only up to a size that fits their [`Kind`] (each bound can be
//!   raised through the environment variable [`Kind::env`] names, in bytes or with a `K`, `M`
//!   or `G` suffix);
//! - through the kernel's own `open`, so its `protected_symlinks` rule applies to the links it
//!   follows (stackscope never resolves such a link itself before opening).
//!
//! A refusal is said once per path on stderr as a one-line warning naming the file and why,
//! and the reader goes on without it: a frame is then named by its module and address.
//!
//! Long reads of such files (a debug link's CRC, a decompression) also stop when the user
//! interrupts naming ([`crate::interrupt`]).

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What a file is expected to be, which sets how large it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A program, library, kernel image or separate debug file (ELF or PE), or a PDB: mapped,
    /// and read in full only to check a debug link's CRC.
    Binary,
    /// A JIT's `/tmp/perf-PID.map`: text, read into memory whole.
    PerfMap,
    /// A JIT's `jit-PID.dump`: records with the code's bytes, read into memory whole.
    JitDump,
    /// The decompressed MiniDebugInfo (`.gnu_debugdata`) of a binary: a symbol table.
    MiniDebugInfo,
}

impl Kind {
    /// The environment variable that replaces this kind's default bound.
    pub fn env(self) -> &'static str {
        match self {
            Kind::Binary => "STACKSCOPE_MAX_BINARY_SIZE",
            Kind::PerfMap => "STACKSCOPE_MAX_PERF_MAP_SIZE",
            Kind::JitDump => "STACKSCOPE_MAX_JITDUMP_SIZE",
            Kind::MiniDebugInfo => "STACKSCOPE_MAX_MINI_DEBUGINFO_SIZE",
        }
    }

    /// The largest file of this kind read by default: past what real ones reach (the largest
    /// debug files distributions ship are a few GiB; a busy JIT's perf map some hundred MiB,
    /// its jitdump, which holds the code too, some times that; MiniDebugInfo a few MiB), well
    /// short of what would fill memory or take minutes.
    pub fn default_bound(self) -> u64 {
        match self {
            Kind::Binary => 4 << 30,
            Kind::PerfMap => 256 << 20,
            Kind::JitDump => 1 << 30,
            Kind::MiniDebugInfo => 256 << 20,
        }
    }

    /// The bound in force: the environment's, else the default.
    pub fn bound(self) -> u64 {
        std::env::var(self.env())
            .ok()
            .and_then(|value| parse_size(&value))
            .unwrap_or_else(|| self.default_bound())
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Binary => "binary",
            Kind::PerfMap => "perf map",
            Kind::JitDump => "jitdump",
            Kind::MiniDebugInfo => "MiniDebugInfo",
        }
    }
}

/// `1234`, `64K`, `256M`, `4G` (powers of 1024); `None` for anything else.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 10),
        b'm' | b'M' => (&text[..text.len() - 1], 20),
        b'g' | b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: u64 = digits.trim().parse().ok()?;
    value.checked_mul(1u64 << shift)
}

/// Why a file others named was not read.
#[derive(Debug)]
pub enum Refusal {
    /// It could not be opened or examined.
    Io(io::Error),
    /// It is not a regular file: a FIFO, a device, a socket, a directory.
    NotRegular(&'static str),
    /// It is larger than its kind's bound.
    TooLarge { size: u64, kind: Kind },
    /// The user interrupted naming while it was read.
    Interrupted,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Io(error) => write!(f, "{error}"),
            Refusal::NotRegular(what) => write!(f, "{what}, not a regular file"),
            Refusal::TooLarge { size, kind } => write!(
                f,
                "{size} bytes, more than the {} bytes a {} may take (set {} to allow more)",
                kind.bound(),
                kind.noun(),
                kind.env()
            ),
            Refusal::Interrupted => write!(f, "interrupted"),
        }
    }
}

impl std::error::Error for Refusal {}

impl From<Refusal> for io::Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Io(error) => error,
            Refusal::Interrupted => io::Error::new(io::ErrorKind::Interrupted, refusal),
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}

/// Opens the file at `path`, which others named, for reading as a `kind`: a regular file no
/// larger than the kind's bound, opened without waiting on a FIFO's writer or a device. A
/// refusal of what exists is warned about once (a missing file, the common case, is not).
pub fn open(path: &Path, kind: Kind) -> Result<File, Refusal> {
    let result = open_quietly(path, kind);
    if let Err(refusal) = &result {
        if !matches!(refusal, Refusal::Io(e) if e.kind() == io::ErrorKind::NotFound) {
            warn(path, refusal);
        }
    }
    result
}

/// [`open`] without the warning, for callers that try several places and say once what they
/// found.
pub fn open_quietly(path: &Path, kind: Kind) -> Result<File, Refusal> {
    let file = open_nonblocking(path).map_err(Refusal::Io)?;
    let meta = file.metadata().map_err(Refusal::Io)?;
    if !meta.is_file() {
        return Err(Refusal::NotRegular(file_type_name(&meta)));
    }
    if meta.len() > kind.bound() {
        return Err(Refusal::TooLarge {
            size: meta.len(),
            kind,
        });
    }
    Ok(file)
}

/// Reads all of the file at `path` (which others named) as a `kind`, no more than its bound
/// even if it grows while read.
pub fn read(path: &Path, kind: Kind) -> Result<Vec<u8>, Refusal> {
    let file = open(path, kind)?;
    let bound = kind.bound();
    let mut bytes = Vec::new();
    file.take(bound.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Refusal::Io)?;
    if bytes.len() as u64 > bound {
        let refusal = Refusal::TooLarge {
            size: bytes.len() as u64,
            kind,
        };
        warn(path, &refusal);
        return Err(refusal);
    }
    Ok(bytes)
}

/// The path by which a library that takes paths (blazesym) opens `file` again: the same open
/// file, so whatever replaces the path after [`open`] checked it is not what gets read.
#[cfg(target_os = "linux")]
pub fn reopen_path(file: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Files checked by debug-file lookups whose build-id (or debug-link CRC) did not match, so far.
static MISMATCHED: AtomicU64 = AtomicU64::new(0);

/// Counts a debug file found where a binary's build-id or debug link points whose own build-id
/// or CRC differs (a file of another build), warned about once per path and left alone.
pub fn mismatched(path: &Path, what: &str) {
    MISMATCHED.fetch_add(1, Ordering::Relaxed);
    say_once(path, || {
        format!("stackscope: warning: left {} alone: {what}", path.display())
    });
}

/// How many debug files were left alone because they belong to another build.
pub fn mismatched_count() -> u64 {
    MISMATCHED.load(Ordering::Relaxed)
}

/// Says once per path that `path` was refused, and why.
pub fn warn(path: &Path, refusal: &Refusal) {
    say_once(path, || {
        format!(
            "stackscope: warning: left {} unread: {refusal}",
            path.display()
        )
    });
}

fn say_once(path: &Path, line: impl FnOnce() -> String) {
    static SAID: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(path.to_path_buf())
    {
        // A path may hold any byte but `/` and NUL: none of it may act on the terminal.
        eprintln!("{}", stackscope_profile::printable(&line()));
    }
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    // Regular files ignore O_NONBLOCK, but it is taken off so that nothing later depends on it.
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// Off Unix, opening a named pipe or device by a path that names a file does not happen by
/// accident; the type check after it still refuses them.
#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// What kind of file `meta` describes, with its article, as messages name it: `a FIFO`, `a
/// regular file`.
#[cfg(unix)]
pub fn file_type_name(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_file() {
        "a regular file"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

#[cfg(not(unix))]
pub fn file_type_name(meta: &std::fs::Metadata) -> &'static str {
    if meta.is_file() {
        "a regular file"
    } else if meta.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size(" 256m "), Some(256 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999G"), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        match open_quietly(&fifo, Kind::PerfMap) {
            Err(Refusal::NotRegular("a FIFO")) => {}
            other => panic!("{other:?}"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_refused() {
        match open_quietly(Path::new("/dev/zero"), Kind::PerfMap) {
            Err(Refusal::NotRegular("a character device")) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_file_past_its_kinds_bound_is_refused_by_its_size_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        file.set_len(Kind::PerfMap.default_bound() + 1).unwrap();
        match open_quietly(&path, Kind::PerfMap) {
            Err(Refusal::TooLarge { size, .. }) => {
                assert_eq!(size, Kind::PerfMap.default_bound() + 1)
            }
            other => panic!("{other:?}"),
        }
        assert!(open_quietly(&path, Kind::Binary).is_ok());
    }
}
