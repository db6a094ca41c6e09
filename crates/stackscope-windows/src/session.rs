//! A recording on Windows: the privilege and the profile timer's rate, the target started
//! suspended or attached to, the trace session started, the target let run once events flow,
//! and the events fed to the [`Collector`] until the duration ends, the target exits or the
//! stop flag is set. Whatever ends it, the samples so far make the profile.

mod process;
mod trace;

use std::ffi::OsString;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use stackscope_profile::{Metadata, Profile};
use stackscope_stacks::{Hint, Recording};
use stackscope_symbols::Symbolizer;

use crate::collect::{Collector, Target};
use crate::error::Error;
use process::Attached;
use trace::{Interval, Losses, RawEvent, Trace};

/// How often the end conditions are looked at.
const POLL: Duration = Duration::from_millis(50);

/// How long the session may take to deliver its first event (the rundown).
const FIRST_EVENT: Duration = Duration::from_secs(10);

/// How late an event may arrive after later ones: each CPU's buffers are delivered at least
/// once a second (the session's flush timer), so twice that.
const REORDER_SECS: u64 = 2;

/// What to profile.
#[derive(Debug, Clone)]
pub enum What {
    /// Start this command and profile it and the processes it starts.
    Launch(Vec<OsString>),
    /// Running processes.
    Pids(Vec<u32>),
    /// Every process and the kernel; idle CPUs' samples with `idle`.
    System { idle: bool },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub what: What,
    /// Samples per second per CPU.
    pub frequency: u32,
    pub duration: Option<Duration>,
    /// Which parts of the stacks to keep.
    pub user: bool,
    pub kernel: bool,
}

/// The profiled processes while the recording runs.
enum Running {
    Launched { child: Child, resumed: bool },
    Attached(Attached),
    System,
}

impl Running {
    /// Starts or opens the target, and says whose samples count.
    fn start(what: &What) -> Result<(Running, Target), Error> {
        Ok(match what {
            What::Launch(command) => {
                let child = process::launch_suspended(command)?;
                let pids = vec![child.id()];
                let running = Running::Launched {
                    child,
                    resumed: false,
                };
                (
                    running,
                    Target::Pids {
                        pids,
                        children: true,
                    },
                )
            }
            What::Pids(pids) => (
                Running::Attached(Attached::open(pids)?),
                Target::Pids {
                    pids: pids.clone(),
                    children: false,
                },
            ),
            What::System { idle } => (Running::System, Target::System { idle: *idle }),
        })
    }

    /// The target's exit, when it has ended.
    fn ended(&mut self) -> Option<Option<ExitStatus>> {
        match self {
            Running::Launched { child, .. } => process::exited(child).map(Some),
            Running::Attached(attached) => attached.all_exited().then_some(None),
            Running::System => None,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A command never let run would stay suspended for ever.
        if let Running::Launched {
            child,
            resumed: false,
        } = self
        {
            let _ = child.kill();
        }
    }
}

/// Records until the duration ends, the target exits or `stop` is set; `on_start` runs once
/// samples flow.
pub fn record(
    options: Options,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Recording, Error> {
    process::enable_profile_privilege()?;
    let (mut running, target) = Running::start(&options.what)?;
    let mut trace = Trace::start()?;
    // After the session's start, whose TraceSetInformation call is the first that a system
    // without kernel tracing refuses (Wine lacks TraceQueryInformation, which this reads).
    let interval = Interval::set(options.frequency)?;
    let (sender, events) = mpsc::channel();
    trace.consume(sender)?;
    let mut collector = Collector::new(target, process::device_paths());
    collector.keep(options.user, options.kernel);
    collector.reorder_within(process::ticks_per_second().saturating_mul(REORDER_SECS));
    wait_for_first_event(&events, &mut collector)?;
    if let Running::Launched { child, resumed } = &mut running {
        process::resume(child.id())?;
        *resumed = true;
    }
    on_start();
    let started = Instant::now();
    let (exit_status, interrupted, failure) = run(
        &events,
        &mut collector,
        &mut running,
        stop,
        started,
        options.duration,
    );
    let losses = trace.stop();
    for event in events.try_iter() {
        collector.record(event.header, event.payload);
    }
    let exit_status = exit_status.or_else(|| match &mut running {
        Running::Launched { child, .. } => process::exited(child),
        _ => None,
    });
    let elapsed = started.elapsed();
    let (profile, hints) = profile(collector, &options, interval.hz, losses, elapsed);
    Ok(Recording {
        profile,
        exit_status,
        interrupted,
        failure,
        hints,
        ..Recording::default()
    })
}

/// Names the samples' frames into the profile, with what the session measured, and says
/// what kept the rate or the samples short.
fn profile(
    collector: Collector,
    options: &Options,
    timer_hz: Option<f64>,
    losses: Losses,
    elapsed: Duration,
) -> (Profile, Vec<Hint>) {
    let asked = options.frequency;
    let meta = Metadata {
        source: "etw".to_string(),
        event: "profile timer".to_string(),
        frequency_hz: Some(timer_hz.map_or(u64::from(asked), |hz| hz.round() as u64)),
        duration_secs: elapsed.as_secs_f64(),
        lost_samples: u64::from(losses.events),
        command: match &options.what {
            What::Launch(command) => command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            _ => Vec::new(),
        },
        ..Metadata::default()
    };
    let (profile, _tally, mut hints) = collector.finish(&mut Symbolizer::new(), meta);
    if let Some(hz) = timer_hz.filter(|&hz| (hz - f64::from(asked)).abs() > 1.0) {
        hints.push(Hint::Said(format!(
            "the profile timer ran at {hz:.0} Hz, the rate nearest -F {asked} that the kernel allows"
        )));
    }
    if losses.events > 0 || losses.buffers > 0 {
        hints.push(Hint::Said(format!(
            "ETW lost {} events and {} buffers: the consumer fell behind; a lower -F keeps up",
            losses.events, losses.buffers
        )));
    }
    (profile, hints)
}

/// Waits for the rundown, so that a launched command runs only once its images are known.
fn wait_for_first_event(
    events: &Receiver<RawEvent>,
    collector: &mut Collector,
) -> Result<(), Error> {
    match events.recv_timeout(FIRST_EVENT) {
        Ok(event) => {
            collector.record(event.header, event.payload);
            Ok(())
        }
        Err(_) => Err(Error::Silent(FIRST_EVENT.as_secs())),
    }
}

/// Feeds events until an end condition; returns the target's exit status if it exited,
/// whether `stop` ended it, and why sampling stopped early if it did.
fn run(
    events: &Receiver<RawEvent>,
    collector: &mut Collector,
    running: &mut Running,
    stop: &AtomicBool,
    started: Instant,
    duration: Option<Duration>,
) -> (Option<ExitStatus>, bool, Option<String>) {
    let mut looked = Instant::now();
    loop {
        match events.recv_timeout(POLL) {
            Ok(event) => collector.record(event.header, event.payload),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return (
                    None,
                    false,
                    Some("the ETW session stopped by itself".to_string()),
                )
            }
        }
        if looked.elapsed() < POLL {
            continue;
        }
        looked = Instant::now();
        if stop.load(Ordering::Relaxed) {
            return (None, true, None);
        }
        if duration.is_some_and(|d| started.elapsed() >= d) {
            return (None, false, None);
        }
        if let Some(status) = running.ended() {
            return (status, false, None);
        }
    }
}
