//! Decoding the records our `perf_event_attr` asks for, from an 8-byte aligned copy.

use super::b;

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

/// A decoded record. Borrowed slices point into the aligned copy of the ring.
#[derive(Debug)]
pub(crate) enum Record<'a> {
    Sample(RawSample<'a>),
    Mmap {
        pid: u32,
        tid: u32,
        start: u64,
        len: u64,
        pgoff: u64,
        exec: bool,
        build_id: Option<&'a [u8]>,
        path: &'a [u8],
    },
    Comm {
        pid: u32,
        tid: u32,
        comm: &'a [u8],
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
    Lost {
        count: u64,
    },
    /// Throttling and other records we do not use.
    Other,
}

#[derive(Debug)]
pub(crate) struct RawSample<'a> {
    pub misc: u16,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    pub period: u64,
    /// The callchain as the kernel wrote it, with PERF_CONTEXT_* markers.
    pub callchain: &'a [u64],
    /// Registers in `USER_REGS_MASK` bit order; None when the kernel had no user registers.
    pub regs: Option<&'a [u64]>,
    pub stack: &'a [u8],
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

/// Decodes the record at byte `at` of `words` (which must start 8-aligned). None when the
/// record is cut short or malformed.
pub(crate) fn parse(words: &[u64], at: usize, h: Header, fmt: SampleFormat) -> Option<Record<'_>> {
    if !at.is_multiple_of(8) || h.size < 8 {
        return None;
    }
    let all = words_as_bytes(words);
    let end = at.checked_add(h.size)?;
    let rec_words = words.get(at / 8..end.div_ceil(8))?;
    let rec_bytes = all.get(at..end)?;
    let mut c = Cursor {
        words: rec_words,
        bytes: rec_bytes,
        pos: 8,
    };
    let trailer = h.size.checked_sub(ID_TRAILER);
    Some(match h.kind {
        b::PERF_RECORD_SAMPLE => {
            let _ip = c.u64()?;
            let (pid, tid) = c.u32_pair()?;
            let time = c.u64()?;
            let (cpu, _) = c.u32_pair()?;
            let period = c.u64()?;
            let nr = c.u64()? as usize;
            let callchain = c.words(nr)?;
            let mut regs = None;
            if fmt.regs > 0 {
                let abi = c.u64()?;
                if abi != b::PERF_SAMPLE_REGS_ABI_NONE as u64 {
                    regs = Some(c.words(fmt.regs)?);
                }
            }
            let mut stack: &[u8] = &[];
            if fmt.stack {
                let size = c.u64()? as usize;
                if size > 0 {
                    let data = c.bytes(size)?;
                    let dyn_size = c.u64()? as usize;
                    stack = &data[..dyn_size.min(size)];
                }
            }
            Record::Sample(RawSample {
                misc: h.misc,
                pid,
                tid,
                time,
                cpu,
                period,
                callchain,
                regs,
                stack,
            })
        }
        b::PERF_RECORD_MMAP2 | b::PERF_RECORD_MMAP => {
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
            let path = c.c_string(trailer?)?;
            Record::Mmap {
                pid,
                tid,
                start,
                len,
                pgoff,
                exec,
                build_id,
                path,
            }
        }
        b::PERF_RECORD_COMM => {
            let (pid, tid) = c.u32_pair()?;
            let comm = c.c_string(trailer?)?;
            Record::Comm {
                pid,
                tid,
                comm,
                exec: h.misc as u32 & b::PERF_RECORD_MISC_COMM_EXEC != 0,
            }
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let (pid, ppid) = c.u32_pair()?;
            let (tid, ptid) = c.u32_pair()?;
            if h.kind == b::PERF_RECORD_FORK {
                Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                }
            } else {
                Record::Exit { pid, tid }
            }
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Record::Lost { count: c.u64()? }
        }
        _ => Record::Other,
    })
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

pub(crate) fn misc_is_user(misc: u16) -> bool {
    misc as u32 & b::PERF_RECORD_MISC_CPUMODE_MASK == b::PERF_RECORD_MISC_USER
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
            Record::Comm {
                pid,
                tid,
                comm,
                exec,
            } => {
                assert_eq!((pid, tid, comm, exec), (42, 43, &b"busy-loop"[..], true));
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
