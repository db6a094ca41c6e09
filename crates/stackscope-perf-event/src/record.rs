//! One recording: runs the sampler until the duration ends, the target exits or the caller
//! asks to stop, tracks each process's comm and mappings from the sampler's events, unwinds
//! every sample's user stack, counts raw stacks, and symbolizes them into a [`Profile`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stackscope_profile::Metadata;
use stackscope_stacks::table::{BackgroundFold, Live};

use crate::event::Event;
use crate::sampler::{Sampler, SamplerConfig};
use stackscope_process::cpu_clock;
use stackscope_process::target::Target;
use stackscope_process::SampleError;

mod collector;
mod hints;

pub(crate) use collector::Collector;

/// What to record and when to stop.
pub struct RecordOptions {
    pub target: Target,
    pub sampler: SamplerConfig,
    /// Stop after this long; `None` runs until the target exits or `stop` is set.
    pub duration: Option<Duration>,
    /// Set (e.g. from a SIGINT handler) to stop and keep what was collected.
    pub stop: Arc<AtomicBool>,
    /// The command line shown in the profile's metadata.
    pub command: Vec<String>,
    /// Read the rest of a user stack deeper than its copy from the live thread.
    pub read_stack_on: bool,
    /// Once set (nonzero), the moment another source takes over (CLOCK_MONOTONIC ns): samples
    /// taken from then on are left to it, and sampling ends once it has passed. It must be
    /// set before it comes.
    pub hand_over: Option<Arc<AtomicU64>>,
    /// With `hand_over`: at a handover, the stacks counted are left unnamed
    /// ([`Recording::unnamed`]) for the source that took over to name with its own, in one
    /// run of the naming step after all sampling. A recording that ends otherwise (the target
    /// exited, a stop signal) names its stacks itself.
    pub leave_unnamed: bool,
}

/// What a recording produced: the one result type every source hands back.
pub use stackscope_stacks::Recording;

/// The most user stack a perf_event sample can carry: the whole sample must fit in 64 KiB.
pub const MAX_STACK_COPY: u32 = crate::perf::MAX_STACK_BYTES;

/// How often the loop wakes to check the clock, the stop flag and the target.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The moment another source takes over, `u64::MAX` while none is set.
fn handover_at(at: &AtomicU64) -> u64 {
    match at.load(Ordering::SeqCst) {
        0 => u64::MAX,
        at => at,
    }
}

/// Hands `event` to the collector, unless it is a sample another source takes (`hand_over`).
fn pass(collector: &mut Collector, hand_over: Option<&AtomicU64>, event: Event<'_>) {
    match (&event, hand_over.map(handover_at)) {
        (Event::Sample(sample), Some(at)) if sample.time >= at => {}
        _ => collector.handle(event),
    }
}

/// Records until the duration ends, the target exits, or `options.stop` is set. `on_start`
/// runs once sampling has begun (the target exists and the events are enabled), so the caller
/// announces nothing for a target that failed to start.
pub fn record(options: RecordOptions, on_start: impl FnOnce()) -> Result<Recording, SampleError> {
    record_live(options, None, on_start)
}

/// [`record`], with a live view fed as it goes when `live` is given.
pub fn record_live(
    options: RecordOptions,
    live: Option<Live>,
    on_start: impl FnOnce(),
) -> Result<Recording, SampleError> {
    let mut sampler = Sampler::open(&options.target, &options.sampler)?;
    let mut collector = Collector::new(&options.sampler).reading_on(options.read_stack_on);
    let every = match live {
        Some(live) => {
            let names = collector::thread_names(true);
            let fold = BackgroundFold::start_live(names, live.observe).map_err(|source| {
                SampleError::Io {
                    what: "starting the naming thread".into(),
                    source,
                }
            })?;
            collector = collector.handing_to(fold);
            Some(live.every)
        }
        None => None,
    };
    sampler.start()?;
    on_start();
    let started = Instant::now();
    let mut handed = started;
    let mut interrupted = false;
    let mut failure = None;
    let mut handed_over = false;
    let hand_over = options.hand_over.as_deref();
    loop {
        if let Err(e) = sampler.poll(POLL_INTERVAL, &mut |e| pass(&mut collector, hand_over, e)) {
            failure = Some(e);
            break;
        }
        if every.is_some_and(|every| handed.elapsed() >= every) {
            handed = Instant::now();
            collector.hand_over();
        }
        if hand_over.is_some_and(|at| handover_at(at) <= cpu_clock::monotonic_ns()) {
            handed_over = true;
            break;
        }
        if options.stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if sampler.target_finished() {
            break;
        }
    }
    sampler.stop();
    if failure.is_none() {
        // What the kernel wrote before the events were disabled is still in the buffers.
        if let Err(e) = sampler.poll(Duration::ZERO, &mut |e| pass(&mut collector, hand_over, e)) {
            failure = Some(e);
        }
    }
    let elapsed = started.elapsed();
    if sampler.child_pid().is_some() && sampler.exit_status().is_none() {
        sampler.end_child(interrupted);
    }
    let meta = metadata(&options, elapsed);
    let kernel_excluded = sampler.kernel_excluded();
    let recording = match handed_over && options.leave_unnamed {
        true => Recording {
            unnamed: Some(collector.finish_unnamed(meta)),
            ..Recording::default()
        },
        false => collector.finish(meta, &options.sampler, kernel_excluded),
    };
    Ok(Recording {
        exit_status: sampler.exit_status(),
        interrupted,
        failure: failure.map(|e| e.to_string()),
        ..recording
    })
}

/// The profile's metadata: what was sampled, how often, for how long.
fn metadata(options: &RecordOptions, elapsed: Duration) -> Metadata {
    Metadata {
        source: "perf_event".into(),
        event: "cpu-clock".into(),
        frequency_hz: options.sampler.frequency,
        period: options.sampler.period,
        duration_secs: elapsed.as_secs_f64(),
        command: options.command.clone(),
        ..Metadata::default()
    }
}
