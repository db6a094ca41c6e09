//! Waking on time on a busy host: the sampler sleeps between rounds and waits for the stub
//! within them, and on a host whose CPUs run the guest's vCPU threads flat out, a waking
//! sampler that does not preempt one waits out the rest of its time slice (milliseconds),
//! the guest stopped meanwhile when that wait is within a round.

/// The calling thread's slice as it was before [`ask_for_short_slices`], to give back.
pub(super) struct Slice(#[cfg_attr(not(target_os = "linux"), allow(dead_code))] Option<u64>);

/// Asks the scheduler for short time slices for the calling thread (Linux 6.12 and later:
/// `sched_runtime` of a normal thread is its slice, and a thread with a shorter slice
/// preempts on wakeup). Nice, policy and priority stay as they are, and no privilege is
/// needed; a kernel that does not take it leaves the thread as it was.
#[cfg(target_os = "linux")]
pub(super) fn ask_for_short_slices() -> Slice {
    /// The shortest slice the kernel grants.
    const SLICE_NS: u64 = 100_000;
    let Some(mut attr) = attr() else {
        return Slice(None);
    };
    if attr.policy != libc::SCHED_OTHER as u32 {
        return Slice(None);
    }
    let before = attr.runtime;
    attr.runtime = SLICE_NS;
    attr.flags = 0;
    Slice(set_attr(&attr).then_some(before))
}

#[cfg(not(target_os = "linux"))]
pub(super) fn ask_for_short_slices() -> Slice {
    Slice(None)
}

impl Drop for Slice {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let (Some(before), Some(mut attr)) = (self.0, attr()) {
            attr.runtime = before;
            attr.flags = 0;
            set_attr(&attr);
        }
    }
}

/// `struct sched_attr` as of Linux 5.3.
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The calling thread's scheduling attributes.
#[cfg(target_os = "linux")]
fn attr() -> Option<SchedAttr> {
    let size = std::mem::size_of::<SchedAttr>() as u32;
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr fills at most `size` bytes of the struct it is given, for the
    // calling thread (0).
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) };
    (got == 0).then_some(SchedAttr { size, ..attr })
}

#[cfg(target_os = "linux")]
fn set_attr(attr: &SchedAttr) -> bool {
    // SAFETY: the struct is a whole sched_attr of the size it states, only read by the kernel.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, attr as *const SchedAttr, 0) == 0 }
}
