//! The eBPF backend's first samples of a launched command, taken by the perf_event source:
//! it samples the command from its exec on a thread of its own while the kernel verifies the
//! sampling program and the command's unwind tables go in, then hands over at the moment the
//! program names (`stackscope_bpf::LeadIn`). Its samples are unwound here from their stack
//! copies, by the one walk into its stack table, which it hands over unnamed: the program's
//! naming step names it with the program's stacks, after all sampling, each file parsed once.
//!
//! A command that ends before the program is ready is the perf source's alone: the recording
//! ends then, without waiting for the verifier, whose work ends with this process.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use stackscope_bpf::{BpfConfig, LeadIn};
use stackscope_perf_event::record::{record, RecordOptions};
use stackscope_perf_event::sampler::SamplerConfig;
use stackscope_process::cpu_clock::monotonic_ns;
use stackscope_process::SampleError;
use stackscope_stacks::{BpfFigures, LeadInFigures, Recording, SourceFigures, Target};

/// How often the caller's thread looks whether the command ended before the program was ready.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

type Sampling = JoinHandle<Result<Recording, SampleError>>;

/// The perf_event source, ready to sample a launched command until the program takes over.
pub(crate) struct PerfLeadIn {
    sampler: SamplerConfig,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

/// What the recording's thread and the lead-in's share.
#[derive(Default)]
struct Shared {
    /// The handover's moment once set (0 before).
    at: Arc<AtomicU64>,
    /// The command's pid once the lead-in began (0 before).
    pid: AtomicU32,
    sampling: Mutex<Option<Sampling>>,
}

impl PerfLeadIn {
    /// `sampler` as record's perf backend would sample (stack copies), stopped by `stop` too.
    pub fn new(sampler: SamplerConfig, stop: Arc<AtomicBool>) -> PerfLeadIn {
        PerfLeadIn {
            sampler,
            stop,
            shared: Arc::default(),
        }
    }

    /// Records with the program as `config` says, the command sampled by this lead-in until
    /// the program takes over; `on_start` runs here, on the caller's thread.
    pub fn sample(
        self,
        config: BpfConfig,
        stop: &Arc<AtomicBool>,
        on_start: impl FnOnce(),
    ) -> Result<Recording> {
        let shared = self.shared.clone();
        // The program's side tells when sampling begins and waits until it was announced.
        let (begun, announce) = mpsc::sync_channel(0);
        let (announced, wait) = mpsc::sync_channel(0);
        let stop = stop.clone();
        let recording = std::thread::Builder::new()
            .name("ebpf".into())
            .spawn(move || {
                let mut lead_in = self;
                let on_start = move || {
                    if begun.send(()).is_ok() {
                        let _ = wait.recv();
                    }
                };
                stackscope_bpf::record_led_in(config, &stop, on_start, Some(&mut lead_in))
            })?;
        let mut on_start = Some(on_start);
        loop {
            match announce.recv_timeout(POLL_INTERVAL) {
                Ok(()) => {
                    if let Some(announce) = on_start.take() {
                        announce();
                    }
                    let _ = announced.send(());
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) if recording.is_finished() => break,
                // Announced: from now on only the end is waited for.
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(POLL_INTERVAL),
            }
            if let Some(recording) = shared.ended_before_ready() {
                return Ok(recording);
            }
        }
        match recording.join() {
            Ok(recorded) => Ok(recorded?),
            Err(_) => anyhow::bail!("the eBPF recording's thread panicked"),
        }
    }
}

impl Shared {
    /// Ends the lead-in now if the program never took over, and waits for its recording.
    fn end(&self) -> Option<Recording> {
        let sampling = self.sampling.lock().ok()?.take()?;
        let _ = self
            .at
            .compare_exchange(0, monotonic_ns(), Ordering::SeqCst, Ordering::SeqCst);
        sampling.join().ok()?.ok()
    }

    /// The lead-in's recording, when the command exited before the program took over: the
    /// whole run, with the command's exit status. The program's side is left to end with this
    /// process.
    fn ended_before_ready(&self) -> Option<Recording> {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid == 0 || self.at.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let mut sampling = self.sampling.lock().ok()?;
        if !sampling.as_ref()?.is_finished() {
            return None;
        }
        let status = exit_status(pid)?;
        let mut recording = sampling.take()?.join().ok()?.ok()?;
        recording.exit_status = Some(status);
        recording.figures = Some(SourceFigures::Bpf(BpfFigures {
            lead_in: LeadInFigures::of(&recording.profile, true),
            ..BpfFigures::default()
        }));
        Some(recording)
    }
}

/// How our child `pid` ended, once it has, left for its owner to reap (WNOWAIT).
fn exit_status(pid: u32) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: siginfo_t is plain data that waitid fills.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: waitid on our own child, with a valid siginfo_t to fill.
    let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
    // SAFETY: waitid filled the child fields when it found a child that exited.
    let (found, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if r != 0 || found == 0 {
        return None;
    }
    Some(match code {
        libc::CLD_EXITED => std::process::ExitStatus::from_raw((status & 0xff) << 8),
        _ => std::process::ExitStatus::from_raw(status & 0x7f),
    })
}

impl LeadIn for PerfLeadIn {
    fn begin(&mut self, pid: u32) -> bool {
        let options = RecordOptions {
            target: Target::Pids(vec![pid]),
            sampler: self.sampler.clone(),
            duration: None,
            stop: self.stop.clone(),
            command: Vec::new(),
            // Its few samples have no later ones of their thread to take outer frames from:
            // a stack deeper than its copy is read on from the live thread.
            read_stack_on: true,
            hand_over: Some(self.shared.at.clone()),
            leave_unnamed: true,
        };
        let (began, sampling) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lead-in".into())
            .spawn(move || {
                stackscope_symbols::interrupt::hands_over();
                record(options, || {
                    let _ = began.send(());
                })
            });
        let Ok(thread) = thread else {
            return false;
        };
        // The thread ends without a word when the events could not be opened.
        let sampled = sampling.recv().is_ok();
        if !sampled {
            let _ = thread.join();
            return false;
        }
        if let Ok(mut sampling) = self.shared.sampling.lock() {
            *sampling = Some(thread);
        }
        self.shared.pid.store(pid, Ordering::SeqCst);
        true
    }

    fn hand_over(&mut self, at_ns: u64) {
        self.shared.at.store(at_ns, Ordering::SeqCst);
    }

    fn counted(&mut self) -> Option<Recording> {
        self.shared.end()
    }
}

impl Drop for PerfLeadIn {
    /// A recording that failed after the lead-in began still ends it.
    fn drop(&mut self) {
        self.shared.end();
    }
}
