//! What a source tells the collector, in time order: samples with their stacks, and the task
//! and mapping records needed to know what each process had mapped. The live rings decode
//! into these, `/proc` is read into them for tasks that ran before sampling began, and a
//! perf.data file is replayed as them.

use stackscope_process::maps::Mapping;

/// User registers at the time of a sample (DWARF mode). On aarch64 `bp` is x29 and `ip` is pc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One sample.
#[derive(Debug, Clone, Copy)]
pub struct SampleEvent<'a> {
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// Kernel perf clock, in nanoseconds.
    pub time: u64,
    /// CPU time this sample stands for, in nanoseconds.
    pub period: u64,
    /// Kernel frames, leaf first, PERF_CONTEXT_* markers removed. Empty when none.
    pub kernel_stack: &'a [u64],
    /// FramePointer mode: user frames from the kernel callchain, leaf first. Empty in Dwarf mode.
    pub user_callchain: &'a [u64],
    /// Dwarf mode: sampled user registers, None when the sample hit a kernel thread.
    pub user_regs: Option<UserRegs>,
    /// Dwarf mode: the copied user stack, starting at regs.sp (dyn_size bytes, may be empty).
    pub user_stack: &'a [u8],
    /// True if the sample was taken while the CPU was in user mode (PERF_RECORD_MISC_USER).
    pub in_user: bool,
}

/// Something the kernel told us, in time order within one `poll` batch.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    Sample(SampleEvent<'a>),
    /// A new executable mapping (PERF_RECORD_MMAP2 with PROT_EXEC, or synthesized from
    /// /proc/PID/maps for processes that existed before sampling began).
    Mmap {
        pid: u32,
        tid: u32,
        mapping: Mapping,
    },
    /// A thread got a (new) name; `exec` is true when it came from exec (the process's maps are
    /// then replaced: the consumer clears them). Also synthesized for pre-existing processes.
    Comm {
        pid: u32,
        tid: u32,
        comm: &'a str,
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    Exit {
        pid: u32,
        tid: u32,
    },
    /// PERF_RECORD_LOST: this many samples were dropped by the kernel.
    Lost {
        count: u64,
    },
}
