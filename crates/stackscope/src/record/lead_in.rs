//! The eBPF backend's first samples of a launched command, taken by the perf_event source:
//! it samples the command from its exec on a thread of its own while the kernel verifies the
//! sampling program and the command's unwind tables go in, then hands over at the moment the
//! program names (`stackscope_bpf::LeadIn`). Its samples are unwound here from their stack
//! copies, by the one walk into its stack table, and its profile is added to the program's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use stackscope_bpf::LeadIn;
use stackscope_perf_event::record::{record, RecordOptions};
use stackscope_perf_event::sampler::SamplerConfig;
use stackscope_process::cpu_clock::monotonic_ns;
use stackscope_process::SampleError;
use stackscope_stacks::{Hint, LeadInFigures, Recording, SourceFigures, Target};

type Sampling = JoinHandle<Result<Recording, SampleError>>;

/// The perf_event source, ready to sample a launched command until the program takes over.
pub(crate) struct PerfLeadIn {
    sampler: SamplerConfig,
    stop: Arc<AtomicBool>,
    at: Arc<AtomicU64>,
    sampling: Option<Sampling>,
}

impl PerfLeadIn {
    /// `sampler` as record's perf backend would sample (stack copies), stopped by `stop` too.
    pub fn new(sampler: SamplerConfig, stop: Arc<AtomicBool>) -> PerfLeadIn {
        PerfLeadIn {
            sampler,
            stop,
            at: Arc::new(AtomicU64::new(0)),
            sampling: None,
        }
    }

    /// Waits for the lead-in to end and adds what it sampled to `recording`, the program's,
    /// saying in its figures how many samples it took and how whole their stacks are.
    pub fn finish(mut self, recording: &mut Recording) {
        let Some(lead) = self.end() else {
            return;
        };
        if let Some(e) = lead.failure {
            let said = format!("the perf_event source's first samples stopped early: {e}");
            recording.hints.push(Hint::Said(said));
        }
        let profile = &lead.profile;
        let figures = LeadInFigures {
            samples: profile.total_samples(),
            user_stacks: profile.meta.unwind.user_stacks,
            complete: profile.meta.unwind.complete,
            lasted: Duration::from_secs_f64(profile.meta.duration_secs),
        };
        if figures.samples == 0 {
            return;
        }
        // The program counts without a CPU; the lead-in's samples are counted as it does.
        let mut profile = lead.profile;
        for sample in &mut profile.samples {
            sample.cpu = None;
        }
        recording.profile = std::mem::take(&mut recording.profile).merged(&profile);
        if let Some(SourceFigures::Bpf(bpf)) = recording.figures.as_mut() {
            bpf.lead_in = Some(figures);
        }
    }

    /// Ends the lead-in now if the program never took over, and waits for its recording.
    fn end(&mut self) -> Option<Recording> {
        let sampling = self.sampling.take()?;
        let _ = self
            .at
            .compare_exchange(0, monotonic_ns(), Ordering::SeqCst, Ordering::SeqCst);
        sampling.join().ok()?.ok()
    }
}

impl LeadIn for PerfLeadIn {
    fn begin(&mut self, pid: u32) -> bool {
        let options = RecordOptions {
            target: Target::Pids(vec![pid]),
            sampler: self.sampler.clone(),
            duration: None,
            stop: self.stop.clone(),
            command: Vec::new(),
            read_stack_on: false,
            hand_over: Some(self.at.clone()),
        };
        let (began, sampling) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lead-in".into())
            .spawn(move || {
                record(options, || {
                    let _ = began.send(());
                })
            });
        let Ok(thread) = thread else {
            return false;
        };
        // The thread ends without a word when the events could not be opened.
        let sampled = sampling.recv().is_ok();
        if sampled {
            self.sampling = Some(thread);
        } else {
            let _ = thread.join();
        }
        sampled
    }

    fn hand_over(&mut self, at_ns: u64) {
        self.at.store(at_ns, Ordering::SeqCst);
    }
}

impl Drop for PerfLeadIn {
    /// A recording that failed after the lead-in began still ends it.
    fn drop(&mut self) {
        self.end();
    }
}
