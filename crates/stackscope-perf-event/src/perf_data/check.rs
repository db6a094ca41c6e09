//! What a damaged or hostile perf.data file must not get past once its header is checked
//! ([`super::layout`]): each record is checked, and counted against the bounds in
//! [`super::bounds`], before its bytes reach the parser. Damage is an error
//! naming its byte offset instead of a panic or a huge allocation; a record past a bound ends
//! the records there, so the parser finishes with those before it.

use std::cell::{Cell, RefCell};
use std::io::{Read, Seek, SeekFrom};
use std::rc::Rc;

use super::bounds::{Refused, Unpack, Window, RECORD_FINISHED_ROUND};
use super::layout::{Layout, Order};
use crate::decode::{check_mmap2, MMAP2_BUILD_ID_LEN_AT};

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
