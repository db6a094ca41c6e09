//! Replaying one perf.data event's records as the collector's events: samples with their
//! callchains, registers and stack copies, and the mmap, comm, fork and exit records that
//! tell what each process had mapped.

use std::sync::Arc;

use linux_perf_data::linux_perf_event_reader::constants::{
    PERF_REG_X86_BP, PERF_REG_X86_IP, PERF_REG_X86_SP,
};
use linux_perf_data::linux_perf_event_reader::{
    AttrFlags, CpuMode, Endianness, EventRecord, Mmap2FileId, PerfEventAttr, RawEventRecord,
    RecordType, SampleFormat, SampleRecord, SamplingPolicy,
};

use super::check::check_mmap2;
use super::BuildIds;
use crate::event::{Event, SampleEvent, UserRegs};
use crate::perf::split_callchain;
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

/// Per-file replay state.
pub(super) struct Replay {
    /// The sample's callchain, copied out of the record (it may not be 8-aligned there).
    chain: Vec<u64>,
    /// First and last sample times.
    times: Option<(u64, u64)>,
    build_ids: BuildIds,
    /// Without callchains a sample's stack is its instruction pointer alone.
    has_callchain: bool,
    /// Where the recorded kernel's text began (perf's `[kernel.kallsyms]_text` mapping).
    kernel_text: Option<u64>,
    endian: Endianness,
    /// Samples the ring buffer lost (LOST records).
    lost_in_ring: u64,
    /// Samples the event lost, as counted by perf and the kernel (LOST_SAMPLES records).
    lost_samples: u64,
}

impl Replay {
    pub(super) fn new(build_ids: BuildIds, attr: &PerfEventAttr, endian: Endianness) -> Self {
        Replay {
            chain: Vec::new(),
            times: None,
            build_ids,
            has_callchain: attr.sample_format.contains(SampleFormat::CALLCHAIN),
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
        // Records inside compressed ones pass no check on their way in: this one is still
        // unchecked when it was compressed.
        check_mmap2(record.record_type.0, record.misc, &record.data.as_slice())?;
        let parsed = record
            .parse()
            .map_err(|e| format!("a {:?} record cannot be decoded: {e}", record.record_type))?;
        match parsed {
            EventRecord::Sample(sample) if chosen => self.sample(&sample, collector),
            EventRecord::Sample(_) => {}
            EventRecord::Lost(l) => self.lost_in_ring += l.count,
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
            }
            other => self.other(other, collector),
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

    fn sample(&mut self, s: &SampleRecord<'_>, collector: &mut Collector) {
        if let Some(t) = s.timestamp {
            self.times = Some(match self.times {
                Some((first, last)) => (first.min(t), last.max(t)),
                None => (t, t),
            });
        }
        self.chain.clear();
        if let Some(chain) = &s.callchain {
            self.chain
                .extend((0..chain.len()).filter_map(|i| chain.get(i)));
        }
        let in_kernel = matches!(s.cpu_mode, CpuMode::Kernel);
        let ip_only = [s.ip.unwrap_or(0)];
        let (kernel_stack, user_callchain): (&[u64], &[u64]) = if self.has_callchain {
            split_callchain(&self.chain)
        } else if in_kernel {
            (&ip_only, &[])
        } else {
            (&[], &ip_only)
        };
        let user_regs = s.user_regs.as_ref().and_then(|r| {
            Some(UserRegs {
                ip: r.get(PERF_REG_X86_IP)?,
                sp: r.get(PERF_REG_X86_SP)?,
                bp: r.get(PERF_REG_X86_BP)?,
            })
        });
        let stack = s.user_stack.as_ref().map(|(data, dyn_size)| {
            let bytes = data.as_slice();
            let keep = usize::try_from(*dyn_size)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            match bytes {
                std::borrow::Cow::Borrowed(b) => std::borrow::Cow::Borrowed(&b[..keep]),
                std::borrow::Cow::Owned(mut v) => {
                    v.truncate(keep);
                    std::borrow::Cow::Owned(v)
                }
            }
        });
        collector.handle(Event::Sample(SampleEvent {
            pid: pid(s.pid),
            tid: pid(s.tid),
            cpu: s.cpu.unwrap_or(0),
            time: s.timestamp.unwrap_or(0),
            period: s.period.unwrap_or(1),
            kernel_stack,
            user_callchain,
            user_regs,
            user_stack: stack.as_deref().unwrap_or(&[]),
            in_user: !in_kernel,
        }));
    }

    fn other(&mut self, record: EventRecord<'_>, collector: &mut Collector) {
        match record {
            EventRecord::Mmap(m)
                if m.pid < 0 && m.path.as_slice().starts_with(b"[kernel.kallsyms]_text") =>
            {
                self.kernel_text = Some(m.page_offset);
            }
            EventRecord::Mmap(m) if m.is_executable && m.pid >= 0 && is_user(m.cpu_mode) => {
                let path = m.path.as_slice();
                let mapping = self
                    .build_ids
                    .mapping(m.address, m.length, m.page_offset, &path);
                collector.handle(Event::Mmap {
                    pid: m.pid as u32,
                    tid: pid(Some(m.tid)),
                    mapping,
                });
            }
            EventRecord::Mmap2(m) => {
                let exec = m.protection & libc::PROT_EXEC as u32 != 0;
                if exec && m.pid >= 0 && is_user(m.cpu_mode) {
                    let path = m.path.as_slice();
                    let mut mapping =
                        self.build_ids
                            .mapping(m.address, m.length, m.page_offset, &path);
                    if let Mmap2FileId::BuildId(id) = &m.file_id {
                        if mapping.build_id.is_none() && !id.is_empty() {
                            mapping.build_id = Some(Arc::from(id.as_slice()));
                        }
                    }
                    collector.handle(Event::Mmap {
                        pid: m.pid as u32,
                        tid: pid(Some(m.tid)),
                        mapping,
                    });
                }
            }
            EventRecord::Comm(c) => {
                let name = c.name.as_slice();
                let comm = String::from_utf8_lossy(&name);
                collector.handle(Event::Comm {
                    pid: pid(Some(c.pid)),
                    tid: pid(Some(c.tid)),
                    comm: &comm,
                    exec: c.is_execve,
                });
            }
            EventRecord::Fork(f) => collector.handle(Event::Fork {
                pid: pid(Some(f.pid)),
                ppid: pid(Some(f.ppid)),
                tid: pid(Some(f.tid)),
                ptid: pid(Some(f.ptid)),
            }),
            EventRecord::Exit(e) => collector.handle(Event::Exit {
                pid: pid(Some(e.pid)),
                tid: pid(Some(e.tid)),
            }),
            _ => {}
        }
    }
}

/// perf writes -1 for "no task"; such records concern no process we track.
fn pid(p: Option<i32>) -> u32 {
    p.and_then(|p| u32::try_from(p).ok()).unwrap_or(0)
}

fn is_user(mode: CpuMode) -> bool {
    !matches!(mode, CpuMode::Kernel | CpuMode::GuestKernel)
}
