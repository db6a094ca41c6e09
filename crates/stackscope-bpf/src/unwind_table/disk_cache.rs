//! Unwind tables kept on disk between recordings, so that a program's tables are compiled
//! once: `$XDG_CACHE_HOME/stackscope/unwind` (else `~/.cache/stackscope/unwind`), one file
//! per ELF file named by its build-id and size. A cached table is used only when the file it
//! was compiled from has that build-id and that size, and the cache file is whole and of this
//! format; anything else is compiled afresh. A file without a build-id (rustup's compiler
//! libraries have none) is known by its device, inode and modification time instead, so a
//! file rewritten in place is compiled again. The directory is bounded ([`MAX_BYTES`], oldest
//! files go first) and safe to delete at any time.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use stackscope_stacks::arch::Arch;

use super::{Row, RowKind, TableStats, UnwindTable};

/// What the whole cache may hold; past it the least recently written files are removed.
pub const MAX_BYTES: u64 = 512 << 20;

/// First bytes of a cache file: the format (rows of 8 bytes as [`Row`], this header).
const MAGIC: &[u8; 8] = b"SSUNWT03";

/// The architectures a table can be of, by their number in a cache file.
const ARCHES: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

/// The cache directory, from the environment; `None` without a home.
pub fn dir_from_env() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = match var("XDG_CACHE_HOME") {
        Some(xdg) => PathBuf::from(xdg),
        None => PathBuf::from(var("HOME")?).join(".cache"),
    };
    Some(base.join("stackscope").join("unwind"))
}

/// What names a file's build in the cache: its build-id, else `stat:` and its device, inode
/// and modification time.
pub fn identity(build_id: Option<&[u8]>, meta: &std::fs::Metadata) -> Vec<u8> {
    use std::os::unix::fs::MetadataExt;
    match build_id {
        Some(id) => id.to_vec(),
        None => {
            let mut id = b"stat:".to_vec();
            for n in [
                meta.dev(),
                meta.ino(),
                meta.mtime() as u64,
                meta.mtime_nsec() as u64,
            ] {
                id.extend_from_slice(&n.to_le_bytes());
            }
            id
        }
    }
}

/// Where the table of the file with `build_id` and `size` is kept.
fn entry(dir: &Path, build_id: &[u8], size: u64) -> PathBuf {
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}-{size}.rows"))
}

/// The cached table of the file with `build_id` and `size`, when there is a good one.
pub fn load(dir: &Path, build_id: &[u8], size: u64) -> Option<UnwindTable> {
    let bytes = fs::read(entry(dir, build_id, size)).ok()?;
    decode(&bytes, build_id, size)
}

/// Keeps `table` for the file with `build_id` and `size`, then trims the cache. Failing to
/// write only costs the next recording a compile.
pub fn store(dir: &Path, build_id: &[u8], size: u64, table: &UnwindTable) {
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let path = entry(dir, build_id, size);
    // Written aside and renamed, so a reader never sees half a table.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written =
        fs::File::create(&tmp).and_then(|mut f| f.write_all(&encode(table, build_id, size)));
    match written.and_then(|()| fs::rename(&tmp, &path)) {
        Ok(()) => trim(dir, MAX_BYTES),
        Err(_) => {
            let _ = fs::remove_file(&tmp);
        }
    }
}

fn encode(table: &UnwindTable, build_id: &[u8], size: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + build_id.len() + table.rows.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(build_id.len() as u64).to_le_bytes());
    out.extend_from_slice(build_id);
    out.extend_from_slice(&size.to_le_bytes());
    let arch = ARCHES
        .iter()
        .position(|a| *a == table.arch)
        .unwrap_or(usize::MAX);
    out.extend_from_slice(&(arch as u64).to_le_bytes());
    let s = table.stats;
    for n in [
        s.fdes,
        s.skipped_fdes,
        s.unsupported_rows,
        s.debug_frame_fdes,
    ] {
        out.extend_from_slice(&(n as u64).to_le_bytes());
    }
    out.extend_from_slice(&(table.rows.len() as u64).to_le_bytes());
    for row in &table.rows {
        out.extend_from_slice(&row.addr.to_le_bytes());
        out.extend_from_slice(&row.cfa_offset.to_le_bytes());
        out.push(row.kind as u8);
        out.push(row.aux as u8);
    }
    out
}

/// Reads a cache file front to back.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let part = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(part)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }
}

fn decode(bytes: &[u8], build_id: &[u8], size: u64) -> Option<UnwindTable> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(8)? != MAGIC {
        return None;
    }
    let id_len = r.count()?;
    if r.take(id_len)? != build_id || r.u64()? != size {
        return None;
    }
    let arch = *ARCHES.get(r.count()?)?;
    let stats = TableStats {
        fdes: r.count()?,
        skipped_fdes: r.count()?,
        unsupported_rows: r.count()?,
        debug_frame_fdes: r.count()?,
    };
    let rows = r.count()?;
    let data = r.take(rows.checked_mul(8)?)?;
    if r.at != bytes.len() {
        return None;
    }
    let rows = data
        .chunks_exact(8)
        .map(|r| {
            Some(Row {
                addr: u32::from_le_bytes(r[..4].try_into().ok()?),
                cfa_offset: i16::from_le_bytes(r[4..6].try_into().ok()?),
                kind: row_kind(r[6])?,
                aux: r[7] as i8,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(UnwindTable { arch, rows, stats })
}

fn row_kind(byte: u8) -> Option<RowKind> {
    RowKind::ALL.into_iter().find(|k| *k as u8 == byte)
}

/// Removes the least recently written files until the cache holds at most `max` bytes.
fn trim(dir: &Path, max: u64) {
    let Ok(read) = fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = read
        .filter_map(|e| {
            let e = e.ok()?;
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max {
            break;
        }
        if fs::remove_file(&path).is_ok() || !path.exists() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> UnwindTable {
        table_of(Arch::X86_64)
    }

    fn table_of(arch: Arch) -> UnwindTable {
        let row = |addr, kind, cfa_offset, aux| Row {
            addr,
            cfa_offset,
            kind,
            aux,
        };
        UnwindTable {
            arch,
            rows: vec![
                row(0x1000, RowKind::CfaRsp, 8, 0),
                row(0x1004, RowKind::CfaRbp, 16, -2),
                row(0x1010, RowKind::CfaRspLarge, -1, 0x7f),
                row(0x1020, RowKind::End, 0, 0),
            ],
            stats: TableStats {
                fdes: 3,
                skipped_fdes: 1,
                unsupported_rows: 0,
                debug_frame_fdes: 2,
            },
        }
    }

    #[test]
    fn a_stored_table_comes_back_only_for_its_build_id_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        store(dir.path(), b"\x01\x02", 4096, &t);
        let back = load(dir.path(), b"\x01\x02", 4096).expect("cached");
        assert_eq!(back.rows, t.rows);
        assert_eq!(back.stats, t.stats);
        assert_eq!(back.arch, Arch::X86_64);
        assert!(load(dir.path(), b"\x01\x03", 4096).is_none());
        assert!(load(dir.path(), b"\x01\x02", 4097).is_none());
    }

    #[test]
    fn a_stored_table_keeps_its_architecture() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), b"\x0a", 64, &table_of(Arch::Aarch64));
        let back = load(dir.path(), b"\x0a", 64).expect("cached");
        assert_eq!(back.arch, Arch::Aarch64);
        assert_eq!(back.rows, table_of(Arch::Aarch64).rows);
    }

    #[test]
    fn a_damaged_or_foreign_cache_file_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), b"\xaa", 10, &table());
        let path = entry(dir.path(), b"\xaa", 10);
        let whole = fs::read(&path).unwrap();
        fs::write(&path, &whole[..whole.len() - 3]).unwrap();
        assert!(load(dir.path(), b"\xaa", 10).is_none(), "cut short");
        let mut longer = whole.clone();
        longer.push(0);
        fs::write(&path, &longer).unwrap();
        assert!(
            load(dir.path(), b"\xaa", 10).is_none(),
            "bytes past the rows"
        );
        let mut bad_kind = whole.clone();
        let last_kind = bad_kind.len() - 2;
        bad_kind[last_kind] = 200;
        fs::write(&path, &bad_kind).unwrap();
        assert!(load(dir.path(), b"\xaa", 10).is_none(), "a kind no row has");
        // Another file's entry renamed to this one's name says another build-id.
        store(dir.path(), b"\xbb", 10, &table());
        fs::copy(entry(dir.path(), b"\xbb", 10), &path).unwrap();
        assert!(
            load(dir.path(), b"\xaa", 10).is_none(),
            "another build-id inside"
        );
    }

    #[test]
    fn the_cache_is_trimmed_oldest_first_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        for (i, id) in [b"\x01", b"\x02", b"\x03"].iter().enumerate() {
            store(dir.path(), *id, 1, &table());
            let when =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(i as u64 + 1);
            fs::File::options()
                .write(true)
                .open(entry(dir.path(), *id, 1))
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        let one = fs::metadata(entry(dir.path(), b"\x01", 1)).unwrap().len();
        trim(dir.path(), 2 * one);
        assert!(!entry(dir.path(), b"\x01", 1).exists(), "the oldest goes");
        assert!(entry(dir.path(), b"\x02", 1).exists());
        assert!(entry(dir.path(), b"\x03", 1).exists());
    }
}
