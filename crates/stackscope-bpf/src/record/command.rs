//! The launched command: spawned held before exec, then let go at once while a lead-in
//! samples it, or stopped right after exec until its tables are in; reaped at the end.

use std::io;
use std::os::unix::process::ExitStatusExt;

use stackscope_process::target::{HeldChild, Target};

use super::lead_in::{self, LeadIn};
use super::BpfConfig;
use crate::error::BpfError;
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::ProfileSkel;

/// Spawns a launched command held before exec (none for another target). A `lead_in` that
/// begins sampling it (the timer alone counted, user stacks wanted) is kept: the command is
/// then announced (`on_start`) and let go into exec at once.
pub(super) fn launch<'a>(
    config: &BpfConfig,
    plan: &Plan,
    lead_in: Option<&'a mut dyn LeadIn>,
    on_start: &mut Option<impl FnOnce()>,
) -> Result<(Option<HeldChild>, Option<&'a mut dyn LeadIn>), BpfError> {
    let mut child = match &config.target {
        Target::Command(argv) => HeldChild::spawn(argv)?,
        _ => return Ok((None, None)),
    };
    let lead_in = match lead_in {
        Some(lead) if plan.only_timer() && config.user => lead.begin(child.pid).then_some(lead),
        _ => None,
    };
    if lead_in.is_some() {
        if let Some(announce) = on_start.take() {
            announce();
        }
        child.release()?;
    }
    Ok((Some(child), lead_in))
}

/// Lets the command run on: the lead-in hands over to the program, or, without one, the
/// command is let go into exec and held there until its tables are in.
pub(super) fn start(
    child: &mut HeldChild,
    lead_in: Option<&mut (dyn LeadIn + '_)>,
    skel: &mut ProfileSkel<'_>,
    processes: &mut Processes,
    user: bool,
) -> Result<(), BpfError> {
    match lead_in {
        Some(lead) => lead_in::hand_over(skel, lead, processes, child.pid),
        None => start_held(child, skel, processes, user),
    }
}

/// Waits for a launched command, ending it first if it still runs; how it exited, when known.
pub(super) fn reap(child: &mut HeldChild, interrupted: bool) -> Option<std::process::ExitStatus> {
    if !child.wait(false) {
        child.end(interrupted, |child| child.wait(false));
    }
    child.status.map(std::process::ExitStatus::from_raw)
}

/// Lets a held command exec, stops it right after exec (ptrace) to load the tables of the
/// program and its dynamic loader, then lets it run. Libraries the loader maps later stop it
/// again at the loader's debugger hook (a uprobe), until their tables are in too.
fn start_held(
    child: &mut HeldChild,
    skel: &ProfileSkel<'_>,
    processes: &mut Processes,
    user: bool,
) -> Result<(), BpfError> {
    let pid = child.pid as i32;
    // SAFETY: plain ptrace on our own child, which is blocked on a pipe read before exec.
    let seized = user
        && unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                pid,
                0,
                (libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL) as libc::c_ulong,
            )
        } == 0;
    child.release()?;
    if !seized {
        return Ok(());
    }
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child's ptrace stop.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            break;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Ok(());
        }
    }
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        child.status = Some(status);
        return Ok(());
    }
    processes.load(skel, child.pid);
    // SAFETY: detaching our own stopped tracee; it resumes where it stopped.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
    Ok(())
}
