//! Replaying one perf.data event's records through the one decoder as the collector's
//! events, and what only a file tells: the span of its samples, its counts of lost samples,
//! where the recorded kernel's text lay, and the build-ids in its header.

use linux_perf_data::linux_perf_event_reader::{
    AttrFlags, Endianness, EventRecord, PerfEventAttr, RawEventRecord, RecordType, SampleFormat,
    SamplingPolicy,
};

use stackscope_stacks::arch::Arch;

use super::BuildIds;
use crate::decode::{self, Decoder};
use crate::event::Event;
use crate::perf::arch_of_mask;
use crate::record::Collector;
use crate::sampler::{SamplerConfig, StackMode};

/// The collector's settings for what the recorded event captured.
pub(super) fn sampler_config(attr: &PerfEventAttr) -> SamplerConfig {
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

/// The architecture a recording was made on, whose registers its samples carry: as the
/// file's header names it, else as the registers it asked for tell.
fn recorded_arch(arch: Option<&str>, regs_mask: u64) -> Option<Arch> {
    arch.and_then(Arch::of_kernel_name)
        .or_else(|| arch_of_mask(regs_mask))
}

/// Per-file replay state.
pub(super) struct Replay {
    decoder: Decoder,
    /// First and last sample times.
    times: Option<(u64, u64)>,
    build_ids: BuildIds,
    /// Where the recorded kernel's text began (perf's `[kernel.kallsyms]_text` mapping).
    kernel_text: Option<u64>,
    endian: Endianness,
    /// Samples the ring buffer lost (LOST records).
    lost_in_ring: u64,
    /// Samples the event lost, as counted by perf and the kernel (LOST_SAMPLES records).
    lost_samples: u64,
}

impl Replay {
    /// The replay of records of `attr`, recorded on a machine of `arch` as the file's header
    /// names it (`None`: it does not).
    pub(super) fn new(
        build_ids: BuildIds,
        attr: &PerfEventAttr,
        (endian, arch): (Endianness, Option<&str>),
    ) -> Self {
        Replay {
            decoder: Decoder::new(recorded_arch(arch, attr.sample_regs_user)),
            times: None,
            build_ids,
            kernel_text: None,
            endian,
            lost_in_ring: 0,
            lost_samples: 0,
        }
    }

    /// Hands one record to the collector; `chosen` when it belongs to the profiled event.
    /// Errs with what is wrong with a record that cannot be decoded.
    pub(super) fn record(
        &mut self,
        record: &RawEventRecord<'_>,
        chosen: bool,
        collector: &mut Collector,
    ) -> Result<(), String> {
        // Records inside compressed ones pass no check on their way in: the decoder checks
        // this one again.
        let parsed = decode::parse(record)?;
        match &parsed {
            EventRecord::Sample(sample) if chosen => {
                if let Some(t) = sample.timestamp {
                    self.times = Some(match self.times {
                        Some((first, last)) => (first.min(t), last.max(t)),
                        None => (t, t),
                    });
                }
            }
            EventRecord::Sample(_) => return Ok(()),
            EventRecord::Lost(l) => {
                self.lost_in_ring += l.count;
                return Ok(());
            }
            // perf writes the event's own count of lost samples at the end of the recording
            // (the kernel's, ring buffer overflows included), and the kernel writes one for
            // samples it could not write whole.
            EventRecord::Raw(raw) if raw.record_type == RecordType::LOST_SAMPLES => {
                let head = raw.data.as_slice();
                if let Some(bytes) = head.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                    self.lost_samples += match self.endian {
                        Endianness::LittleEndian => u64::from_le_bytes(bytes),
                        Endianness::BigEndian => u64::from_be_bytes(bytes),
                    };
                }
                return Ok(());
            }
            EventRecord::Mmap(m)
                if m.pid < 0 && m.path.as_slice().starts_with(b"[kernel.kallsyms]_text") =>
            {
                self.kernel_text = Some(m.page_offset);
                return Ok(());
            }
            _ => {}
        }
        match self.decoder.event(&parsed) {
            // The file's header knows which build of each binary ran, and where it is now.
            Some(Event::Mmap { pid, tid, mapping }) => collector.handle(Event::Mmap {
                pid,
                tid,
                mapping: self.build_ids.locate_mapping(mapping),
            }),
            Some(event) => collector.handle(event),
            None => {}
        }
        Ok(())
    }

    /// Samples lost while recording. The two counts overlap (a ring buffer overflow is in
    /// both): the larger is the loss.
    pub(super) fn lost(&self) -> u64 {
        self.lost_in_ring.max(self.lost_samples)
    }

    /// Seconds from the first sample to the last.
    pub(super) fn duration_secs(&self) -> f64 {
        self.times
            .map_or(0.0, |(first, last)| (last - first) as f64 / 1e9)
    }

    /// Where the recorded kernel's text began, when the file says.
    pub(super) fn kernel_text(&self) -> Option<u64> {
        self.kernel_text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_is_walked_as_the_architecture_it_was_recorded_on() {
        // perf record --call-graph dwarf on aarch64: its header says so, and so do the 33
        // registers it asked for.
        let aarch64_regs = (1 << 33) - 1;
        assert_eq!(
            recorded_arch(Some("aarch64"), aarch64_regs),
            Some(Arch::Aarch64)
        );
        assert_eq!(recorded_arch(None, aarch64_regs), Some(Arch::Aarch64));
        // The header wins over the registers.
        assert_eq!(
            recorded_arch(Some("x86_64"), aarch64_regs),
            Some(Arch::X86_64)
        );
        assert_eq!(recorded_arch(Some("sparc64"), 0xff0fff), Some(Arch::X86_64));
        assert_eq!(recorded_arch(None, 0), None);
    }
}
