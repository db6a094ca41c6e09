//! Reading a `perf.data` file as `perf record` writes it: the records of one sampled event are
//! replayed through the same collector `stackscope record` uses (process maps from the mmap,
//! comm, fork and exit records; user stacks unwound from the sample's registers and stack copy,
//! or taken from its frame-pointer callchain; kernel callchains as they are), then symbolized
//! once per unique address into a [`Profile`].
//!
//! The file is read where it was recorded: binaries, their unwind info and kernel symbols come
//! from this machine. The build-ids in the file's header tell whether a binary on disk is still
//! the one that ran; one that is not is looked up in perf's build-id cache.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use linux_perf_data::linux_perf_event_reader::constants::{
    PERF_REG_X86_BP, PERF_REG_X86_IP, PERF_REG_X86_SP,
};
use linux_perf_data::linux_perf_event_reader::{
    AttrFlags, CpuMode, Endianness, EventRecord, RecordType, SampleFormat, SampleRecord,
    SamplingPolicy,
};
use linux_perf_data::{DsoKey, PerfFileReader, PerfFileRecord};
use stackscope_profile::{Metadata, Profile};

use crate::event::{Event, SampleEvent, UserRegs};
use crate::maps::Mapping;
use crate::perf::split_callchain;
use crate::record::Collector;
use crate::sampler::{SamplerConfig, StackMode};

/// The first bytes of a perf.data file (`2ELIFREP` when written big-endian).
pub const MAGIC: &[u8; 8] = b"PERFILE2";
const MAGIC_SWAPPED: &[u8; 8] = b"2ELIFREP";

/// True when `head` (the first bytes of a file) starts like a perf.data file.
pub fn is_perf_data(head: &[u8]) -> bool {
    head.starts_with(MAGIC) || head.starts_with(MAGIC_SWAPPED)
}

/// Why a perf.data file could not be read; one line naming the file and, for damage, where.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PerfDataError {
    message: String,
}

impl PerfDataError {
    fn new(message: String) -> Self {
        PerfDataError { message }
    }

    fn damaged(path: &Path, at: u64, len: u64, what: impl std::fmt::Display) -> Self {
        Self::new(format!(
            "{} is truncated or corrupt near byte {at} of {len}: {what}; record it again with perf record",
            path.display()
        ))
    }
}

/// How far the reading got, for a progress bar: bytes of the file consumed so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// How often (in records) the progress callback is called.
const PROGRESS_EVERY: u64 = 4096;

/// Reads the perf.data file at `path` into a profile. `progress` is called now and then while
/// the records are read, and once more when symbolization starts (with `done == total`).
pub fn read_perf_data(
    path: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<Profile, PerfDataError> {
    let file = File::open(path)
        .map_err(|e| PerfDataError::new(format!("cannot open {}: {e}", path.display())))?;
    read_perf_data_from(BufReader::with_capacity(1 << 20, file), path, progress)
}

/// Reads a perf.data file from `input`, already open (the format is read out of order, so it
/// must seek); `path` names it in messages. Every record is checked against the data section
/// before the parser sees it, so a damaged file is an error naming the record's byte offset.
pub fn read_perf_data_from<R: Read + Seek>(
    mut input: R,
    path: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<Profile, PerfDataError> {
    let total = input
        .seek(SeekFrom::End(0))
        .map_err(|e| PerfDataError::new(format!("cannot read {}: {e}", path.display())))?;
    let data = check_layout(&mut input, total)
        .map_err(|(at, what)| PerfDataError::damaged(path, at, total, what))?;
    input
        .seek(SeekFrom::Start(0))
        .map_err(|e| PerfDataError::new(format!("cannot read {}: {e}", path.display())))?;
    let position = Rc::new(Cell::new(0));
    let bad_record = Rc::new(RefCell::new(None));
    let reader = Counting {
        inner: input,
        position: position.clone(),
        records: data.map(RecordCheck::new),
        bad_record: bad_record.clone(),
    };
    // A record the check refused is the error, whatever the parser made of the failed read.
    let damaged = |e: &dyn std::fmt::Display| match bad_record.borrow_mut().take() {
        Some((at, what)) => PerfDataError::damaged(path, at, total, what),
        None => PerfDataError::damaged(path, position.get(), total, e),
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).map_err(|e| damaged(&e))?;

    let attrs = perf_file.event_attributes();
    if attrs.is_empty() {
        return Err(PerfDataError::damaged(
            path,
            0,
            total,
            "no event is described",
        ));
    }
    // One event's samples make one profile; cpu-clock is what stackscope itself samples.
    // perf names events with their modifiers (`cpu-clock:pppH`); the profile keeps the event.
    let event_name = |i: usize| {
        attrs[i]
            .name()
            .and_then(|n| n.split(':').next())
            .unwrap_or("unknown event")
    };
    let chosen = (0..attrs.len())
        .find(|&i| event_name(i) == "cpu-clock")
        .unwrap_or(0);
    let attr = *attrs[chosen].attributes();
    let event = event_name(chosen).to_string();
    let config = sampler_config(&attr);
    let build_ids = BuildIds::from_header(&perf_file);
    let command: Vec<String> = perf_file
        .cmdline()
        .ok()
        .flatten()
        .map(|args| args.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();

    let endian = perf_file.endian();
    let mut collector = Collector::new(&config).replaying();
    let mut replay = Replay {
        chain: Vec::new(),
        times: None,
        build_ids,
        has_callchain: attr.sample_format.contains(SampleFormat::CALLCHAIN),
        kernel_text: None,
    };
    let mut records = 0u64;
    let (mut lost_in_ring, mut lost_samples) = (0u64, 0u64);
    progress(Progress { done: 0, total });
    loop {
        let record = match record_iter.next_record(&mut perf_file) {
            Ok(Some(record)) => record,
            Ok(None) => break,
            Err(e) => return Err(damaged(&e)),
        };
        records += 1;
        if records.is_multiple_of(PROGRESS_EVERY) {
            progress(Progress {
                done: position.get(),
                total,
            });
        }
        let PerfFileRecord::EventRecord { attr_index, record } = record else {
            continue;
        };
        // Records inside compressed ones pass no check on their way in: this one is still
        // unchecked when it was compressed.
        if let Err(what) = check_mmap2(record.record_type.0, record.misc, &record.data.as_slice()) {
            return Err(PerfDataError::damaged(path, position.get(), total, what));
        }
        let parsed = match record.parse() {
            Ok(parsed) => parsed,
            Err(e) => {
                return Err(PerfDataError::damaged(
                    path,
                    position.get(),
                    total,
                    format!("a {:?} record cannot be decoded: {e}", record.record_type),
                ))
            }
        };
        match parsed {
            EventRecord::Sample(sample) if attr_index == chosen => {
                replay.sample(&sample, &mut collector)
            }
            EventRecord::Sample(_) => {}
            EventRecord::Lost(l) => lost_in_ring += l.count,
            // perf writes the event's own count of lost samples at the end of the recording
            // (the kernel's, ring buffer overflows included), and the kernel writes one for
            // samples it could not write whole.
            EventRecord::Raw(raw) if raw.record_type == RecordType::LOST_SAMPLES => {
                let head = raw.data.as_slice();
                if let Some(bytes) = head.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                    let count = match endian {
                        Endianness::LittleEndian => u64::from_le_bytes(bytes),
                        Endianness::BigEndian => u64::from_be_bytes(bytes),
                    };
                    lost_samples += count;
                }
            }
            other => replay.other(other, &mut collector),
        }
    }
    progress(Progress { done: total, total });
    // The two counts overlap (a ring buffer overflow is in both): the larger is the loss.
    collector.handle(Event::Lost {
        count: lost_in_ring.max(lost_samples),
    });

    let duration_secs = replay
        .times
        .map_or(0.0, |(first, last)| (last - first) as f64 / 1e9);
    let (frequency_hz, period) = match attr.sampling_policy {
        SamplingPolicy::Frequency(hz) => (Some(hz), None),
        SamplingPolicy::Period(p) => (None, Some(p.get())),
        SamplingPolicy::NoSampling => (None, None),
    };
    let meta = Metadata {
        source: "perf.data".into(),
        event,
        frequency_hz,
        period,
        duration_secs,
        command,
        ..Metadata::default()
    };
    let mut profile = collector.finish(meta, &config, false);
    if config.kernel
        && replay
            .kernel_text
            .is_some_and(|t| running_kernel_text() != Some(t))
    {
        profile.meta.hints.push(
            "kernel frames are named from the running kernel, which is not the recorded one (or was booted again since): they may be misnamed".into(),
        );
    }
    Ok(profile)
}

/// The collector's settings for what the recorded event captured.
fn sampler_config(attr: &linux_perf_data::linux_perf_event_reader::PerfEventAttr) -> SamplerConfig {
    let dwarf = attr
        .sample_format
        .contains(SampleFormat::REGS_USER | SampleFormat::STACK_USER);
    let (frequency, period) = match attr.sampling_policy {
        SamplingPolicy::Frequency(hz) => (Some(hz), None),
        SamplingPolicy::Period(p) => (None, Some(p.get())),
        SamplingPolicy::NoSampling => (None, None),
    };
    SamplerConfig {
        cpu: None,
        frequency,
        period,
        user: !attr.flags.contains(AttrFlags::EXCLUDE_USER),
        kernel: !attr.flags.contains(AttrFlags::EXCLUDE_KERNEL),
        stack_mode: if dwarf {
            StackMode::Dwarf {
                stack_bytes: attr.sample_stack_user,
            }
        } else {
            StackMode::FramePointer
        },
        include_idle: true,
        buffer_pages: 0,
    }
}

/// Per-file replay state.
struct Replay {
    /// The sample's callchain, copied out of the record (it may not be 8-aligned there).
    chain: Vec<u64>,
    /// First and last sample times.
    times: Option<(u64, u64)>,
    build_ids: BuildIds,
    /// Without callchains a sample's stack is its instruction pointer alone.
    has_callchain: bool,
    /// Where the recorded kernel's text began (perf's `[kernel.kallsyms]_text` mapping).
    kernel_text: Option<u64>,
}

impl Replay {
    fn sample(&mut self, s: &SampleRecord<'_>, collector: &mut Collector) {
        if let Some(t) = s.timestamp {
            self.times = Some(match self.times {
                Some((first, last)) => (first.min(t), last.max(t)),
                None => (t, t),
            });
        }
        self.chain.clear();
        if let Some(chain) = &s.callchain {
            self.chain
                .extend((0..chain.len()).filter_map(|i| chain.get(i)));
        }
        let in_kernel = matches!(s.cpu_mode, CpuMode::Kernel);
        let ip_only = [s.ip.unwrap_or(0)];
        let (kernel_stack, user_callchain): (&[u64], &[u64]) = if self.has_callchain {
            split_callchain(&self.chain)
        } else if in_kernel {
            (&ip_only, &[])
        } else {
            (&[], &ip_only)
        };
        let user_regs = s.user_regs.as_ref().and_then(|r| {
            Some(UserRegs {
                ip: r.get(PERF_REG_X86_IP)?,
                sp: r.get(PERF_REG_X86_SP)?,
                bp: r.get(PERF_REG_X86_BP)?,
            })
        });
        let stack = s.user_stack.as_ref().map(|(data, dyn_size)| {
            let bytes = data.as_slice();
            let keep = usize::try_from(*dyn_size)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            match bytes {
                std::borrow::Cow::Borrowed(b) => std::borrow::Cow::Borrowed(&b[..keep]),
                std::borrow::Cow::Owned(mut v) => {
                    v.truncate(keep);
                    std::borrow::Cow::Owned(v)
                }
            }
        });
        collector.handle(Event::Sample(SampleEvent {
            pid: pid(s.pid),
            tid: pid(s.tid),
            cpu: s.cpu.unwrap_or(0),
            time: s.timestamp.unwrap_or(0),
            period: s.period.unwrap_or(1),
            kernel_stack,
            user_callchain,
            user_regs,
            user_stack: stack.as_deref().unwrap_or(&[]),
            in_user: !in_kernel,
        }));
    }

    fn other(&mut self, record: EventRecord<'_>, collector: &mut Collector) {
        match record {
            EventRecord::Mmap(m)
                if m.pid < 0 && m.path.as_slice().starts_with(b"[kernel.kallsyms]_text") =>
            {
                self.kernel_text = Some(m.page_offset);
            }
            EventRecord::Mmap(m) if m.is_executable && m.pid >= 0 && is_user(m.cpu_mode) => {
                let path = m.path.as_slice();
                let mapping = self
                    .build_ids
                    .mapping(m.address, m.length, m.page_offset, &path);
                collector.handle(Event::Mmap {
                    pid: m.pid as u32,
                    tid: pid(Some(m.tid)),
                    mapping,
                });
            }
            EventRecord::Mmap2(m) => {
                let exec = m.protection & libc::PROT_EXEC as u32 != 0;
                if exec && m.pid >= 0 && is_user(m.cpu_mode) {
                    let path = m.path.as_slice();
                    let mut mapping =
                        self.build_ids
                            .mapping(m.address, m.length, m.page_offset, &path);
                    if let linux_perf_data::linux_perf_event_reader::Mmap2FileId::BuildId(id) =
                        &m.file_id
                    {
                        if mapping.build_id.is_none() && !id.is_empty() {
                            mapping.build_id = Some(Arc::from(id.as_slice()));
                        }
                    }
                    collector.handle(Event::Mmap {
                        pid: m.pid as u32,
                        tid: pid(Some(m.tid)),
                        mapping,
                    });
                }
            }
            EventRecord::Comm(c) => {
                let name = c.name.as_slice();
                let comm = String::from_utf8_lossy(&name);
                collector.handle(Event::Comm {
                    pid: pid(Some(c.pid)),
                    tid: pid(Some(c.tid)),
                    comm: &comm,
                    exec: c.is_execve,
                });
            }
            EventRecord::Fork(f) => collector.handle(Event::Fork {
                pid: pid(Some(f.pid)),
                ppid: pid(Some(f.ppid)),
                tid: pid(Some(f.tid)),
                ptid: pid(Some(f.ptid)),
            }),
            EventRecord::Exit(e) => collector.handle(Event::Exit {
                pid: pid(Some(e.pid)),
                tid: pid(Some(e.tid)),
            }),
            _ => {}
        }
    }
}

/// Where the running kernel's text begins, from /proc/kallsyms (0 when addresses are hidden).
fn running_kernel_text() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let addr = fields.next()?;
        let _kind = fields.next()?;
        (fields.next()? == "_text")
            .then(|| u64::from_str_radix(addr, 16).ok())
            .flatten()
    })
}

/// perf writes -1 for "no task"; such records concern no process we track.
fn pid(p: Option<i32>) -> u32 {
    p.and_then(|p| u32::try_from(p).ok()).unwrap_or(0)
}

fn is_user(mode: CpuMode) -> bool {
    !matches!(mode, CpuMode::Kernel | CpuMode::GuestKernel)
}

/// The build-ids perf stored in the header for every binary a sample hit, and where each such
/// binary is found now.
struct BuildIds {
    by_path: HashMap<Vec<u8>, Arc<[u8]>>,
    /// Per path: the file to read for it (the path itself, or perf's cached copy when the file
    /// on disk was rebuilt since).
    located: HashMap<Vec<u8>, Arc<str>>,
    cache_dir: Option<PathBuf>,
}

impl BuildIds {
    fn from_header(file: &linux_perf_data::PerfFile) -> Self {
        let mut by_path = HashMap::new();
        for (key, info) in file.build_ids().unwrap_or_default() {
            if let DsoKey::User { full_path, .. } = key {
                if !info.build_id.is_empty() {
                    by_path.insert(full_path, Arc::from(info.build_id.as_slice()));
                }
            }
        }
        BuildIds {
            by_path,
            located: HashMap::new(),
            cache_dir: std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".debug")),
        }
    }

    /// The mapping for an mmap record, with its binary's build-id and the file that holds it.
    fn mapping(&mut self, start: u64, len: u64, offset: u64, path: &[u8]) -> Mapping {
        let build_id = self.by_path.get(path).cloned();
        let file = match &build_id {
            Some(id) => self.locate(path, id),
            None => Arc::from(String::from_utf8_lossy(path).as_ref()),
        };
        Mapping {
            start,
            end: start.saturating_add(len),
            offset,
            path: file,
            build_id,
        }
    }

    /// The path to read for `path`: itself when its build-id matches (or cannot be told), else
    /// perf's cached copy (`~/.debug/.build-id/xx/rest/elf`) when there is one.
    fn locate(&mut self, path: &[u8], id: &[u8]) -> Arc<str> {
        if let Some(found) = self.located.get(path) {
            return found.clone();
        }
        let text: Arc<str> = Arc::from(String::from_utf8_lossy(path).as_ref());
        let mut found = text.clone();
        let on_disk = file_build_id(Path::new(&*text));
        if on_disk.as_deref().is_some_and(|d| d != id) {
            if let Some(cached) = self.cache_dir.as_ref().and_then(|d| cached_copy(d, id)) {
                found = Arc::from(cached.to_string_lossy().as_ref());
            }
        }
        self.located.insert(path.to_vec(), found.clone());
        found
    }
}

/// perf's build-id cache entry for `id`, if it holds the binary.
fn cached_copy(dir: &Path, id: &[u8]) -> Option<PathBuf> {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let (head, rest) = hex.split_at_checked(2)?;
    // The entry links to `~/.debug/ORIGINAL/PATH/BUILDID/elf`: resolved, the original file's
    // name stays in the path.
    let path = dir
        .join(".build-id")
        .join(head)
        .join(rest)
        .join("elf")
        .canonicalize()
        .ok()?;
    (file_build_id(&path).as_deref() == Some(id)).then_some(path)
}

/// The GNU build-id note of an ELF file.
fn file_build_id(path: &Path) -> Option<Vec<u8>> {
    use object::Object;
    let file = File::open(path).ok()?;
    // SAFETY: the map is read-only and dropped before returning; a binary changed under us
    // gives a wrong answer at worst, as reading it would.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    elf.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// Checks that the header's sections lie inside the file and that the counts in the
/// sections read before the records fit their sections: a damaged count must not make the
/// parser reserve memory for billions of entries. Errs with an offset and what is wrong;
/// returns where the records lie (for a little-endian file).
fn check_layout<R: Read + Seek>(
    input: &mut R,
    len: u64,
) -> Result<Option<Range<u64>>, (u64, String)> {
    let mut read = |at: u64, n: usize| -> Result<Vec<u8>, (u64, String)> {
        let mut buf = vec![0; n];
        input
            .seek(SeekFrom::Start(at))
            .and_then(|_| input.read_exact(&mut buf))
            .map_err(|_| {
                (
                    at,
                    format!("the file ends before the {n} bytes expected here"),
                )
            })?;
        Ok(buf)
    };
    let word =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let head = read(0, HEADER_SIZE)?;
    if !head.starts_with(MAGIC) {
        // Big-endian files are left to the parser's own checks.
        return Ok(None);
    }
    let section = |b: &[u8], at: usize| (word(b, at), word(b, at + 8));
    let inside = |(offset, size): (u64, u64), at: u64, what: &str| {
        if offset.checked_add(size).is_some_and(|end| end <= len) {
            Ok(())
        } else {
            Err((
                at,
                format!("the {what} section ({size} bytes at {offset}) lies past the end"),
            ))
        }
    };
    let attrs = section(&head, 24);
    let data = section(&head, 40);
    inside(attrs, 24, "attributes")?;
    inside(data, 40, "data")?;
    inside(section(&head, 56), 56, "event types")?;
    let features: Vec<u32> = (0..256u32)
        .filter(|&bit| word(&head, 72 + (bit / 64) as usize * 8) & (1 << (bit % 64)) != 0)
        .collect();
    let table_at = data.0 + data.1;
    let table = read(table_at, features.len() * 16)?;
    for (i, &feature) in features.iter().enumerate() {
        let sec = section(&table, i * 16);
        let at = table_at + i as u64 * 16;
        inside(sec, at, &format!("header feature {feature}"))?;
        let counted = match feature {
            FEATURE_CMDLINE => 4,
            FEATURE_EVENT_DESC => 8,
            _ => continue,
        };
        let body = read(
            sec.0,
            usize::try_from(sec.1).unwrap_or(usize::MAX).min(1 << 24),
        )?;
        let count = |at: usize| {
            body.get(at..at.saturating_add(4)).map_or(0, |b| {
                u32::from_le_bytes(b.try_into().unwrap_or_default()) as u64
            })
        };
        let too_many = || {
            (
                sec.0,
                format!("header feature {feature} counts more entries than it holds"),
            )
        };
        // Every string takes at least its 4-byte length.
        if count(0) * counted > sec.1 {
            return Err(too_many());
        }
        if feature == FEATURE_EVENT_DESC {
            // Each event: its attribute, its id count, its name (length and bytes), its ids.
            let attr_size = count(4);
            let mut at = 8u64;
            for _ in 0..count(0) {
                let ids = count(usize::try_from(at + attr_size).unwrap_or(usize::MAX));
                let name = count(usize::try_from(at + attr_size + 4).unwrap_or(usize::MAX));
                at += attr_size + 8 + name + ids * 8;
                if at > sec.1 {
                    return Err(too_many());
                }
            }
        }
    }
    Ok(Some(data.0..data.0 + data.1))
}

/// perf_file_header: magic, size, attr_size, three sections, the feature bitmap.
const HEADER_SIZE: usize = 104;
const FEATURE_CMDLINE: u32 = 11;
const FEATURE_EVENT_DESC: u32 = 12;

/// Record types and the misc flag whose bodies the checks below look into.
const RECORD_MMAP2: u32 = 10;
const RECORD_AUXTRACE: u32 = 71;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// An MMAP2 record's build-id length byte, after pid, tid, address, length and page offset.
const MMAP2_BUILD_ID_LEN_AT: usize = 32;
/// The most bytes a build-id field holds.
const BUILD_ID_MAX: u8 = 20;
/// The bytes of a record the checks read: its header and the start of its body.
const RECORD_HEAD: usize = 8 + MMAP2_BUILD_ID_LEN_AT + 1;

/// Refuses an MMAP2 record whose build-id flag is set but whose build-id length byte is more
/// than the field holds (the parser asserts it). `body` is the record after its header.
fn check_mmap2(record_type: u32, misc: u16, body: &[u8]) -> Result<(), String> {
    if record_type != RECORD_MMAP2 || misc & MISC_MMAP_BUILD_ID == 0 {
        return Ok(());
    }
    match body.get(MMAP2_BUILD_ID_LEN_AT) {
        Some(&n) if n > BUILD_ID_MAX => Err(format!(
            "an MMAP2 record gives its build-id {n} bytes (at most {BUILD_ID_MAX} fit)"
        )),
        _ => Ok(()),
    }
}

/// Checks each record of the data section as its bytes stream past on their way to the parser:
/// it fits the data section, and what the parser trusts in it (an MMAP2 build-id length, an
/// AUXTRACE record's trailing data size) does too.
struct RecordCheck {
    data: Range<u64>,
    /// Where the record being read starts.
    start: u64,
    /// Its first bytes, up to [`RECORD_HEAD`].
    head: Vec<u8>,
    /// Where the record after it starts, once its head has been checked.
    next: Option<u64>,
}

impl RecordCheck {
    fn new(data: Range<u64>) -> Self {
        RecordCheck {
            start: data.start,
            data,
            head: Vec::with_capacity(RECORD_HEAD),
            next: None,
        }
    }

    /// Takes the `bytes` read at offset `at`. Errs with the bad record's offset.
    fn feed(&mut self, at: u64, bytes: &[u8]) -> Result<(), (u64, String)> {
        let end = at + bytes.len() as u64;
        loop {
            if let Some(next) = self.next {
                if next >= end || next >= self.data.end {
                    return Ok(());
                }
                self.start = next;
                self.head.clear();
                self.next = None;
            }
            let have = self.start + self.head.len() as u64;
            // Only a read that continues the record's head is taken (the parser reads on).
            if have < at || have >= end {
                return Ok(());
            }
            let want = self.head_len().saturating_sub(self.head.len());
            let from = (have - at) as usize;
            let take = want.min(bytes.len() - from);
            self.head.extend_from_slice(&bytes[from..from + take]);
            if self.head.len() < self.head_len() {
                return Ok(());
            }
            self.next = Some(self.check_head().map_err(|what| (self.start, what))?);
        }
    }

    /// How many of the record's bytes the check needs: its header, then up to [`RECORD_HEAD`]
    /// of a record that long.
    fn head_len(&self) -> usize {
        match self.head.get(6..8) {
            Some(size) => usize::from(u16::from_le_bytes([size[0], size[1]])).clamp(8, RECORD_HEAD),
            None => 8,
        }
    }

    /// Checks the record's head; returns where the next record starts.
    fn check_head(&self) -> Result<u64, String> {
        let h = &self.head;
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let misc = u16::from_le_bytes([h[4], h[5]]);
        let size = u64::from(u16::from_le_bytes([h[6], h[7]]));
        if size < 8 {
            return Err(format!(
                "a record of type {kind} says it is {size} bytes long, less than its own header"
            ));
        }
        let past = |what: String| {
            format!(
                "{what} runs past the end of the data section at byte {}",
                self.data.end
            )
        };
        let mut end = self.start + size;
        if end > self.data.end {
            return Err(past(format!("a record of type {kind} and {size} bytes")));
        }
        check_mmap2(kind, misc, &h[8..])?;
        if kind == RECORD_AUXTRACE {
            let trace = h
                .get(8..16)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
            end = end
                .checked_add(trace)
                .filter(|&e| e <= self.data.end)
                .ok_or_else(|| past(format!("an AUXTRACE record's {trace} bytes of trace data")))?;
        }
        Ok(end)
    }
}

/// A reader that remembers how far it got, so errors and progress can say where, and checks
/// the records passing through it.
struct Counting<R> {
    inner: R,
    position: Rc<Cell<u64>>,
    records: Option<RecordCheck>,
    /// The first record the check refused: its offset and what is wrong.
    bad_record: Rc<RefCell<Option<(u64, String)>>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let at = self.position.get();
        self.position.set(at + n as u64);
        if let Some(check) = &mut self.records {
            if let Err(bad) = check.feed(at, &buf[..n]) {
                let what = bad.1.clone();
                *self.bad_record.borrow_mut() = Some(bad);
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, what));
            }
        }
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let at = self.inner.seek(pos)?;
        self.position.set(at);
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_is_recognized_in_both_byte_orders() {
        assert!(is_perf_data(b"PERFILE2\x68\0\0\0"));
        assert!(is_perf_data(b"2ELIFREP"));
        assert!(!is_perf_data(b"{\"frames\""));
        assert!(!is_perf_data(b"PERF"));
    }
}
