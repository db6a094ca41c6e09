//! What a damaged perf.data file must not get past: the header's sections and counts are
//! checked before the parser trusts them, and each record is checked as its bytes stream to
//! the parser, so damage is an error naming its byte offset instead of a panic or a huge
//! allocation.

use std::cell::{Cell, RefCell};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::rc::Rc;

use super::MAGIC;

/// Checks that the header's sections lie inside the file and that the counts in the
/// sections read before the records fit their sections: a damaged count must not make the
/// parser reserve memory for billions of entries. Errs with an offset and what is wrong;
/// returns where the records lie (for a little-endian file).
pub(super) fn check_layout<R: Read + Seek>(
    input: &mut R,
    len: u64,
) -> Result<Option<Range<u64>>, (u64, String)> {
    let head = read_at(input, 0, HEADER_SIZE)?;
    if !head.starts_with(MAGIC) {
        // Big-endian files are left to the parser's own checks.
        return Ok(None);
    }
    let attrs = section(&head, 24);
    let data = section(&head, 40);
    inside(len, attrs, 24, "attributes")?;
    inside(len, data, 40, "data")?;
    inside(len, section(&head, 56), 56, "event types")?;
    let features: Vec<u32> = (0..256u32)
        .filter(|&bit| word(&head, 72 + (bit / 64) as usize * 8) & (1 << (bit % 64)) != 0)
        .collect();
    let table_at = data.0 + data.1;
    let table = read_at(input, table_at, features.len() * 16)?;
    for (i, &feature) in features.iter().enumerate() {
        let sec = section(&table, i * 16);
        let at = table_at + i as u64 * 16;
        inside(len, sec, at, &format!("header feature {feature}"))?;
        check_counts(input, feature, sec)?;
    }
    Ok(Some(data.0..data.0 + data.1))
}

/// Checks that the entries a header feature counts fit in its section, for the features
/// the parser reads counts from.
fn check_counts<R: Read + Seek>(
    input: &mut R,
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

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// A section descriptor: (offset, size).
fn section(b: &[u8], at: usize) -> (u64, u64) {
    (word(b, at), word(b, at + 8))
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
pub(super) fn check_mmap2(record_type: u32, misc: u16, body: &[u8]) -> Result<(), String> {
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
pub(super) struct RecordCheck {
    data: Range<u64>,
    /// Where the record being read starts.
    start: u64,
    /// Its first bytes, up to [`RECORD_HEAD`].
    head: Vec<u8>,
    /// Where the record after it starts, once its head has been checked.
    next: Option<u64>,
}

impl RecordCheck {
    pub(super) fn new(data: Range<u64>) -> Self {
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
pub(super) struct Counting<R> {
    pub(super) inner: R,
    pub(super) position: Rc<Cell<u64>>,
    pub(super) records: Option<RecordCheck>,
    /// The first record the check refused: its offset and what is wrong.
    pub(super) bad_record: Rc<RefCell<Option<(u64, String)>>>,
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
