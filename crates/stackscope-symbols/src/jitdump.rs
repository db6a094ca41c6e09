//! Jitdump files (`jit-PID.dump`) that JIT runtimes write for perf (Node's `--perf-prof`,
//! Python's `-X perf_jit`, Java's perf agent): a header, then records, of which two name code:
//! a code load (address, size, name, the code's bytes) and the debug info of the code loaded
//! next at an address (source file and line from each address on). Code moves are followed;
//! unwinding info and every other record are passed over.
//!
//! The layout is the one perf's `jitdump.h` documents: every field in the writer's byte
//! order, which the magic number tells; only files in this machine's order are read.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::foreign::{self, Kind};

const MAGIC: u32 = 0x4A69_5444;
const HEADER_SIZE: usize = 40;
const RECORD_HEADER_SIZE: usize = 16;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;

/// A debug entry's file name made of this one byte stands for the previous entry's file.
const SAME_FILE: &[u8] = b"\xff";

/// The functions of one jitdump, sorted by start address.
#[derive(Debug, Default)]
pub(crate) struct JitDump {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    start: u64,
    end: u64,
    name: Arc<str>,
    /// Where each source line starts, by address.
    lines: Arc<[Line]>,
}

#[derive(Debug, Clone)]
struct Line {
    addr: u64,
    line: u32,
    file: Arc<str>,
}

/// A function of a jitdump, with the source line its address is in when the dump says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct JitFunction<'a> {
    pub name: &'a str,
    pub location: Option<(&'a str, u32)>,
}

impl JitDump {
    /// Reads the jitdump at `path`, which the process named (refused as [`crate::foreign`]
    /// says past [`Kind::JitDump`]'s bound); a missing, unreadable or refused file, or one
    /// that is not a jitdump, names nothing.
    pub(crate) fn read(path: &Path) -> Self {
        match foreign::read(path, Kind::JitDump) {
            Ok(bytes) => Self::parse(&bytes),
            Err(_) => Self::default(),
        }
    }

    /// The functions of a jitdump's bytes; a damaged record ends the reading, keeping what
    /// came before it (a runtime killed while writing leaves a partial last record).
    pub(crate) fn parse(bytes: &[u8]) -> Self {
        let Some(mut at) = records_start(bytes) else {
            return Self::default();
        };
        let mut entries: Vec<Entry> = Vec::new();
        // Debug info comes before the code load it describes, keyed by that code's address.
        let mut pending: HashMap<u64, Arc<[Line]>> = HashMap::new();
        let mut last_at: HashMap<u64, usize> = HashMap::new();
        while let Some((id, body)) = record(bytes, at) {
            at += RECORD_HEADER_SIZE + body.len();
            let parsed = match id {
                CODE_LOAD => code_load(body).map(|(start, size, name)| {
                    let lines = pending.remove(&start).unwrap_or_else(|| Arc::from([]));
                    (start, size, name, lines)
                }),
                CODE_MOVE => code_move(body).and_then(|(old, new, size)| {
                    let moved = &entries[*last_at.get(&old)?];
                    Some((new, size, moved.name.clone(), moved.lines.clone()))
                }),
                CODE_DEBUG_INFO => {
                    if let Some((code, lines)) = debug_info(body) {
                        pending.insert(code, lines.into());
                    }
                    None
                }
                _ => None,
            };
            if let Some((start, size, name, lines)) = parsed {
                if size == 0 {
                    continue;
                }
                last_at.insert(start, entries.len());
                entries.push(Entry {
                    start,
                    end: start.saturating_add(size),
                    name,
                    lines,
                });
            }
        }
        Self {
            entries: crate::perf_map::last_written_per_start(entries, |e| e.start),
        }
    }

    /// The function containing `addr`, and its source line there: that of the last line
    /// starting at or before `addr`, else the function's first (its prologue has none).
    pub(crate) fn lookup(&self, addr: u64) -> Option<JitFunction<'_>> {
        let idx = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries.get(idx.checked_sub(1)?)?;
        if addr >= entry.end {
            return None;
        }
        let at = entry.lines.partition_point(|l| l.addr <= addr);
        let line = entry.lines.get(at.saturating_sub(1));
        Some(JitFunction {
            name: &entry.name,
            location: line.map(|l| (&*l.file, l.line)),
        })
    }
}

/// Where the records begin, when `bytes` is a jitdump in this machine's byte order.
fn records_start(bytes: &[u8]) -> Option<usize> {
    if u32_at(bytes, 0)? != MAGIC {
        return None;
    }
    let size = u32_at(bytes, 8)? as usize;
    (HEADER_SIZE..=bytes.len()).contains(&size).then_some(size)
}

/// The record at `at`: its id and its body (what follows the record header).
fn record(bytes: &[u8], at: usize) -> Option<(u32, &[u8])> {
    let id = u32_at(bytes, at)?;
    let size = u32_at(bytes, at + 4)? as usize;
    let end = at.checked_add(size)?;
    if size < RECORD_HEADER_SIZE || end > bytes.len() {
        return None;
    }
    Some((id, &bytes[at + RECORD_HEADER_SIZE..end]))
}

/// A code load's (code address, code size, name): after pid and tid, the address the code
/// runs at, the same again, its size and index, then the name; the code's bytes follow.
fn code_load(body: &[u8]) -> Option<(u64, u64, Arc<str>)> {
    let start = u64_at(body, 16)?;
    let size = u64_at(body, 24)?;
    let (name, _) = c_string(body, 40)?;
    Some((start, size, String::from_utf8_lossy(name).into()))
}

/// A code move's (old address, new address, size), after pid, tid and the mapped address.
fn code_move(body: &[u8]) -> Option<(u64, u64, u64)> {
    Some((u64_at(body, 16)?, u64_at(body, 24)?, u64_at(body, 32)?))
}

/// A debug info record's code address and lines: `code_addr`, `nr_entry`, then per entry its
/// address, line, discriminator and NUL-terminated file name. A record whose entries do not
/// end where it does (up to its padding to 8 bytes), or that names a file with bytes no path
/// has, gives no lines: Node 20 writes, for baseline (Sparkplug) code, as many bytes as the
/// script's name from somewhere else, NULs included, and what follows them is no entry.
fn debug_info(body: &[u8]) -> Option<(u64, Vec<Line>)> {
    let code = u64_at(body, 0)?;
    let count = u64_at(body, 8)?;
    let mut at = 16;
    let mut lines = Vec::new();
    let mut file: Arc<str> = Arc::from("");
    for _ in 0..count {
        let addr = u64_at(body, at)?;
        let line = u32_at(body, at + 8)?;
        let (name, next) = c_string(body, at + 16)?;
        if name != SAME_FILE {
            file = match std::str::from_utf8(name) {
                Ok(name) if !name.chars().any(char::is_control) => name.into(),
                _ => return None,
            };
        }
        at = next;
        if line > 0 && !file.is_empty() {
            lines.push(Line {
                addr,
                line,
                file: file.clone(),
            });
        }
    }
    if body.len() - at >= 8 {
        return None;
    }
    lines.sort_by_key(|l| l.addr);
    Some((code, lines))
}

/// The NUL-terminated string at `at`, and where what follows it begins.
fn c_string(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = bytes.get(at..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    Some((&rest[..len], at + len + 1))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(word.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_ne_bytes(word.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut out = Vec::new();
        for word in [MAGIC, 1, HEADER_SIZE as u32, 62, 0, 4242] {
            out.extend(word.to_ne_bytes());
        }
        out.extend(0u64.to_ne_bytes()); // timestamp
        out.extend(0u64.to_ne_bytes()); // flags
        out
    }

    fn push_record(out: &mut Vec<u8>, id: u32, body: &[u8]) {
        out.extend(id.to_ne_bytes());
        out.extend(((RECORD_HEADER_SIZE + body.len()) as u32).to_ne_bytes());
        out.extend(0u64.to_ne_bytes());
        out.extend(body);
    }

    fn load(start: u64, size: u64, name: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(4242u32.to_ne_bytes());
        body.extend(4242u32.to_ne_bytes());
        for word in [start, start, size, 7] {
            body.extend(word.to_ne_bytes());
        }
        body.extend(name.as_bytes());
        body.push(0);
        body.extend(vec![0x90; size as usize]);
        body
    }

    fn debug(code: u64, lines: &[(u64, u32, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(code.to_ne_bytes());
        body.extend((lines.len() as u64).to_ne_bytes());
        for (addr, line, file) in lines {
            body.extend(addr.to_ne_bytes());
            body.extend(line.to_ne_bytes());
            body.extend(0u32.to_ne_bytes());
            body.extend(*file);
            body.push(0);
        }
        body
    }

    #[test]
    fn code_loads_name_their_code_and_debug_info_gives_lines() {
        let mut dump = header();
        push_record(
            &mut dump,
            CODE_DEBUG_INFO,
            &debug(
                0x1000,
                &[
                    (0x1004, 3, b"app.js"),
                    (0x1010, 5, SAME_FILE),
                    (0x1018, 9, b"lib.js"),
                ],
            ),
        );
        // Junk for a file name, as Node 20 writes for baseline code: no lines.
        push_record(
            &mut dump,
            CODE_DEBUG_INFO,
            &debug(
                0x2000,
                &[(0x2000, 1, b"\xcd\xe7\x01"), (0x2004, 2, b"app.js")],
            ),
        );
        // Entries that end well before their record: misread, no lines.
        let mut short = debug(0x3000, &[(0x3000, 1, b"app.js")]);
        short.extend([b'x'; 12]);
        push_record(&mut dump, CODE_DEBUG_INFO, &short);
        push_record(&mut dump, CODE_LOAD, &load(0x3000, 0x10, "padded"));
        push_record(
            &mut dump,
            CODE_LOAD,
            &load(0x1000, 0x20, "JS:*leaf app.js:3"),
        );
        push_record(&mut dump, CODE_LOAD, &load(0x2000, 0x10, "stub"));
        push_record(&mut dump, 4, &[0; 24]); // unwinding info, passed over
        let dump = JitDump::parse(&dump);
        let at = |addr| dump.lookup(addr);
        assert_eq!(at(0x1000).unwrap().location, Some(("app.js", 3)));
        assert_eq!(at(0x100f).unwrap().location, Some(("app.js", 3)));
        assert_eq!(at(0x1010).unwrap().location, Some(("app.js", 5)));
        assert_eq!(
            at(0x101f),
            Some(JitFunction {
                name: "JS:*leaf app.js:3",
                location: Some(("lib.js", 9))
            })
        );
        assert_eq!(at(0x1020), None);
        assert_eq!(at(0x2008).unwrap().name, "stub");
        assert_eq!(at(0x2008).unwrap().location, None);
        assert_eq!(at(0x3008).unwrap().location, None);
        assert_eq!(at(0xfff), None);
    }

    #[test]
    fn moved_code_keeps_its_name_and_reused_addresses_name_the_last_code() {
        let mut dump = header();
        push_record(&mut dump, CODE_LOAD, &load(0x1000, 0x10, "old"));
        let mut moved = Vec::new();
        moved.extend(4242u32.to_ne_bytes());
        moved.extend(4242u32.to_ne_bytes());
        for word in [0x5000u64, 0x1000, 0x5000, 0x10, 7] {
            moved.extend(word.to_ne_bytes());
        }
        push_record(&mut dump, CODE_MOVE, &moved);
        push_record(&mut dump, CODE_LOAD, &load(0x1000, 0x8, "new"));
        let dump = JitDump::parse(&dump);
        assert_eq!(dump.lookup(0x5004).unwrap().name, "old");
        assert_eq!(dump.lookup(0x1004).unwrap().name, "new");
        assert_eq!(dump.lookup(0x100c), None);
    }

    #[test]
    fn a_damaged_tail_keeps_what_came_before_and_other_files_name_nothing() {
        let mut dump = header();
        push_record(&mut dump, CODE_LOAD, &load(0x1000, 0x10, "whole"));
        let whole = dump.len();
        push_record(&mut dump, CODE_LOAD, &load(0x2000, 0x10, "cut"));
        dump.truncate(whole + 20);
        let parsed = JitDump::parse(&dump);
        assert_eq!(parsed.lookup(0x1000).unwrap().name, "whole");
        assert_eq!(parsed.lookup(0x2000), None);
        let mut swapped = header();
        swapped[..4].copy_from_slice(&MAGIC.swap_bytes().to_ne_bytes());
        assert!(JitDump::parse(&swapped).entries.is_empty());
        assert!(JitDump::parse(b"0x1000 10 a perf map line\n")
            .entries
            .is_empty());
        // A record claiming less than its own header.
        let mut tiny = header();
        tiny.extend(0u32.to_ne_bytes());
        tiny.extend(4u32.to_ne_bytes());
        tiny.extend([0; 8]);
        assert!(JitDump::parse(&tiny).entries.is_empty());
    }
}
