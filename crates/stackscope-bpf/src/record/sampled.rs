//! What the kernel is asked to sample, checked before anything is loaded: the ids the program
//! filters for and the processes whose tables it follows, and the caller's pid namespace the
//! program reports pids in. (The CPUs are chosen, and the rate checked, as the perf_event
//! source does.)

use stackscope_process::target::{self, Target};
use stackscope_process::SampleError;

use crate::program::Filter;

/// Refuses a frame limit the walk cannot keep.
pub(super) fn check_max_frames(frames: u32) -> Result<(), SampleError> {
    let max = stackscope_stacks::walk::MAX_FRAMES;
    if frames == 0 || frames as usize > max {
        return Err(SampleError::InvalidConfig(format!(
            "the stack frame limit {frames} must be between 1 and {max}"
        )));
    }
    Ok(())
}

/// The ids the program keeps samples of, and the processes whose execs, loads and tables it
/// follows from the start (a launched command is added once spawned).
pub(super) struct Targets {
    pub filter: Filter,
    pub filter_ids: Vec<u32>,
    pub followed_procs: Vec<u32>,
}

/// Checks the targets exist before anything is loaded.
pub(super) fn resolve(target: &Target) -> Result<Targets, SampleError> {
    let (filter, filter_ids, followed_procs) = match target {
        Target::Command(_) => (Filter::Pids, Vec::new(), Vec::new()),
        Target::Pids(pids) => {
            for &pid in pids {
                if !target::is_alive(pid) {
                    return Err(SampleError::NoSuchProcess(pid));
                }
            }
            (Filter::Pids, pids.clone(), pids.clone())
        }
        Target::Tids(tids) => {
            let mut owners = Vec::new();
            for &tid in tids {
                match target::process_of(tid) {
                    Ok(pid) if target::is_alive(tid) => owners.push(pid),
                    _ => return Err(SampleError::NoSuchThread(tid)),
                }
            }
            owners.sort_unstable();
            owners.dedup();
            (Filter::Tids, tids.clone(), owners)
        }
        Target::System => (Filter::None, Vec::new(), Vec::new()),
    };
    Ok(Targets {
        filter,
        filter_ids,
        followed_procs,
    })
}

/// The caller's pid namespace as the kernel's pid helper wants it, unless it is the initial
/// one (where every pid is already what the caller sees, and no translation is needed).
pub(crate) fn caller_pid_namespace() -> Option<(u64, u64)> {
    /// PROC_PID_INIT_INO: the inode number of the initial pid namespace.
    const INIT_PID_NS: u64 = 0xEFFF_FFFC;
    let meta = std::fs::metadata("/proc/self/ns/pid").ok()?;
    use std::os::unix::fs::MetadataExt;
    if meta.ino() == INIT_PID_NS {
        return None;
    }
    // The kernel compares against its own dev_t encoding: major << 20 | minor.
    let dev = meta.dev();
    let kernel_dev = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
    Some((kernel_dev, meta.ino()))
}
