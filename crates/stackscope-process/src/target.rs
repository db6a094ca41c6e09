//! What to sample — a command to launch, running processes, single threads, or the whole
//! machine — and the process plumbing behind it: finding threads and names in `/proc`, and
//! launching a command held before `exec` until its events are open.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::SampleError;

/// What to sample; the perf source follows a launched command or attached process into
/// every child it forks or execs (inherit=1), and `Tids` without inherit.
pub use stackscope_stacks::Target;

/// Thread ids of a process, from `/proc/PID/task`.
pub fn threads_of(pid: u32) -> io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Every process id in `/proc`.
pub fn all_pids() -> io::Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The name of a thread, from `/proc/PID/task/TID/comm`.
pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    let name = raw.strip_suffix(b"\n").unwrap_or(&raw);
    Some(String::from_utf8_lossy(name).into_owned())
}

/// The process a thread belongs to (`Tgid:` in `/proc/TID/status`).
pub fn process_of(tid: u32) -> io::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Tgid line"))
}

/// True while a process or thread exists and has not exited (zombies count as exited).
pub fn is_alive(id: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{id}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain anything.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X') | Some('x'))
}

/// The live processes `pid` started, and those they started, from each process's parent in
/// `/proc/PID/stat`. A process that forks meanwhile may have children this misses: a caller
/// that must see every one follows forks from before it asks.
pub fn descendants_of(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| Some((p, parent_of(p)?)))
        .collect();
    let mut found = vec![pid];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        next += 1;
        let children = parents.iter().filter(|&&(_, pp)| pp == parent);
        found.extend(children.map(|&(p, _)| p).filter(|&p| is_alive(p)));
    }
    found.remove(0);
    found
}

/// A process's parent (`/proc/PID/stat`'s fourth field, after the parenthesized name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Resolves argv[0] the way a shell does: as a path if it contains a slash, else through PATH.
pub fn resolve_command(name: &OsStr) -> Result<PathBuf, SampleError> {
    let shown = name.to_string_lossy().into_owned();
    if name.as_bytes().contains(&b'/') {
        // Said before anything is loaded or announced; exec tells the rarer failures.
        if std::fs::metadata(name).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            return Err(SampleError::CommandNotFound(shown));
        }
        return Ok(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut not_executable = None;
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(name);
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if meta.permissions().mode() & 0o111 != 0 {
            return Ok(candidate);
        }
        not_executable.get_or_insert(candidate);
    }
    match not_executable {
        Some(p) => Err(SampleError::NotExecutable(p.display().to_string())),
        None => Err(SampleError::CommandNotFound(shown)),
    }
}

/// Why executing `path` would change the privileges of this process, if it would: the kernel
/// then removes the process's perf events at that exec ("disable monitoring for regular users
/// when executing setuid binaries", in `begin_new_exec`), so a launched command gives no
/// samples. That happens when the exec leaves the effective user or group different from the
/// real one (a setuid or setgid file of another owner), when file capabilities grant more
/// than this process holds, and when the file cannot be read (the process is then made
/// non-dumpable). None for an ordinary program, or when no_new_privs or a nosuid mount makes
/// the kernel ignore the bits.
pub fn privileged_exec(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if no_new_privs() || nosuid_mount(path) {
        return None;
    }
    // SAFETY: these have no preconditions.
    let (ruid, euid, rgid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    let mode = meta.mode();
    let new_euid = if mode & libc::S_ISUID != 0 {
        meta.uid()
    } else {
        euid
    };
    // A setgid bit without group execute marks mandatory locking, not a group change.
    let new_egid = if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        meta.gid()
    } else {
        egid
    };
    if new_euid != ruid {
        return Some(format!("is setuid to uid {}", meta.uid()));
    }
    if new_egid != rgid {
        return Some(format!("is setgid to gid {}", meta.gid()));
    }
    if has_file_capabilities(path) && !holds_all_capabilities() {
        return Some("has file capabilities".to_string());
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid C string, only read.
    if unsafe { libc::access(c_path.as_ptr(), libc::R_OK) } != 0 {
        return Some("is not readable by this user".to_string());
    }
    None
}

/// A `Cap...:` line of /proc/self/status, as a bit set.
pub fn own_capabilities(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

fn holds_all_capabilities() -> bool {
    // CAP_SETFCAP (31) and below, in the permitted set: what any file capability can grant.
    own_capabilities("CapPrm").is_some_and(|caps| caps & 0xffff_ffff == 0xffff_ffff)
}

fn no_new_privs() -> bool {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer.
    unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 }
}

fn nosuid_mount(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs fills the zeroed struct from a valid C string.
    unsafe {
        let mut fs: libc::statvfs = std::mem::zeroed();
        libc::statvfs(c_path.as_ptr(), &mut fs) == 0 && fs.f_flag & libc::ST_NOSUID != 0
    }
}

fn has_file_capabilities(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a size query (null buffer of length 0) on a valid C string.
    unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        ) > 0
    }
}

fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A forked child that waits for a byte on a pipe before it execs the command. An exec failure
/// comes back as the errno on a close-on-exec pipe, which simply closes when exec succeeds.
#[derive(Debug)]
pub struct HeldChild {
    pub pid: u32,
    command: String,
    go: Option<OwnedFd>,
    exec_error: Option<OwnedFd>,
    /// Raw wait status once reaped.
    pub status: Option<i32>,
}

impl HeldChild {
    pub fn spawn(argv: &[OsString]) -> Result<HeldChild, SampleError> {
        let Some(first) = argv.first() else {
            return Err(SampleError::EmptyCommand);
        };
        let command = first.to_string_lossy().into_owned();
        let path = resolve_command(first)?;
        let launch_err = |source| SampleError::Launch {
            command: command.clone(),
            source,
        };
        // Everything the child needs is prepared here: after fork it may only make raw syscalls.
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            launch_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "command contains a NUL byte",
            ))
        })?;
        let c_args = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                launch_err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an argument contains a NUL byte",
                ))
            })?;
        let mut arg_ptrs: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        arg_ptrs.push(std::ptr::null());

        let (go_read, go_write) = cloexec_pipe().map_err(launch_err)?;
        let (err_read, err_write) = cloexec_pipe().map_err(launch_err)?;

        // SAFETY: the child only calls async-signal-safe functions (close, read, execv, write,
        // _exit) on data prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(launch_err(io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: see above; this branch never returns.
            unsafe {
                libc::close(go_write.as_raw_fd());
                libc::close(err_read.as_raw_fd());
                let mut byte = 0u8;
                loop {
                    let n = libc::read(
                        go_read.as_raw_fd(),
                        &mut byte as *mut u8 as *mut libc::c_void,
                        1,
                    );
                    if n == 1 {
                        break;
                    }
                    // EOF: the profiler gave up before starting us.
                    if n == 0 || *libc::__errno_location() != libc::EINTR {
                        libc::_exit(127);
                    }
                }
                libc::execv(c_path.as_ptr(), arg_ptrs.as_ptr());
                let errno: i32 = *libc::__errno_location();
                libc::write(
                    err_write.as_raw_fd(),
                    &errno as *const i32 as *const libc::c_void,
                    4,
                );
                libc::_exit(127);
            }
        }
        drop(go_read);
        drop(err_write);
        Ok(HeldChild {
            pid: pid as u32,
            command,
            go: Some(go_write),
            exec_error: Some(err_read),
            status: None,
        })
    }

    /// Lets the child exec and waits until it has (or until the exec failed).
    pub fn release(&mut self) -> Result<(), SampleError> {
        let Some(go) = self.go.take() else {
            return Ok(());
        };
        let byte = 1u8;
        // SAFETY: writing one byte from a local to a pipe we own. If the child is already gone
        // this fails with EPIPE, and the exec-error pipe below then reads EOF; waitpid tells.
        unsafe { libc::write(go.as_raw_fd(), &byte as *const u8 as *const libc::c_void, 1) };
        drop(go);
        let Some(err) = self.exec_error.take() else {
            return Ok(());
        };
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            // SAFETY: reading into the unfilled part of a local buffer.
            let n = unsafe {
                libc::read(
                    err.as_raw_fd(),
                    buf[got..].as_mut_ptr() as *mut libc::c_void,
                    4 - got,
                )
            };
            if n > 0 {
                got += n as usize;
            } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        if got < 4 {
            return Ok(());
        }
        let errno = i32::from_ne_bytes(buf);
        self.wait(true);
        Err(match errno {
            libc::ENOENT => SampleError::CommandNotFound(self.command.clone()),
            libc::EACCES => SampleError::NotExecutable(self.command.clone()),
            _ => SampleError::Exec {
                command: self.command.clone(),
                source: io::Error::from_raw_os_error(errno),
            },
        })
    }

    /// Reaps the child if it has exited (or waits for it when `block`). True once reaped.
    pub fn wait(&mut self, block: bool) -> bool {
        if self.status.is_some() {
            return true;
        }
        let mut status = 0;
        loop {
            let flags = if block { 0 } else { libc::WNOHANG };
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, flags) };
            if r == self.pid as i32 {
                self.status = Some(status);
                return true;
            }
            if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if r < 0 {
                // ECHILD: somebody else reaped it; it is gone either way.
                self.status.get_or_insert(0);
                return true;
            }
            return false;
        }
    }

    /// Ends the command when recording stops while it still runs: SIGINT after Ctrl-C (when
    /// the terminal did not already deliver it), SIGTERM after the duration, SIGKILL if it has
    /// not gone two seconds later. `gone` tells when to stop waiting: once the child is reaped
    /// (`wait(false)`), and whatever else the caller waits for.
    pub fn end(&mut self, interrupted: bool, mut gone: impl FnMut(&mut HeldChild) -> bool) {
        let first = if interrupted {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        for (signal, grace) in [(first, 2000), (libc::SIGKILL, 1000)] {
            self.kill(signal);
            let until = Instant::now() + Duration::from_millis(grace);
            while Instant::now() < until {
                if gone(self) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    pub fn kill(&self, signal: i32) {
        if self.status.is_none() {
            // SAFETY: signalling our own, not yet reaped, child (its pid cannot be reused).
            unsafe { libc::kill(self.pid as i32, signal) };
        }
    }
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        // A child still held before exec exits when its pipe closes; reap it so no zombie stays.
        if self.go.take().is_some() {
            self.exec_error.take();
            self.wait(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shells_child_and_grandchild_are_its_descendants() {
        // sh starts a second sh, which starts sleep: both are found, and nothing else.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 5; true' & wait"])
            .spawn()
            .unwrap();
        let pid = shell.id();
        // Wait until the grandchild has exec'd sleep: until then it is a second copy of sh.
        let deadline = Instant::now() + Duration::from_secs(10);
        let look = || {
            let found = descendants_of(pid);
            let comms: Vec<String> = found.iter().filter_map(|&p| thread_comm(p, p)).collect();
            (found, comms)
        };
        let (mut found, mut comms) = look();
        while !(found.len() >= 2 && comms.iter().any(|c| c == "sleep")) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
            (found, comms) = look();
        }
        let _ = shell.kill();
        for p in &found {
            let _ = std::process::Command::new("kill")
                .arg(p.to_string())
                .status();
        }
        let _ = shell.wait();
        assert_eq!(found.len(), 2, "{comms:?}");
        assert!(comms.iter().any(|c| c == "sleep"), "{comms:?}");
    }

    #[test]
    fn resolves_commands_through_path() {
        let sh = resolve_command(OsStr::new("sh")).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        let err = resolve_command(OsStr::new("stackscope-no-such-command")).unwrap_err();
        assert_eq!(
            err.to_string()
                .split(' ')
                .take(4)
                .collect::<Vec<_>>()
                .join(" "),
            "command not found: stackscope-no-such-command"
        );
    }

    #[test]
    fn own_process_is_alive_and_bogus_pid_is_not() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX - 1));
        let me = std::process::id();
        assert!(threads_of(me).unwrap().contains(&me));
        assert_eq!(process_of(me).unwrap(), me);
    }
}
