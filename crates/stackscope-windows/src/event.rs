//! The kernel events the Windows source uses, decoded from their payload bytes as the classic
//! (MOF) kernel classes lay them out: PerfInfo's SampledProfile, StackWalk's Stack, Image
//! load/unload and its rundown, Process and Thread start/end and their rundown. Nothing here
//! calls Windows: the session hands over an event's header fields and payload, and tests hand
//! over bytes laid out the same way.

mod reader;

use std::fmt;

use reader::Reader;

/// The kernel providers (event classes) whose events are decoded, by GUID.
pub mod provider {
    pub const PERF_INFO: u128 = 0xce1dbfb4_137e_4da6_87b0_3f59aa102cbc;
    pub const STACK_WALK: u128 = 0xdef2fe46_7bd6_4b80_bd94_f57fe20d0ce3;
    pub const IMAGE: u128 = 0x2cb15d1d_5fc1_11d2_abe1_00a0c911f518;
    pub const PROCESS: u128 = 0x3d6fa8d0_fe05_11d0_9dda_00c04fd7ba7c;
    pub const THREAD: u128 = 0x3d6fa8d1_fe05_11d0_9dda_00c04fd7ba7c;
}

/// Event types (opcodes) within those providers.
pub mod opcode {
    /// Process, Thread: a process or thread started during the session.
    pub const START: u8 = 1;
    /// Process, Thread: it ended.
    pub const END: u8 = 2;
    /// Image: unloaded.
    pub const UNLOAD: u8 = 2;
    /// Process, Thread, Image: the rundown at the session's start, one event for each process,
    /// thread and image that already existed.
    pub const DC_START: u8 = 3;
    /// The same rundown at the session's end.
    pub const DC_END: u8 = 4;
    /// Image: loaded during the session.
    pub const LOAD: u8 = 10;
    /// StackWalk: the stack of the event with the same timestamp on the same thread.
    pub const STACK: u8 = 32;
    /// PerfInfo: the profile timer fired.
    pub const SAMPLED_PROFILE: u8 = 46;
}

/// Set in an address of kernel code (the upper half of the 64-bit address space).
pub const KERNEL_BIT: u64 = 1 << 63;

pub fn is_kernel(addr: u64) -> bool {
    addr & KERNEL_BIT != 0
}

/// What the session takes from an event's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub provider: u128,
    pub opcode: u8,
    pub version: u8,
    pub timestamp: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u16,
    /// 8 for a 64-bit kernel's events, 4 for a 32-bit one's.
    pub pointer_size: u8,
}

/// How a process, thread or image entered or left the session's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Started or loaded while the session ran.
    Start,
    /// Ended or unloaded.
    End,
    /// Existed when the session started (rundown).
    Existing,
    /// Still existed when the session stopped (rundown).
    Remaining,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The profile timer interrupted `tid` at `ip`.
    Sample {
        timestamp: u64,
        tid: u32,
        cpu: u16,
        ip: u64,
    },
    /// The stack (leaf first) of the event that `tid` logged at `timestamp`: kernel frames,
    /// user frames, or both.
    Stack {
        timestamp: u64,
        pid: u32,
        tid: u32,
        frames: Vec<u64>,
    },
    Image {
        change: Change,
        image: Image,
    },
    Process {
        change: Change,
        pid: u32,
        parent: u32,
        exit_status: i32,
        /// The executable's file name, e.g. `myprog.exe`.
        name: String,
    },
    Thread {
        change: Change,
        pid: u32,
        tid: u32,
    },
}

/// An executable image mapped into a process, or a kernel module (driver) when its base is
/// a kernel address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub pid: u32,
    pub base: u64,
    pub size: u64,
    /// The path as the kernel logs it, e.g. `\Device\HarddiskVolume3\Windows\System32\ntdll.dll`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ended before a field the event's class has.
    Short { event: &'static str, len: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short { event, len } => {
                write!(f, "{event} event's payload ends early ({len} bytes)")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one event; `Ok(None)` for events of other kinds.
pub fn decode(header: &Header, payload: &[u8]) -> Result<Option<Event>, DecodeError> {
    let pointer_size = usize::from(header.pointer_size);
    let reader = |what| Reader::new(payload, pointer_size, what);
    let event = match (header.provider, header.opcode) {
        (provider::PERF_INFO, opcode::SAMPLED_PROFILE) => {
            sampled_profile(header, reader("SampledProfile"))?
        }
        (provider::STACK_WALK, opcode::STACK) => stack(reader("StackWalk"))?,
        (provider::IMAGE, op) => match change(op, opcode::LOAD, opcode::UNLOAD) {
            Some(change) => Event::Image {
                change,
                image: image(reader("Image"))?,
            },
            None => return Ok(None),
        },
        (provider::PROCESS, op) => match change(op, opcode::START, opcode::END) {
            Some(change) => process(change, header.version, reader("Process"))?,
            None => return Ok(None),
        },
        (provider::THREAD, op) => match change(op, opcode::START, opcode::END) {
            Some(change) => {
                let mut r = reader("Thread");
                let pid = r.u32()?;
                let tid = r.u32()?;
                Event::Thread { change, pid, tid }
            }
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn change(op: u8, start: u8, end: u8) -> Option<Change> {
    match op {
        opcode::DC_START => Some(Change::Existing),
        opcode::DC_END => Some(Change::Remaining),
        op if op == start => Some(Change::Start),
        op if op == end => Some(Change::End),
        _ => None,
    }
}

/// InstructionPointer (pointer), ThreadId (u32), Count (u32, unused). The timestamp and CPU
/// are the header's: the payload has neither.
fn sampled_profile(header: &Header, mut r: Reader) -> Result<Event, DecodeError> {
    let ip = r.pointer()?;
    let tid = r.u32()?;
    Ok(Event::Sample {
        timestamp: header.timestamp,
        tid,
        cpu: header.cpu,
        ip,
    })
}

/// EventTimeStamp (u64), StackProcess (u32), StackThread (u32), then the frames, leaf first,
/// as many as the payload holds.
fn stack(mut r: Reader) -> Result<Event, DecodeError> {
    let timestamp = r.u64()?;
    let pid = r.u32()?;
    let tid = r.u32()?;
    Ok(Event::Stack {
        timestamp,
        pid,
        tid,
        frames: r.pointers(),
    })
}

/// ImageBase, ImageSize (pointers), ProcessId, ImageCheckSum, TimeDateStamp, Reserved0 (u32),
/// DefaultBase (pointer), Reserved1-4 (u32), FileName (UTF-16).
fn image(mut r: Reader) -> Result<Image, DecodeError> {
    let base = r.pointer()?;
    let size = r.pointer()?;
    let pid = r.u32()?;
    r.skip(12)?;
    r.pointer()?;
    r.skip(16)?;
    Ok(Image {
        pid,
        base,
        size,
        path: r.utf16(),
    })
}

/// UniqueProcessKey (pointer), ProcessId, ParentId, SessionId (u32), ExitStatus (i32),
/// DirectoryTableBase (pointer), Flags (u32, from version 4), UserSID, ImageFileName (8-bit),
/// then the command line and more, not read.
fn process(change: Change, version: u8, mut r: Reader) -> Result<Event, DecodeError> {
    r.pointer()?;
    let pid = r.u32()?;
    let parent = r.u32()?;
    let _session = r.u32()?;
    let exit_status = r.u32()? as i32;
    r.pointer()?;
    if version >= 4 {
        r.u32()?;
    }
    r.skip_sid()?;
    let name = r.ansi();
    Ok(Event::Process {
        change,
        pid,
        parent,
        exit_status,
        name,
    })
}

#[cfg(test)]
mod tests;
