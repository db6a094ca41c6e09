//! What a damaged or hostile perf.data file must not get past: the header's sections and counts
//! are checked before the parser trusts them, and each record is checked, and counted against
//! the bounds in [`super::bounds`], before its bytes reach the parser. Damage is an error
//! naming its byte offset instead of a panic or a huge allocation; a record past a bound ends
//! the records there, so the parser finishes with those before it.

use std::cell::{Cell, RefCell};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::rc::Rc;

use super::bounds::{Refused, Unpack, Window, RECORD_FINISHED_ROUND};
use super::MAGIC_SWAPPED;
use crate::decode::{check_mmap2, MMAP2_BUILD_ID_LEN_AT};

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

/// The file's byte order, for the fields read here.
#[derive(Clone, Copy)]
struct Order {
    big: bool,
}

impl Order {
    fn u16(self, b: &[u8]) -> u16 {
        let b = [b[0], b[1]];
        if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }

    fn u32(self, b: &[u8]) -> u32 {
        let b = [b[0], b[1], b[2], b[3]];
        if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    fn word(self, b: &[u8], at: usize) -> u64 {
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

/// Record types whose bodies the checks below look into.
const RECORD_HEADER_ATTR: u32 = 64;
const RECORD_AUXTRACE: u32 = 71;
const RECORD_HEADER_FEATURE: u32 = 80;
const RECORD_COMPRESSED: u32 = 81;
const RECORD_COMPRESSED2: u32 = 83;
/// The bytes of a record the checks read: its header and the start of its body.
const RECORD_HEAD: usize = 8 + MMAP2_BUILD_ID_LEN_AT + 1;

/// The records, read one ahead of the parser: each is read from the file and checked when the
/// parser comes to its first byte, then handed over. Past a bound the parser is handed the end
/// of the records instead.
struct Records {
    layout: Layout,
    /// Whether the parser reads records now: a file's, once it has gone to the data section;
    /// a pipe's, from the start.
    armed: bool,
    /// Where the next record starts.
    next: u64,
    /// The current record's bytes read ahead (its header, and its body as far as checked), and
    /// how many of them the parser has had.
    ahead: Vec<u8>,
    served: usize,
    /// A pipe's records still describing its events (the parser reads those apart).
    describing: bool,
    unpack: Unpack,
    window: Window,
    /// Once a bound was crossed: the end of the records the parser is handed instead.
    end: Option<End>,
    /// The bound crossed, and where: taken by the reader.
    stopped: Option<(u64, String)>,
}

impl Records {
    fn new(layout: Layout) -> Self {
        Records {
            armed: layout.pipe,
            next: layout.records.start,
            describing: layout.pipe,
            layout,
            ahead: Vec::new(),
            served: 0,
            unpack: Unpack::default(),
            window: Window::default(),
            end: None,
            stopped: None,
        }
    }

    fn order(&self) -> Order {
        Order {
            big: self.layout.big_endian,
        }
    }

    /// Serves the parser's read at `at` when it is the gate's to serve: a record read ahead,
    /// the end handed over past a bound. None: the bytes come from the file as they are.
    /// Errs with the offset of a damaged record and what is wrong.
    fn serve<R: Read>(
        &mut self,
        at: u64,
        buf: &mut [u8],
        inner: &mut R,
    ) -> Result<Option<usize>, (u64, String)> {
        if !self.armed || buf.is_empty() {
            return Ok(None);
        }
        if self.served == self.ahead.len() && self.end.is_none() {
            if at != self.next || at >= self.layout.records.end {
                return Ok(None);
            }
            let ends = match self.load(inner, at) {
                Ok(true) => None,
                Ok(false) => Some(End::new(0, &self.layout)),
                Err(Refused::Bound(what)) => {
                    self.stopped = Some((at, what));
                    Some(End::new(self.layout.records.end - at, &self.layout))
                }
                Err(Refused::Damaged(what)) => return Err((at, what)),
            };
            if ends.is_some() {
                // Nothing of the record read ahead goes to the parser.
                self.ahead.clear();
                self.end = ends;
            }
        }
        if self.served < self.ahead.len() {
            let n = buf.len().min(self.ahead.len() - self.served);
            buf[..n].copy_from_slice(&self.ahead[self.served..self.served + n]);
            self.served += n;
            return Ok(Some(n));
        }
        Ok(self
            .end
            .as_mut()
            .map(|end| end.read(buf, self.layout.big_endian)))
    }

    /// Reads the record at `at` ahead, checks it and counts what the parser will hold of it.
    /// False when a pipe's records end here (a record cut short, as when perf was stopped).
    fn load<R: Read>(&mut self, inner: &mut R, at: u64) -> Result<bool, Refused> {
        let order = self.order();
        let records_end = self.layout.records.end;
        let past = |what: String| {
            Refused::Damaged(format!(
                "{what} runs past the end of the data section at byte {records_end}"
            ))
        };
        self.served = 0;
        self.ahead.clear();
        if records_end - at < 8 {
            return match self.layout.pipe {
                true => Ok(false),
                false => Err(past("a record header".into())),
            };
        }
        let unreadable = |e: std::io::Error| Refused::Damaged(format!("cannot read a record: {e}"));
        self.ahead.resize(8, 0);
        inner.read_exact(&mut self.ahead).map_err(unreadable)?;
        let kind = order.u32(&self.ahead[0..4]);
        let misc = order.u16(&self.ahead[4..6]);
        let size = order.u16(&self.ahead[6..8]);
        if size < 8 {
            return Err(Refused::Damaged(format!(
                "a record of type {kind} says it is {size} bytes long, less than its own header"
            )));
        }
        // The parser reads no body of a round's end: it must have none.
        if kind == RECORD_FINISHED_ROUND && size != 8 {
            return Err(Refused::Damaged(format!(
                "a FINISHED_ROUND record says it is {size} bytes long (perf writes 8)"
            )));
        }
        let mut end = at + u64::from(size);
        if end > records_end {
            return match self.layout.pipe {
                true => Ok(false),
                false => Err(past(format!("a record of type {kind} and {size} bytes"))),
            };
        }
        let compressed = matches!(kind, RECORD_COMPRESSED | RECORD_COMPRESSED2);
        let wanted = match compressed {
            true => usize::from(size),
            false => usize::from(size).min(RECORD_HEAD),
        };
        self.ahead.resize(wanted, 0);
        inner.read_exact(&mut self.ahead[8..]).map_err(unreadable)?;
        let body = &self.ahead[8..];
        check_mmap2(kind, misc, body.into()).map_err(Refused::Damaged)?;
        // A pipe's first record after its event descriptions is read with them, as a record
        // alone: an AUXTRACE record's trace does not follow it there, a compressed record is
        // not unpacked.
        let first_event =
            self.describing && !matches!(kind, RECORD_HEADER_ATTR | RECORD_HEADER_FEATURE);
        if first_event {
            self.describing = false;
        }
        if kind == RECORD_AUXTRACE && !first_event {
            let trace = body.get(..8).map_or(0, |b| order.word(b, 0));
            end = end
                .checked_add(trace)
                .filter(|&e| e <= records_end)
                .ok_or_else(|| past(format!("an AUXTRACE record's {trace} bytes of trace data")))?;
        }
        match kind {
            RECORD_FINISHED_ROUND if !first_event => self.window.finish_round(),
            RECORD_COMPRESSED | RECORD_COMPRESSED2 if !first_event => {
                let data = compressed_data(kind, body, order)?;
                self.unpack.record(data, order.big, &mut self.window)?;
            }
            _ => self.window.add(end - at).map_err(Refused::Bound)?,
        }
        self.next = end;
        Ok(true)
    }

    /// The reader moved to `at`: what was read ahead is gone. A file's records are read once
    /// the parser goes to the data section, from a fresh start.
    fn seeked(&mut self, at: u64) {
        self.ahead.clear();
        self.served = 0;
        if !self.layout.pipe && at == self.layout.records.start {
            self.armed = true;
            self.next = at;
            self.unpack = Unpack::default();
            self.window = Window::default();
            self.end = None;
            self.stopped = None;
        }
    }
}

/// The zstd data of a compressed record's `body`: all of it, or (COMPRESSED2) as much as its
/// first word says.
fn compressed_data(kind: u32, body: &[u8], order: Order) -> Result<&[u8], Refused> {
    if kind == RECORD_COMPRESSED {
        return Ok(body);
    }
    let size = body.get(..8).map(|b| order.word(b, 0));
    size.and_then(|n| body.get(8..8usize.checked_add(usize::try_from(n).ok()?)?))
        .ok_or_else(|| {
            Refused::Damaged(format!(
                "a COMPRESSED2 record's data does not fit in its {} bytes",
                body.len() + 8
            ))
        })
}

/// The end of the records handed to the parser past a bound: for a file, FINISHED_ROUND
/// headers that together say they fill the rest of the data section (the parser reads no body
/// of those, and stops at the section's end); for a pipe, the end of the stream.
struct End {
    /// Bytes of the data section the headers still have to cover.
    left: u64,
    header: [u8; 8],
    served: usize,
}

impl End {
    fn new(left: u64, layout: &Layout) -> Self {
        End {
            left: if layout.pipe { 0 } else { left },
            header: [0; 8],
            served: 8,
        }
    }

    fn read(&mut self, buf: &mut [u8], big_endian: bool) -> usize {
        if self.served == 8 {
            if self.left == 0 {
                return 0;
            }
            let size = self.left.clamp(8, 0xfff8);
            self.left = self.left.saturating_sub(size);
            let size = size as u16;
            let (kind, size) = match big_endian {
                true => (RECORD_FINISHED_ROUND.to_be_bytes(), size.to_be_bytes()),
                false => (RECORD_FINISHED_ROUND.to_le_bytes(), size.to_le_bytes()),
            };
            self.header = [kind[0], kind[1], kind[2], kind[3], 0, 0, size[0], size[1]];
            self.served = 0;
        }
        let n = buf.len().min(8 - self.served);
        buf[..n].copy_from_slice(&self.header[self.served..self.served + n]);
        self.served += n;
        n
    }
}

/// The file as the parser reads it: remembers how far it got, so errors and progress can say
/// where, and checks the records passing through it.
pub(super) struct Checked<R> {
    inner: R,
    position: Rc<Cell<u64>>,
    records: Records,
    /// The first record the check refused: its offset and what is wrong.
    bad_record: Rc<RefCell<Option<(u64, String)>>>,
    /// Where a bound ended the records, and which.
    stopped: Rc<RefCell<Option<(u64, String)>>>,
}

/// What the reader tells while the parser reads: how far it got, the record that is the
/// error, the bound that ended the records.
#[derive(Clone, Default)]
pub(super) struct Watch {
    pub(super) position: Rc<Cell<u64>>,
    pub(super) bad_record: Rc<RefCell<Option<(u64, String)>>>,
    pub(super) stopped: Rc<RefCell<Option<(u64, String)>>>,
}

impl<R> Checked<R> {
    pub(super) fn new(inner: R, layout: Layout, watch: &Watch) -> Self {
        Checked {
            inner,
            position: watch.position.clone(),
            records: Records::new(layout),
            bad_record: watch.bad_record.clone(),
            stopped: watch.stopped.clone(),
        }
    }
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let at = self.position.get();
        let n = match self.records.serve(at, buf, &mut self.inner) {
            Ok(Some(n)) => n,
            Ok(None) => self.inner.read(buf)?,
            Err(bad) => {
                let what = bad.1.clone();
                *self.bad_record.borrow_mut() = Some(bad);
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, what));
            }
        };
        if let Some(stop) = self.records.stopped.take() {
            *self.stopped.borrow_mut() = Some(stop);
        }
        self.position.set(at + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Checked<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let at = self.inner.seek(pos)?;
        self.position.set(at);
        self.records.seeked(at);
        Ok(at)
    }
}
