//! A perf.data file's header, checked before the parser trusts it: its sections lie inside
//! the file, and the counts in the sections read before the records fit their sections (a
//! damaged count must not make the parser reserve memory for billions of entries). What it
//! gives is where the records lie and how they are framed; damage is an error naming its byte
//! offset.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;

use super::MAGIC_SWAPPED;

/// Where a file's records lie and how they are framed.
pub(super) struct Layout {
    /// The data section, or everything after a pipe's header.
    pub(super) records: Range<u64>,
    /// Written to a pipe (`perf record -o -`): a 16-byte header, then records to the end of
    /// the file, the events described by records among them.
    pub(super) pipe: bool,
    pub(super) big_endian: bool,
}

/// Checks that the header's sections lie inside the file and that the counts in the
/// sections read before the records fit their sections: a damaged count must not make the
/// parser reserve memory for billions of entries. Errs with an offset and what is wrong;
/// returns where the records lie.
pub(super) fn check_layout<R: Read + Seek>(
    input: &mut R,
    len: u64,
) -> Result<Layout, (u64, String)> {
    let start = read_at(input, 0, PIPE_HEADER_SIZE)?;
    let order = Order {
        big: start.starts_with(MAGIC_SWAPPED),
    };
    if order.word(&start, 8) == PIPE_HEADER_SIZE as u64 {
        return Ok(Layout {
            records: PIPE_HEADER_SIZE as u64..len,
            pipe: true,
            big_endian: order.big,
        });
    }
    let head = read_at(input, 0, HEADER_SIZE)?;
    let attrs = order.section(&head, 24);
    let data = order.section(&head, 40);
    inside(len, attrs, 24, "attributes")?;
    inside(len, data, 40, "data")?;
    inside(len, order.section(&head, 56), 56, "event types")?;
    let features: Vec<u32> = (0..256u32)
        .filter(|&bit| order.word(&head, 72 + (bit / 64) as usize * 8) & (1 << (bit % 64)) != 0)
        .collect();
    let table_at = data.0 + data.1;
    let table = read_at(input, table_at, features.len() * 16)?;
    for (i, &feature) in features.iter().enumerate() {
        let sec = order.section(&table, i * 16);
        let at = table_at + i as u64 * 16;
        inside(len, sec, at, &format!("header feature {feature}"))?;
        check_counts(input, order, feature, sec)?;
    }
    Ok(Layout {
        records: data.0..data.0 + data.1,
        pipe: false,
        big_endian: order.big,
    })
}

/// Checks that the entries a header feature counts fit in its section, for the features
/// the parser reads counts from.
fn check_counts<R: Read + Seek>(
    input: &mut R,
    order: Order,
    feature: u32,
    sec: (u64, u64),
) -> Result<(), (u64, String)> {
    let counted = match feature {
        FEATURE_CMDLINE => 4,
        FEATURE_EVENT_DESC => 8,
        _ => return Ok(()),
    };
    let body = read_at(
        input,
        sec.0,
        usize::try_from(sec.1).unwrap_or(usize::MAX).min(1 << 24),
    )?;
    let count = |at: usize| {
        body.get(at..at.saturating_add(4))
            .map_or(0, |b| u64::from(order.u32(b)))
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
    Ok(())
}

/// `n` bytes at offset `at`, or where the file ends too early.
fn read_at<R: Read + Seek>(input: &mut R, at: u64, n: usize) -> Result<Vec<u8>, (u64, String)> {
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
}

/// The file's byte order, for the fields the checks read.
#[derive(Clone, Copy)]
pub(super) struct Order {
    pub(super) big: bool,
}

impl Order {
    pub(super) fn u16(self, b: &[u8]) -> u16 {
        let b = [b[0], b[1]];
        if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }

    pub(super) fn u32(self, b: &[u8]) -> u32 {
        let b = [b[0], b[1], b[2], b[3]];
        if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    pub(super) fn word(self, b: &[u8], at: usize) -> u64 {
        let b: [u8; 8] = b[at..at + 8].try_into().unwrap_or_default();
        if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        }
    }

    /// A section descriptor: (offset, size).
    fn section(self, b: &[u8], at: usize) -> (u64, u64) {
        (self.word(b, at), self.word(b, at + 8))
    }
}

/// Checks that a section described at byte `at` lies inside a file of `len` bytes.
fn inside(len: u64, (offset, size): (u64, u64), at: u64, what: &str) -> Result<(), (u64, String)> {
    if offset.checked_add(size).is_some_and(|end| end <= len) {
        Ok(())
    } else {
        Err((
            at,
            format!("the {what} section ({size} bytes at {offset}) lies past the end"),
        ))
    }
}

/// perf_file_header: magic, size, attr_size, three sections, the feature bitmap.
const HEADER_SIZE: usize = 104;
/// perf_pipe_file_header: magic, size.
const PIPE_HEADER_SIZE: usize = 16;
const FEATURE_CMDLINE: u32 = 11;
const FEATURE_EVENT_DESC: u32 = 12;
