//! Reading a `perf.data` file as `perf record` writes it: the records of one sampled event are
//! replayed through the same collector `stackscope record` uses (process maps from the mmap,
//! comm, fork and exit records; user stacks unwound from the sample's registers and stack copy,
//! or taken from its frame-pointer callchain; kernel callchains as they are), then symbolized
//! once per unique address into a profile, handed back as a [`Recording`] with its hints.
//!
//! The file is read where it was recorded: binaries, their unwind info and kernel symbols come
//! from this machine. The build-ids in the file's header tell whether a binary on disk is still
//! the one that ran; one that is not, or is missing (a file recorded on another machine), is
//! looked up in perf's build-id cache.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use linux_perf_data::{DsoKey, PerfFile, PerfFileReader, PerfFileRecord};
use stackscope_profile::Metadata;
use stackscope_stacks::{Hint, Recording};

use crate::event::Event;
use crate::record::Collector;
use crate::sampler::SamplerConfig;
use stackscope_process::maps::{own_vdso, Mapping};

mod bounds;
mod check;
mod layout;
mod replay;

pub use bounds::{MAX_HELD, MAX_UNPACKED};
use check::{Checked, Watch};
use layout::check_layout;
use replay::Replay;

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

/// Reads the perf.data file at `path` into a recording. `progress` is called now and then while
/// the records are read, and once more when symbolization starts (with `done == total`).
pub fn read_perf_data(
    path: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<Recording, PerfDataError> {
    let file = File::open(path)
        .map_err(|e| PerfDataError::new(format!("cannot open {}: {e}", path.display())))?;
    read_perf_data_from(BufReader::with_capacity(1 << 20, file), path, progress)
}

/// Reads a perf.data file from `input`, already open (the format is read out of order, so it
/// must seek); `path` names it in messages. Both layouts perf writes are read: a file's, and a
/// pipe's (`perf record -o -`), whose records describe its events. Every record is checked
/// before the parser sees it, so a damaged file is an error naming the record's byte offset.
/// A record past what the parser may hold ([`MAX_UNPACKED`], [`MAX_HELD`]) ends the reading:
/// the recording holds what came before, and its `failure` says where and why.
pub fn read_perf_data_from<R: Read + Seek>(
    mut input: R,
    path: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<Recording, PerfDataError> {
    let total = input
        .seek(SeekFrom::End(0))
        .map_err(|e| PerfDataError::new(format!("cannot read {}: {e}", path.display())))?;
    let layout = check_layout(&mut input, total)
        .map_err(|(at, what)| PerfDataError::damaged(path, at, total, what))?;
    input
        .seek(SeekFrom::Start(0))
        .map_err(|e| PerfDataError::new(format!("cannot read {}: {e}", path.display())))?;
    let watch = Watch::default();
    let position = watch.position.clone();
    let pipe = layout.pipe;
    let reader = Checked::new(input, layout, &watch);
    // A record the check refused is the error, whatever the parser made of the failed read.
    let damaged = |e: &dyn std::fmt::Display| match watch.bad_record.borrow_mut().take() {
        Some((at, what)) => PerfDataError::damaged(path, at, total, what),
        None => PerfDataError::damaged(path, position.get(), total, e),
    };
    let parsed = match pipe {
        true => PerfFileReader::parse_pipe(reader),
        false => PerfFileReader::parse_file(reader),
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = parsed.map_err(|e| damaged(&e))?;

    let (chosen, event) = chosen_event(&perf_file)
        .ok_or_else(|| PerfDataError::damaged(path, 0, total, "no event is described"))?;
    let attr = *perf_file.event_attributes()[chosen].attributes();
    let config = replay::sampler_config(&attr);
    let command: Vec<String> = perf_file
        .cmdline()
        .ok()
        .flatten()
        .map(|args| args.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();

    let mut collector = Collector::new(&config).replaying();
    let build_ids = BuildIds::from_header(&perf_file);
    let arch = perf_file.arch().ok().flatten();
    let mut replay = Replay::new(build_ids, &attr, (perf_file.endian(), arch));
    let mut records = 0u64;
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
        replay
            .record(&record, attr_index == chosen, &mut collector)
            .map_err(|what| PerfDataError::damaged(path, position.get(), total, what))?;
    }
    progress(Progress { done: total, total });
    let mut recording = into_recording(collector, &replay, &config, event, command);
    if let Some((at, what)) = watch.stopped.borrow_mut().take() {
        recording.failure = Some(format!(
            "{} was read only up to byte {at} of {total}: {what}, more than stackscope reads; the profile holds the records before it",
            path.display()
        ));
    }
    Ok(recording)
}

/// The profile of what was replayed, with the file's metadata, and its hints.
fn into_recording(
    mut collector: Collector,
    replay: &Replay,
    config: &SamplerConfig,
    event: String,
    command: Vec<String>,
) -> Recording {
    collector.handle(Event::Lost {
        count: replay.lost(),
    });
    let meta = Metadata {
        source: "perf.data".into(),
        event,
        frequency_hz: config.frequency,
        period: config.period,
        duration_secs: replay.duration_secs(),
        command,
        ..Metadata::default()
    };
    let mut recording = collector.finish(meta, config, false);
    if config.kernel
        && replay
            .kernel_text()
            .is_some_and(|t| running_kernel_text() != Some(t))
    {
        recording.hints.push(Hint::Said(
            "kernel frames are named from the running kernel, which is not the recorded one (or was booted again since): they may be misnamed".into(),
        ));
    }
    recording
}

/// The event whose samples make the profile, and its name: cpu-clock (what stackscope itself
/// samples) when the file has it, else the first. perf names events with their modifiers
/// (`cpu-clock:pppH`); the profile keeps the event. None when the file describes no event.
fn chosen_event(file: &PerfFile) -> Option<(usize, String)> {
    let attrs = file.event_attributes();
    let name = |i: usize| {
        attrs[i]
            .name()
            .and_then(|n| n.split(':').next())
            .unwrap_or("unknown event")
    };
    if attrs.is_empty() {
        return None;
    }
    let chosen = (0..attrs.len())
        .find(|&i| name(i) == "cpu-clock")
        .unwrap_or(0);
    Some((chosen, name(chosen).to_string()))
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

/// The build-ids perf stored in the header for every binary a sample hit, and where each such
/// binary is found now.
struct BuildIds {
    by_path: HashMap<Vec<u8>, Arc<[u8]>>,
    /// The recorded kernel's vDSO, when a sample hit it.
    vdso: Option<Arc<[u8]>>,
    /// Per path: the file to read for it (the path itself, or perf's cached copy when the file
    /// on disk was rebuilt since).
    located: HashMap<Vec<u8>, Arc<str>>,
    cache_dir: Option<PathBuf>,
}

impl BuildIds {
    fn from_header(file: &PerfFile) -> Self {
        let mut by_path = HashMap::new();
        let mut vdso = None;
        for (key, info) in file.build_ids().unwrap_or_default() {
            if info.build_id.is_empty() {
                continue;
            }
            match key {
                DsoKey::User { full_path, .. } => {
                    by_path.insert(full_path, Arc::from(info.build_id.as_slice()));
                }
                DsoKey::Vdso64 => vdso = Some(Arc::from(info.build_id.as_slice())),
                _ => {}
            }
        }
        BuildIds {
            by_path,
            vdso,
            located: HashMap::new(),
            cache_dir: std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".debug")),
        }
    }

    /// A mapping as its mmap record tells it, with its binary's build-id from the header and
    /// the file that holds that build; the record's own build-id when the header has none.
    fn locate_mapping(&mut self, mut mapping: Mapping) -> Mapping {
        if &*mapping.path == "[vdso]" {
            return self.locate_vdso(mapping);
        }
        if let Some(id) = self.by_path.get(mapping.path.as_bytes()).cloned() {
            mapping.path = self.locate(&mapping.path, &id);
            mapping.build_id = Some(id);
        }
        mapping
    }

    /// The vDSO mapping as the file's header tells it: this machine's own vDSO stands in for
    /// it when the build-ids agree (or the header names none); another kernel's (a recording
    /// made on another machine, or before a kernel update) is read from perf's build-id cache
    /// (`~/.debug/[vdso]/BUILDID/vdso`), and without a copy there is left unread rather than
    /// walked and named as this machine's.
    fn locate_vdso(&mut self, mut mapping: Mapping) -> Mapping {
        let Some(id) = self.vdso.clone() else {
            return mapping;
        };
        if own_vdso()
            .and_then(|own| own.build_id().map(<[u8]>::to_vec))
            .as_deref()
            == Some(&id)
        {
            return mapping;
        }
        let cached = self
            .cache_dir
            .as_ref()
            .and_then(|d| cached_copy(d, &id, "vdso"));
        mapping.path = match cached {
            Some(path) => Arc::from(path.to_string_lossy().as_ref()),
            // A pseudo-file no reader opens: its frames show the module and address.
            None => Arc::from("[vdso of the recorded kernel]"),
        };
        mapping.build_id = Some(id);
        mapping
    }

    /// The path to read for `path`: itself when its build-id matches, else perf's cached copy
    /// (`~/.debug/.build-id/xx/rest/elf`) when there is one: for a binary rebuilt since, and
    /// for one this machine does not have (a recording made on another, its cache brought
    /// along as `perf archive` packs it).
    fn locate(&mut self, path: &Arc<str>, id: &[u8]) -> Arc<str> {
        if let Some(found) = self.located.get(path.as_bytes()) {
            return found.clone();
        }
        let text = path.clone();
        let mut found = text.clone();
        let on_disk = file_build_id(Path::new(&*text));
        if on_disk.as_deref() != Some(id) {
            if let Some(cached) = self
                .cache_dir
                .as_ref()
                .and_then(|d| cached_copy(d, id, "elf"))
            {
                found = Arc::from(cached.to_string_lossy().as_ref());
            }
        }
        self.located.insert(path.as_bytes().to_vec(), found.clone());
        found
    }
}

/// perf's build-id cache entry for `id`, if it holds the file: `name` is `elf` for a binary,
/// `vdso` for a vDSO image.
fn cached_copy(dir: &Path, id: &[u8], name: &str) -> Option<PathBuf> {
    let hex = stackscope_symbols::elf::build_id_hex(id);
    let (head, rest) = hex.split_at_checked(2)?;
    // The entry links to `~/.debug/ORIGINAL/PATH/BUILDID/elf` (`~/.debug/[vdso]/BUILDID/vdso`):
    // resolved, the original file's name stays in the path.
    let path = dir
        .join(".build-id")
        .join(head)
        .join(rest)
        .join(name)
        .canonicalize()
        .ok()?;
    (file_build_id(&path).as_deref() == Some(id)).then_some(path)
}

/// The GNU build-id note of an ELF file.
fn file_build_id(path: &Path) -> Option<Vec<u8>> {
    let elf = stackscope_symbols::elf::ElfFile::open(path).ok()?;
    elf.build_id().map(<[u8]>::to_vec)
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
