//! Where an output file's bytes go, and how they get there without harm.
//!
//! A regular file, or a name not in use, is written whole to a temporary created exclusively
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, an unpredictable name) in the same directory, synced, and
//! renamed over the name: a reader sees the old file or the new one, never half of one, and a
//! link or file someone planted at a predictable name is never followed. Anything else (a
//! device such as `/dev/null`, a FIFO, a terminal, `/dev/stdout`) is opened and written in
//! place, never replaced. A symbolic link is never replaced either: a link to a regular file
//! has that file replaced as above (the link stays); a link to anything else is written
//! through; a link to nothing is refused, so no file is created where a link points.
//!
//! Since links are followed here and a file is replaced by rename, the kernel's protections of
//! sticky world-writable directories such as `/tmp` are applied here too ([`protected`]): a
//! link there is not followed, nor a file or FIFO there written, where the kernel would refuse
//! this user's `open(O_CREAT)` by `fs.protected_symlinks`, `fs.protected_regular` or
//! `fs.protected_fifos`.
//!
//! The temporary is removed when writing fails and when SIGINT, SIGTERM or SIGHUP arrives
//! while it exists (then the signal's default action ends the process).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};

use anyhow::{bail, Context, Result};

mod protected;

use protected::Protections;

/// How a path is written.
enum Target {
    /// A regular file or an unused name: through a temporary renamed onto `file` (the end of
    /// any chain of links).
    Replace { file: PathBuf },
    /// A device, FIFO, socket, or a process's open file reached through `/proc/PID/fd`: opened
    /// as it is; `append` for a regular file reached that way (a shell's `>` or `>>` target).
    InPlace { append: bool },
}

/// Links followed before giving up, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// Decides how `path` is written, following links one at a time, as the kernel would for this
/// user.
fn resolve(path: &Path) -> Result<Target> {
    let protections = Protections::of_this_kernel();
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let meta = match std::fs::symlink_metadata(&current) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound && current == path => {
                return Ok(Target::Replace { file: current });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
                "cannot write {}: it is a symbolic link to {}, which does not exist (stackscope \
                 does not create files where a link points)",
                path.display(),
                current.display()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot write {}", path.display()));
            }
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            protections.check_follow(path, &current, &meta)?;
            if in_proc(&current) {
                // /proc/PID/fd/N names an open file, which its link text only describes.
                let meta = std::fs::metadata(path)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                if meta.is_dir() {
                    bail!("cannot write {}: it is a directory", path.display());
                }
                return Ok(Target::InPlace {
                    append: meta.is_file(),
                });
            }
            let link = std::fs::read_link(&current)
                .with_context(|| format!("cannot write {}", path.display()))?;
            current = match current.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if kind.is_dir() {
            bail!("cannot write {}: it is a directory", path.display());
        }
        protections.check_create(path, &current, &meta)?;
        if kind.is_file() {
            return Ok(Target::Replace { file: current });
        }
        return Ok(Target::InPlace { append: false });
    }
    bail!(
        "cannot write {}: more than {MAX_LINKS} symbolic links in a chain",
        path.display()
    )
}

/// Whether `link` sits in /proc (as /dev/stdout's /proc/self/fd/1 does).
fn in_proc(link: &Path) -> bool {
    std::fs::canonicalize(directory_of(link)).is_ok_and(|dir| dir.starts_with("/proc"))
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks that `path` can be written by really trying: a temporary is created in its
/// directory and removed again, or, for what is written in place, write access is checked.
pub fn check(path: &Path) -> Result<()> {
    match resolve(path)? {
        Target::Replace { file } => {
            Temporary::create(&file).with_context(|| format!("cannot write {}", path.display()))?;
            Ok(())
        }
        Target::InPlace { .. } => {
            let c_path = CString::new(path.as_os_str().as_bytes())
                .with_context(|| format!("cannot write {}: a NUL in the name", path.display()))?;
            // SAFETY: a valid C string; faccessat only reads it.
            let rc = unsafe {
                libc::faccessat(
                    libc::AT_FDCWD,
                    c_path.as_ptr(),
                    libc::W_OK,
                    libc::AT_EACCESS,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error())
                    .with_context(|| format!("cannot write {}", path.display()));
            }
            Ok(())
        }
    }
}

/// Writes `path` with what `body` writes, as the module says.
pub fn write(path: &Path, body: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    let context = || format!("cannot write {}", path.display());
    match resolve(path)? {
        Target::Replace { file } => {
            let (temporary, handle) = Temporary::create(&file).with_context(context)?;
            let mut out = BufWriter::new(handle);
            body(&mut out).with_context(context)?;
            let handle = out
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(context)?;
            handle.sync_all().with_context(context)?;
            temporary.rename_onto(&file).with_context(context)
        }
        Target::InPlace { append } => {
            let handle = OpenOptions::new()
                .write(true)
                .append(append)
                .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
                .open(path)
                .with_context(context)?;
            // Between the look and the open the name may have become a regular file: never
            // overwrite one in place.
            let kind = handle.metadata().with_context(context)?.file_type();
            if kind.is_file() && !append {
                bail!(
                    "cannot write {}: it changed into a regular file while stackscope ran",
                    path.display()
                );
            }
            let mut out = BufWriter::new(handle);
            body(&mut out)
                .and_then(|()| out.flush())
                .with_context(context)?;
            if kind.is_block_device() || kind.is_file() {
                let _ = out.get_ref().sync_all();
            }
            Ok(())
        }
    }
}

/// The temporary being written, for the signal handler: a leaked C string, or null. Never
/// freed, so a handler running on another thread never reads freed memory.
static PENDING: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// At a stop signal that is not a copy of the one that stopped sampling
/// ([`crate::status`]): removes the temporary, says that nothing was written, then lets the
/// signal take its default action (restored here; the re-raised signal is delivered when the
/// handler returns). Only async-signal-safe calls.
extern "C" fn remove_pending(signal: libc::c_int) {
    if crate::status::is_copy_of_last_stop() {
        return;
    }
    let path = PENDING.swap(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: `path` is null or a leaked, never freed C string; unlink, write, sigaction and
    // raise are async-signal-safe.
    unsafe {
        if !path.is_null() {
            libc::unlink(path);
        }
        crate::status::say_from_handler(
            b"\nstackscope: stopped while writing the profile; nothing was written\n",
        );
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
        libc::raise(signal);
    }
}

/// An exclusively created temporary beside the file it will replace; removed unless renamed.
struct Temporary {
    path: PathBuf,
    /// Set once the file is renamed (or was never created): nothing to remove.
    gone: bool,
    /// The signal actions in place before, restored when the temporary is gone.
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Temporary {
    /// Creates `.NAME.RANDOM.tmp` beside `file`, retrying on the (unlikely) name in use.
    fn create(file: &Path) -> io::Result<(Temporary, File)> {
        let dir = directory_of(file);
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut last = None;
        for _ in 0..16 {
            let path = dir.join(format!(".{name}.{:016x}.tmp", unpredictable()));
            // Armed before the file exists, so no signal can leave it behind; the name is
            // unpredictable, so nothing else answers to it in the meantime.
            let temporary = Temporary::arm(path)?;
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o666)
                .open(&temporary.path)
            {
                Ok(handle) => return Ok((temporary, handle)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    temporary.disarm();
                    last = Some(e);
                }
                Err(e) => {
                    temporary.disarm();
                    return Err(with_directory(e, dir));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
    }

    /// Registers `path` for removal on an ending signal.
    fn arm(path: PathBuf) -> io::Result<Temporary> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
        PENDING.store(c_path.into_raw(), Ordering::SeqCst);
        let mut previous = Vec::new();
        for signal in crate::status::STOP_SIGNALS {
            // SAFETY: a zeroed sigaction is a valid value to fill in; the handler only makes
            // async-signal-safe calls.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = remove_pending as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, &action, &mut old) == 0 {
                    previous.push((signal, old));
                }
            }
        }
        Ok(Temporary {
            path,
            gone: false,
            previous,
        })
    }

    /// Forgets the temporary without removing anything (it was not created, or was renamed).
    fn disarm(mut self) {
        self.gone = true;
    }

    /// Stops the signal handler from touching the temporary and puts the old actions back.
    fn release(&mut self) {
        PENDING.store(std::ptr::null_mut(), Ordering::SeqCst);
        for (signal, old) in self.previous.drain(..) {
            // SAFETY: restores an action the kernel handed back.
            unsafe {
                libc::sigaction(signal, &old, std::ptr::null_mut());
            }
        }
    }

    /// Renames the temporary onto `file` and syncs the directory, so the new name survives
    /// a crash.
    fn rename_onto(self, file: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, file)?;
        self.disarm();
        if let Ok(dir) = File::open(directory_of(file)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if !self.gone {
            let _ = std::fs::remove_file(&self.path);
        }
        self.release();
    }
}

/// 64 bits no other process can guess: SipHash under the per-process random keys std seeds
/// from the operating system.
fn unpredictable() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(now);
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Names the directory in an error creating a file in it ("Permission denied" alone does not
/// say where).
fn with_directory(e: io::Error, dir: &Path) -> io::Error {
    let message = if e.kind() == io::ErrorKind::NotFound {
        format!("directory {} does not exist", dir.display())
    } else {
        format!("cannot create a file in {}: {e}", dir.display())
    };
    io::Error::new(e.kind(), message)
}
