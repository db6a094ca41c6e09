//! Perf map files (`/tmp/perf-PID.map`) that JIT runtimes write: one `START SIZE name` line per
//! generated function, START and SIZE in hex.

use std::path::Path;

use crate::foreign::{self, Kind};

/// The functions of one perf map, sorted by start address.
#[derive(Debug, Default)]
pub(crate) struct PerfMap {
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    start: u64,
    end: u64,
    name: String,
}

impl PerfMap {
    /// Reads the perf map at `path`, which the process named (a FIFO, a device or a file past
    /// [`Kind::PerfMap`]'s bound is refused, see [`crate::foreign`]); a missing, unreadable or
    /// refused file is an empty map, since most processes have none.
    pub(crate) fn read(path: &Path) -> Self {
        match foreign::read(path, Kind::PerfMap) {
            Ok(bytes) => Self::parse(&String::from_utf8_lossy(&bytes)),
            Err(_) => Self::default(),
        }
    }

    pub(crate) fn parse(text: &str) -> Self {
        let entries: Vec<Entry> = text.lines().filter_map(parse_line).collect();
        Self {
            entries: last_written_per_start(entries, |e| e.start),
        }
    }

    /// The name of the function containing `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<&str> {
        let idx = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries.get(idx.checked_sub(1)?)?;
        (addr < entry.end).then_some(entry.name.as_str())
    }
}

fn parse_line(line: &str) -> Option<Entry> {
    let line = line.trim_end_matches('\r');
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.split_once(' ')?;
    let parse_hex = |s: &str| {
        let s = s.trim();
        let s = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        u64::from_str_radix(s, 16).ok()
    };
    let start = parse_hex(start)?;
    let size = parse_hex(size)?;
    let name = name.trim();
    if name.is_empty() || size == 0 {
        return None;
    }
    Some(Entry {
        start,
        end: start.saturating_add(size),
        name: name.to_string(),
    })
}

/// JIT functions in file order, sorted by start with one per start: a JIT reusing an
/// address writes the new function after the old, so the last one written wins (the sort is
/// stable).
pub(crate) fn last_written_per_start<E>(mut entries: Vec<E>, start: impl Fn(&E) -> u64) -> Vec<E> {
    entries.sort_by_key(&start);
    let mut deduped: Vec<E> = Vec::with_capacity(entries.len());
    for entry in entries {
        match deduped.last_mut() {
            Some(last) if start(last) == start(&entry) => *last = entry,
            _ => deduped.push(entry),
        }
    }
    deduped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_looks_up() {
        let map = PerfMap::parse(
            "1000 10 first fn\n\
             0x2000 0x20 second\n\
             garbage line\n\
             3000 0 empty\n\
             2000 8 replaced\n",
        );
        assert_eq!(map.lookup(0x1000), Some("first fn"));
        assert_eq!(map.lookup(0x100f), Some("first fn"));
        assert_eq!(map.lookup(0x1010), None);
        assert_eq!(map.lookup(0xfff), None);
        assert_eq!(map.lookup(0x2004), Some("replaced"));
        assert_eq!(map.lookup(0x2010), None);
        assert_eq!(map.lookup(0x3000), None);
    }
}
