//! Decoding the records our `perf_event_attr` asks for, from an 8-byte aligned copy, into the
//! collector's [`Event`]s.

use std::sync::Arc;

use super::b;
use crate::event::{Event, SampleEvent, UserRegs};
use stackscope_process::maps::Mapping;

pub(crate) fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirements.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) }
}

/// The optional parts of our sample records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleFormat {
    /// Number of user registers per sample (0: none requested).
    pub regs: usize,
    /// Whether a user stack copy follows the registers.
    pub stack: bool,
}

/// Size of the `sample_id_all` trailer of non-sample records: pid/tid, time, cpu/reserved.
const ID_TRAILER: usize = 24;

/// A record header: type, misc, size (in bytes, including the header).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub kind: u32,
    pub misc: u16,
    pub size: usize,
}

pub(crate) fn header(bytes: &[u8], at: usize) -> Option<Header> {
    let h = bytes.get(at..at + 8)?;
    Some(Header {
        kind: u32::from_ne_bytes(h[0..4].try_into().ok()?),
        misc: u16::from_ne_bytes(h[4..6].try_into().ok()?),
        size: u16::from_ne_bytes(h[6..8].try_into().ok()?) as usize,
    })
}

/// Time stamp of a record (every record carries one: samples in the body, the rest in the
/// `sample_id_all` trailer).
pub(crate) fn record_time(rec: &[u8], h: Header) -> Option<u64> {
    let at = if h.kind == b::PERF_RECORD_SAMPLE {
        8 + 8 + 8 // header, ip, pid/tid
    } else {
        rec.len().checked_sub(ID_TRAILER)? + 8
    };
    Some(u64::from_ne_bytes(rec.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a record at an 8-aligned offset of an aligned buffer.
struct Cursor<'a> {
    words: &'a [u64],
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_ne_bytes(self.bytes.get(self.pos..self.pos + 8)?.try_into().ok()?);
        self.pos += 8;
        Some(v)
    }

    fn u32_pair(&mut self) -> Option<(u32, u32)> {
        let s = self.bytes.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some((
            u32::from_ne_bytes(s[0..4].try_into().ok()?),
            u32::from_ne_bytes(s[4..8].try_into().ok()?),
        ))
    }

    fn words(&mut self, n: usize) -> Option<&'a [u64]> {
        debug_assert_eq!(self.pos % 8, 0);
        let w = self
            .words
            .get(self.pos / 8..(self.pos / 8).checked_add(n)?)?;
        self.pos += n * 8;
        Some(w)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    /// A NUL-terminated string padded to 8 bytes, ending before the sample_id trailer.
    fn c_string(&mut self, end: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..end)?;
        let n = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        self.pos = end;
        Some(&s[..n])
    }
}

/// Decodes the record at byte `at` of `words` (which must start 8-aligned) into what the
/// collector is told. None when the record is cut short or malformed, and for records nobody
/// uses (data mappings, throttling).
pub(crate) fn parse(words: &[u64], at: usize, h: Header, fmt: SampleFormat) -> Option<Event<'_>> {
    if !at.is_multiple_of(8) || h.size < 8 {
        return None;
    }
    let all = words_as_bytes(words);
    let end = at.checked_add(h.size)?;
    let mut c = Cursor {
        words: words.get(at / 8..end.div_ceil(8))?,
        bytes: all.get(at..end)?,
        pos: 8,
    };
    // Where the `sample_id_all` trailer of a non-sample record starts.
    let trailer = h.size.checked_sub(ID_TRAILER);
    match h.kind {
        b::PERF_RECORD_SAMPLE => sample(&mut c, h, fmt).map(Event::Sample),
        b::PERF_RECORD_MMAP2 | b::PERF_RECORD_MMAP => mmap(&mut c, h, trailer?),
        b::PERF_RECORD_COMM => {
            let (pid, tid) = c.u32_pair()?;
            let comm = c.c_string(trailer?)?;
            Some(Event::Comm {
                pid,
                tid,
                comm: utf8_prefix(comm),
                exec: h.misc as u32 & b::PERF_RECORD_MISC_COMM_EXEC != 0,
            })
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let (pid, ppid) = c.u32_pair()?;
            let (tid, ptid) = c.u32_pair()?;
            Some(if h.kind == b::PERF_RECORD_FORK {
                Event::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                }
            } else {
                Event::Exit { pid, tid }
            })
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Some(Event::Lost { count: c.u64()? })
        }
        _ => None,
    }
}

/// A sample record laid out as `EventSpec::sample_type` asks: ip, pid/tid, time, cpu,
/// period, callchain, then the user registers and stack copy when `fmt` has them.
fn sample<'a>(c: &mut Cursor<'a>, h: Header, fmt: SampleFormat) -> Option<SampleEvent<'a>> {
    let _ip = c.u64()?;
    let (pid, tid) = c.u32_pair()?;
    let time = c.u64()?;
    let (cpu, _) = c.u32_pair()?;
    let period = c.u64()?;
    let nr = c.u64()? as usize;
    let (kernel_stack, user_callchain) = split_callchain(c.words(nr)?);
    let mut user_regs = None;
    if fmt.regs > 0 {
        let abi = c.u64()?;
        if abi != b::PERF_SAMPLE_REGS_ABI_NONE as u64 {
            // In `USER_REGS_MASK` bit order: frame pointer, stack pointer, instruction pointer.
            let r = c.words(fmt.regs)?;
            user_regs = Some(UserRegs {
                bp: *r.first()?,
                sp: *r.get(1)?,
                ip: *r.get(2)?,
            });
        }
    }
    let mut user_stack: &[u8] = &[];
    if fmt.stack {
        let size = c.u64()? as usize;
        if size > 0 {
            let data = c.bytes(size)?;
            let dyn_size = c.u64()? as usize;
            user_stack = &data[..dyn_size.min(size)];
        }
    }
    Some(SampleEvent {
        pid,
        tid,
        cpu,
        time,
        period,
        kernel_stack,
        user_callchain,
        user_regs,
        user_stack,
        in_user: h.misc as u32 & b::PERF_RECORD_MISC_CPUMODE_MASK == b::PERF_RECORD_MISC_USER,
    })
}

/// An MMAP or MMAP2 record of an executable mapping; None for data mappings.
fn mmap<'a>(c: &mut Cursor<'a>, h: Header, trailer: usize) -> Option<Event<'a>> {
    let (pid, tid) = c.u32_pair()?;
    let start = c.u64()?;
    let len = c.u64()?;
    let pgoff = c.u64()?;
    let mut exec = h.misc as u32 & b::PERF_RECORD_MISC_MMAP_DATA == 0;
    let mut build_id = None;
    if h.kind == b::PERF_RECORD_MMAP2 {
        let ids = c.bytes(24)?;
        if h.misc as u32 & b::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
            let n = (ids[0] as usize).min(20);
            build_id = Some(&ids[4..4 + n]);
        }
        let (prot, _flags) = c.u32_pair()?;
        exec = prot & libc::PROT_EXEC as u32 != 0;
    }
    let path = c.c_string(trailer)?;
    if !exec {
        return None;
    }
    Some(Event::Mmap {
        pid,
        tid,
        mapping: Mapping {
            start,
            end: start.saturating_add(len),
            offset: pgoff,
            path: Arc::from(String::from_utf8_lossy(path).as_ref()),
            build_id: build_id.map(Arc::from),
        },
    })
}

/// The longest valid UTF-8 prefix (thread names are bytes and may be cut mid-character).
fn utf8_prefix(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// Splits a kernel callchain into its kernel and user parts, markers removed.
pub(crate) fn split_callchain(chain: &[u64]) -> (&[u64], &[u64]) {
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
mod tests {
    use super::*;

    #[test]
    fn callchain_split_drops_markers() {
        let k = b::PERF_CONTEXT_KERNEL;
        let u = b::PERF_CONTEXT_USER;
        let chain = [
            k,
            0xffff_ffff_8100_0000,
            0xffff_ffff_8100_0010,
            u,
            0x401000,
            0x401100,
        ];
        let (kernel, user) = split_callchain(&chain);
        assert_eq!(kernel, &[0xffff_ffff_8100_0000, 0xffff_ffff_8100_0010]);
        assert_eq!(user, &[0x401000, 0x401100]);
        let only_user = [u, 0x401000];
        let (kernel, user) = split_callchain(&only_user);
        assert!(kernel.is_empty());
        assert_eq!(user, &[0x401000]);
        assert_eq!(split_callchain(&[]), (&[][..], &[][..]));
    }

    /// Builds a comm record the way the kernel lays it out.
    fn comm_record(pid: u32, tid: u32, name: &[u8], time: u64) -> Vec<u64> {
        let mut bytes = Vec::new();
        let name_len = (name.len() + 1).div_ceil(8) * 8;
        let size = 8 + 8 + name_len + ID_TRAILER;
        bytes.extend_from_slice(&b::PERF_RECORD_COMM.to_ne_bytes());
        bytes.extend_from_slice(&(b::PERF_RECORD_MISC_COMM_EXEC as u16).to_ne_bytes());
        bytes.extend_from_slice(&(size as u16).to_ne_bytes());
        bytes.extend_from_slice(&pid.to_ne_bytes());
        bytes.extend_from_slice(&tid.to_ne_bytes());
        bytes.extend_from_slice(name);
        bytes.resize(16 + name_len, 0);
        bytes.extend_from_slice(&pid.to_ne_bytes());
        bytes.extend_from_slice(&tid.to_ne_bytes());
        bytes.extend_from_slice(&time.to_ne_bytes());
        bytes.extend_from_slice(&[0; 8]);
        bytes
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn parses_comm_record_and_its_trailer_time() {
        let words = comm_record(42, 43, b"busy-loop", 123_456);
        let bytes = words_as_bytes(&words);
        let h = header(bytes, 0).unwrap();
        assert_eq!(h.size, bytes.len());
        assert_eq!(record_time(bytes, h), Some(123_456));
        let fmt = SampleFormat {
            regs: 0,
            stack: false,
        };
        match parse(&words, 0, h, fmt).unwrap() {
            Event::Comm {
                pid,
                tid,
                comm,
                exec,
            } => {
                assert_eq!((pid, tid, comm, exec), (42, 43, "busy-loop", true));
            }
            other => panic!("not a comm record: {other:?}"),
        }
    }

    #[test]
    fn truncated_record_is_rejected() {
        let words = comm_record(1, 1, b"x", 5);
        let bytes = words_as_bytes(&words);
        let h = header(bytes, 0).unwrap();
        let fmt = SampleFormat {
            regs: 0,
            stack: false,
        };
        assert!(parse(&words[..2], 0, h, fmt).is_none());
    }
}
