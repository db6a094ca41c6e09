//! What reading a perf.data file may make the parser hold, counted before the parser sees the
//! records: the bytes a compressed record unpacks to, and the records its sorter buffers.
//!
//! linux-perf-data unpacks each `PERF_RECORD_COMPRESSED` record whole into memory and keeps
//! every record it reads in a sorter until the `FINISHED_ROUND` record after next, with a few
//! hundred bytes of bookkeeping each. A 64 KiB compressed record can unpack to gigabytes of
//! 8-byte records, and a file without rounds keeps all of its records; either grows the parser
//! without bound. So each compressed record is unpacked here first, into a small buffer that is
//! only counted, and the records are counted as the sorter will hold them: past a bound the
//! reading stops before the record that crosses it.

use zstd_safe::{DCtx, InBuffer, OutBuffer};

/// The most bytes one compressed record may unpack to. perf compresses at most 64 KiB into a
/// record from one pass over a ring buffer; its sample records unpack to a few MiB at most.
pub const MAX_UNPACKED: u64 = 64 << 20;

/// The most memory the parser's sorter may hold, counting each record as its bytes and
/// [`RECORD_COST`]: perf writes a `FINISHED_ROUND` after each pass over the ring buffers, and
/// the sorter holds two rounds, so this is two passes of 256 MiB of records.
pub const MAX_HELD: u64 = 512 << 20;

/// What the parser keeps for a record beside its bytes: the sorter's entry (key and record,
/// about 80 bytes, in a queue that doubles as it grows) and the allocation of its buffer.
pub const RECORD_COST: u64 = 192;

/// A record type the sorter takes as a round boundary.
pub(super) const RECORD_FINISHED_ROUND: u32 = 68;

/// The records the sorter holds: those of the round being read and of the round before.
#[derive(Default)]
pub(super) struct Window {
    this_round: u64,
    last_round: u64,
}

impl Window {
    /// Counts a record of `bytes` (header included). Errs when the sorter would hold more than
    /// [`MAX_HELD`].
    pub(super) fn add(&mut self, bytes: u64) -> Result<(), String> {
        self.this_round = self.this_round.saturating_add(bytes + RECORD_COST);
        if self.this_round.saturating_add(self.last_round) > MAX_HELD {
            return Err(format!(
                "its records between two FINISHED_ROUND records take more than {} MiB to sort",
                MAX_HELD >> 20
            ));
        }
        Ok(())
    }

    /// A `FINISHED_ROUND` record: the round before the last one leaves the sorter.
    pub(super) fn finish_round(&mut self) {
        self.last_round = std::mem::take(&mut self.this_round);
    }
}

/// One zstd stream across the file's compressed records, as the parser decodes it (a frame
/// may span records), unpacked only to count the bytes and the records inside.
#[derive(Default)]
pub(super) struct Unpack {
    dctx: Option<DCtx<'static>>,
    out: Vec<u8>,
    /// The header of the record being unpacked, as far as it has come.
    head: Vec<u8>,
    /// Bytes of the current record's body still to come.
    skip: u64,
}

/// The scratch buffer unpacked bytes pass through.
const OUT_CHUNK: usize = 1 << 20;

impl Unpack {
    /// Unpacks one compressed record's `data`, counting the records in it into `window`.
    /// Errs with what is wrong: damage, or a bound crossed.
    pub(super) fn record(
        &mut self,
        data: &[u8],
        big_endian: bool,
        window: &mut Window,
    ) -> Result<(), Refused> {
        let dctx = self.dctx.get_or_insert_with(DCtx::create);
        if self.out.len() != OUT_CHUNK {
            self.out = vec![0; OUT_CHUNK];
        }
        let mut input = InBuffer::around(data);
        let mut unpacked = 0u64;
        loop {
            let mut output = OutBuffer::around(&mut self.out[..]);
            dctx.decompress_stream(&mut output, &mut input)
                .map_err(|code| {
                    Refused::Damaged(format!(
                        "a compressed record does not unpack: {}",
                        zstd_safe::get_error_name(code)
                    ))
                })?;
            let n = output.pos();
            unpacked += n as u64;
            if unpacked > MAX_UNPACKED {
                return Err(Refused::Bound(format!(
                    "a compressed record unpacks to more than {} MiB",
                    MAX_UNPACKED >> 20
                )));
            }
            let chunk = &self.out[..n];
            count_records(chunk, &mut self.head, &mut self.skip, big_endian, window)?;
            if n < OUT_CHUNK && input.pos() == data.len() {
                return Ok(());
            }
        }
    }
}

/// Walks the record headers in `bytes`, the next piece of an unpacked stream; `head` and
/// `skip` carry a record cut between pieces.
fn count_records(
    mut bytes: &[u8],
    head: &mut Vec<u8>,
    skip: &mut u64,
    big_endian: bool,
    window: &mut Window,
) -> Result<(), Refused> {
    while !bytes.is_empty() {
        if *skip > 0 {
            let n = usize::try_from(*skip)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            *skip -= n as u64;
            bytes = &bytes[n..];
            continue;
        }
        let n = (8 - head.len()).min(bytes.len());
        head.extend_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        if head.len() < 8 {
            break;
        }
        let size = [head[6], head[7]];
        let size = u64::from(if big_endian {
            u16::from_be_bytes(size)
        } else {
            u16::from_le_bytes(size)
        });
        head.clear();
        if size < 8 {
            return Err(Refused::Damaged(format!(
                "a record inside a compressed record says it is {size} bytes long, less than its own header"
            )));
        }
        window.add(size).map_err(Refused::Bound)?;
        *skip = size - 8;
    }
    Ok(())
}

/// Why a record is not handed to the parser.
#[derive(Debug)]
pub(super) enum Refused {
    /// The record is damaged: the file is an error.
    Damaged(String),
    /// Reading it would cross a bound: reading stops before it.
    Bound(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compress(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![0; zstd_safe::compress_bound(bytes.len())];
        let n = zstd_safe::compress(&mut out[..], bytes, 1).expect("compress");
        out.truncate(n);
        out
    }

    /// `n` records of 8 bytes (a header alone) of an unknown type.
    fn tiny_records(n: usize) -> Vec<u8> {
        let mut one = Vec::new();
        one.extend_from_slice(&0x7000u32.to_le_bytes());
        one.extend_from_slice(&0u16.to_le_bytes());
        one.extend_from_slice(&8u16.to_le_bytes());
        one.repeat(n)
    }

    #[test]
    fn records_cut_between_compressed_records_are_counted_once() {
        let stream = compress(&tiny_records(1000));
        let (a, b) = stream.split_at(stream.len() / 2);
        let mut unpack = Unpack::default();
        let mut window = Window::default();
        unpack.record(a, false, &mut window).expect("first half");
        unpack.record(b, false, &mut window).expect("second half");
        assert_eq!(window.this_round, 1000 * (8 + RECORD_COST));
    }

    #[test]
    fn a_record_unpacking_past_the_bound_is_refused_after_the_bound_only() {
        // 80 MiB of zeros compress to a few KiB.
        let stream = compress(&vec![0; 80 << 20]);
        let mut unpack = Unpack::default();
        let mut window = Window::default();
        let err = unpack.record(&stream, false, &mut window).unwrap_err();
        // Zeros are records of size 0: damage, seen at the first header.
        assert!(matches!(err, Refused::Damaged(_)), "{err:?}");

        let stream = compress(&vec![0x55; 80 << 20]);
        let err = Unpack::default()
            .record(&stream, false, &mut Window::default())
            .unwrap_err();
        // 0x5555-byte records: few enough to sort, but too many bytes unpacked.
        assert!(
            matches!(&err, Refused::Bound(what) if what.contains("unpacks to more than")),
            "{err:?}"
        );
    }

    #[test]
    fn tiny_records_past_what_the_sorter_may_hold_are_refused() {
        let stream = compress(&tiny_records(4 << 20));
        let err = Unpack::default()
            .record(&stream, false, &mut Window::default())
            .unwrap_err();
        assert!(
            matches!(&err, Refused::Bound(what) if what.contains("to sort")),
            "{err:?}"
        );
    }

    #[test]
    fn a_finished_round_lets_the_round_before_last_go() {
        let mut window = Window::default();
        let half = MAX_HELD / 2 - RECORD_COST;
        window.add(half).expect("first round");
        window.finish_round();
        window.add(half).expect("second round");
        window.finish_round();
        window.add(half).expect("third round: the first has left");
        assert!(window.add(half).is_err(), "two and a half rounds held");
    }
}
