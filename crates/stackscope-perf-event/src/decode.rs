//! The one decoder of perf records, for the live rings and perf.data files alike:
//! linux-perf-event-reader parses a record as its event's attr lays it out, and this turns
//! what it parsed into the collector's [`Event`]s.
//!
//! Where a record is framed (a drained ring copy, a file) is its reader's; what the collector
//! is told of a sample, a mapping or a task is decided here once.

use std::sync::Arc;

use linux_perf_data::linux_perf_event_reader::{
    CpuMode, EventRecord, Mmap2FileId, RawData, RawEventRecord, SampleRecord,
};
use perf_event_open_sys::bindings as b;

use crate::event::{Event, SampleEvent};
use crate::perf::by_number;
use stackscope_process::maps::Mapping;
use stackscope_stacks::arch::Arch;

const RECORD_MMAP2: u32 = 10;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// An MMAP2 record's build-id length byte, after pid, tid, address, length and page offset.
pub(crate) const MMAP2_BUILD_ID_LEN_AT: usize = 32;
/// The most bytes a build-id field holds.
const BUILD_ID_MAX: u8 = 20;

/// Refuses an MMAP2 record whose build-id flag is set but whose build-id length byte is more
/// than the field holds (the parser asserts it). `body` is the record after its header.
pub(crate) fn check_mmap2(record_type: u32, misc: u16, body: RawData<'_>) -> Result<(), String> {
    if record_type != RECORD_MMAP2 || misc & MISC_MMAP_BUILD_ID == 0 {
        return Ok(());
    }
    let len = body
        .get(MMAP2_BUILD_ID_LEN_AT..MMAP2_BUILD_ID_LEN_AT + 1)
        .and_then(|mut at| at.read_u8().ok());
    match len {
        Some(n) if n > BUILD_ID_MAX => Err(format!(
            "an MMAP2 record gives its build-id {n} bytes (at most {BUILD_ID_MAX} fit)"
        )),
        _ => Ok(()),
    }
}

/// Parses one record; errs with what is wrong with a record that cannot be decoded.
pub(crate) fn parse<'a>(record: &RawEventRecord<'a>) -> Result<EventRecord<'a>, String> {
    check_mmap2(record.record_type.0, record.misc, record.data)?;
    record
        .parse()
        .map_err(|e| format!("a {:?} record cannot be decoded: {e}", record.record_type))
}

/// Turns parsed records into events. It holds what an event borrows that a record cannot
/// lend: the callchain as aligned words, and the bytes of a record split in two; and the
/// architecture of the machine that took the samples, whose registers they carry.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    chain: Vec<u64>,
    spare: Vec<u8>,
    arch: Option<Arch>,
}

impl Decoder {
    /// A decoder of samples taken on a machine of `arch` (`None`: registers are not read).
    pub(crate) fn new(arch: Option<Arch>) -> Self {
        Decoder {
            arch,
            ..Decoder::default()
        }
    }

    /// What the collector is told of `record`; None for records it does not use (data
    /// mappings, the kernel's own, throttling).
    pub(crate) fn event<'a>(&'a mut self, record: &EventRecord<'a>) -> Option<Event<'a>> {
        match record {
            EventRecord::Sample(s) => Some(Event::Sample(self.sample(s))),
            EventRecord::Mmap(m) => {
                (m.is_executable && m.pid >= 0 && is_user(m.cpu_mode)).then(|| Event::Mmap {
                    pid: task(m.pid),
                    tid: task(m.tid),
                    mapping: mapping(m.address, m.length, m.page_offset, m.path, None),
                })
            }
            EventRecord::Mmap2(m) => {
                let exec = m.protection & libc::PROT_EXEC as u32 != 0;
                let build_id = match &m.file_id {
                    // The kernel flags a build-id it could not read with an empty one.
                    Mmap2FileId::BuildId(id) if !id.is_empty() => Some(id.as_slice()),
                    _ => None,
                };
                (exec && m.pid >= 0 && is_user(m.cpu_mode)).then(|| Event::Mmap {
                    pid: task(m.pid),
                    tid: task(m.tid),
                    mapping: mapping(m.address, m.length, m.page_offset, m.path, build_id),
                })
            }
            EventRecord::Comm(c) => Some(Event::Comm {
                pid: task(c.pid),
                tid: task(c.tid),
                comm: utf8_prefix(joined(c.name, &mut self.spare)),
                exec: c.is_execve,
            }),
            EventRecord::Fork(f) => Some(Event::Fork {
                pid: task(f.pid),
                ppid: task(f.ppid),
                tid: task(f.tid),
                ptid: task(f.ptid),
            }),
            EventRecord::Exit(e) => Some(Event::Exit {
                pid: task(e.pid),
                tid: task(e.tid),
            }),
            EventRecord::Lost(l) => Some(Event::Lost { count: l.count }),
            _ => None,
        }
    }

    fn sample<'a>(&'a mut self, s: &SampleRecord<'a>) -> SampleEvent<'a> {
        let Decoder { chain, spare, arch } = self;
        let in_user = is_user(s.cpu_mode);
        chain.clear();
        let (kernel_stack, user_callchain): (&[u64], &[u64]) = match &s.callchain {
            Some(words) => {
                chain.extend((0..words.len()).map_while(|i| words.get(i)));
                split_callchain(chain)
            }
            // Without a callchain a sample's stack is its instruction pointer alone.
            None => {
                chain.push(s.ip.unwrap_or(0));
                match in_user {
                    true => (&[], chain),
                    false => (chain, &[]),
                }
            }
        };
        let user_regs = match (&s.user_regs, *arch) {
            (Some(regs), Some(arch)) => by_number(arch, |n| regs.get(u64::from(n))),
            _ => None,
        };
        let user_stack = match s.user_stack {
            Some((data, dyn_size)) => {
                let bytes = joined(data, spare);
                &bytes[..usize::try_from(dyn_size).map_or(bytes.len(), |n| n.min(bytes.len()))]
            }
            None => &[],
        };
        SampleEvent {
            pid: task(s.pid.unwrap_or(0)),
            tid: task(s.tid.unwrap_or(0)),
            cpu: s.cpu.unwrap_or(0),
            time: s.timestamp.unwrap_or(0),
            period: s.period.unwrap_or(1),
            kernel_stack,
            user_callchain,
            user_regs,
            user_stack,
            in_user,
        }
    }
}

/// The bytes of `data` as one slice: borrowed when they lie in one piece, else joined in
/// `spare`.
fn joined<'a>(data: RawData<'a>, spare: &'a mut Vec<u8>) -> &'a [u8] {
    match data {
        RawData::Single(bytes) => bytes,
        RawData::Split(first, second) => {
            spare.clear();
            spare.extend_from_slice(first);
            spare.extend_from_slice(second);
            spare
        }
    }
}

fn mapping(
    start: u64,
    len: u64,
    offset: u64,
    path: RawData<'_>,
    build_id: Option<&[u8]>,
) -> Mapping {
    Mapping {
        start,
        end: start.saturating_add(len),
        offset,
        path: Arc::from(String::from_utf8_lossy(&path.as_slice()).as_ref()),
        build_id: build_id.map(Arc::from),
    }
}

/// perf writes -1 for "no task"; such records concern no process we track.
fn task(id: i32) -> u32 {
    u32::try_from(id).unwrap_or(0)
}

fn is_user(mode: CpuMode) -> bool {
    !matches!(mode, CpuMode::Kernel | CpuMode::GuestKernel)
}

/// The longest valid UTF-8 prefix (thread names are bytes and may be cut mid-character).
fn utf8_prefix(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// Splits a kernel callchain into its kernel and user parts, markers removed.
fn split_callchain(chain: &[u64]) -> (&[u64], &[u64]) {
    let mut kernel: &[u64] = &[];
    let mut user: &[u64] = &[];
    let mut i = 0;
    while i < chain.len() {
        let context = chain[i];
        if context < b::PERF_CONTEXT_MAX {
            // Entries before any marker: not produced by our kernels; skip them.
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < chain.len() && chain[end] < b::PERF_CONTEXT_MAX {
            end += 1;
        }
        if context == b::PERF_CONTEXT_KERNEL {
            kernel = &chain[start..end];
        } else if context == b::PERF_CONTEXT_USER {
            user = &chain[start..end];
        }
        i = end;
    }
    (kernel, user)
}

#[cfg(test)]
mod tests;
