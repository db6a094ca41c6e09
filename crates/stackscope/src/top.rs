//! `stackscope top`: record's start-up and sampling with a live view fed at every refresh.
//! Sampling runs on a thread of its own and hands its table over each refresh; the naming
//! step folds it into the profile so far (each new address named once) and passes what is new
//! to the view here, which draws it full-screen (`screen`) or prints plain-text snapshots
//! (`batch`). At the end the profile goes through `record`'s summary and writers when `-o`
//! asks; `w` writes the profile so far through the same writers.

mod batch;
mod screen;
mod view;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use stackscope_profile::{Metadata, Profile};
use stackscope_stacks::table::{Interval, Live, LiveFold, STACKS_KEPT};
use stackscope_stacks::Recording;

use crate::cli::{TopArgs, TOP_REFRESH, TOP_WINDOW};
use crate::output::{Fallback, Output};
use crate::record::{self, Plan};
use crate::status::stop_on_signals;
use crate::summary;
use view::{Grouping, Settings, SortBy, Update, View};

/// How a view asks for the profile so far and gets it.
pub(crate) struct Snapshots {
    asks: Sender<Metadata>,
    answers: Receiver<Profile>,
}

/// The sampling under way, as the view sees it.
pub(crate) struct Session {
    pub updates: Receiver<Update>,
    pub snapshots: Snapshots,
    pub stop: Arc<AtomicBool>,
    pub sampling: JoinHandle<Result<Recording>>,
    pub refresh: Duration,
    pub figures: Figures,
    pub output: Output,
    pub started: Instant,
    meta: Metadata,
}

/// What the header's figures are drawn from.
pub(crate) struct Figures {
    /// CPU time one sample stands for, in seconds.
    pub per_sample: f64,
    last_cpu: f64,
    last_at: Instant,
    /// stackscope's own CPU use over the last refresh, in % of one CPU.
    pub own_cpu: f64,
}

impl Figures {
    fn new(per_sample: f64) -> Figures {
        Figures {
            per_sample,
            last_cpu: own_cpu_seconds(),
            last_at: Instant::now(),
            own_cpu: 0.0,
        }
    }

    /// Measures stackscope's own CPU since the last measure.
    pub fn measure(&mut self) {
        let (cpu, at) = (own_cpu_seconds(), Instant::now());
        let wall = at.duration_since(self.last_at).as_secs_f64();
        if wall > 0.0 {
            self.own_cpu = 100.0 * (cpu - self.last_cpu) / wall;
        }
        (self.last_cpu, self.last_at) = (cpu, at);
    }

    /// The header line both views show; with the samples counted as their leaf alone past
    /// the distinct stacks kept, when there are any.
    pub fn header(&self, table: &view::Table, complete: (u64, u64), past_kept: u64) -> String {
        let seconds = table.seconds.max(f64::EPSILON);
        let rate = table.total as f64 / seconds;
        let complete = match complete {
            (_, 0) => "-".to_string(),
            (whole, all) => format!("{:.1}%", 100.0 * whole as f64 / all as f64),
        };
        let past_kept = match past_kept {
            0 => String::new(),
            n => format!("; {n} samples past the {STACKS_KEPT} stacks kept, leaf only"),
        };
        format!(
            "{} samples in {:.1} s: {:.0} samples/s, {} lost; target CPU {:.1}%; whole stacks {}; stackscope CPU {:.1}%{}",
            table.total,
            table.seconds,
            rate,
            table.lost,
            100.0 * rate * self.per_sample,
            complete,
            self.own_cpu,
            past_kept
        )
    }
}

/// User and system CPU seconds of this process, every thread.
fn own_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: filled above.
    let usage = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

impl Session {
    /// Asks the naming step for the profile so far and writes it where `-o` says; says what
    /// was done in one line.
    pub fn write_so_far(&self) -> String {
        let meta = Metadata {
            duration_secs: self.started.elapsed().as_secs_f64(),
            ..self.meta.clone()
        };
        if self.snapshots.asks.send(meta).is_err() {
            return "sampling has ended: the profile is written at the end with -o".into();
        }
        let wait = self.refresh * 3 + Duration::from_secs(1);
        let profile = match self.snapshots.answers.recv_timeout(wait) {
            Ok(profile) => profile,
            Err(_) => return "the profile so far did not come in time: not written".into(),
        };
        if profile.samples.is_empty() {
            return "no samples yet: nothing written".into();
        }
        match self
            .output
            .check_writable()
            .and_then(|_| self.output.write(&profile))
        {
            Ok(()) => format!("wrote {}", self.output.written()),
            Err(e) => format!("not written: {e:#}"),
        }
    }

    /// The next update, waiting at most `wait`; `Err(true)` once sampling has ended and
    /// everything was taken.
    pub fn next(&self, wait: Duration) -> Result<Update, bool> {
        match self.updates.recv_timeout(wait) {
            Ok(update) => Ok(update),
            Err(RecvTimeoutError::Timeout) => Err(false),
            Err(RecvTimeoutError::Disconnected) => Err(true),
        }
    }
}

pub(crate) fn run(args: TopArgs) -> Result<i32> {
    let mut record = args.record;
    let targeted = !record.command.is_empty()
        || !record.target.pid.is_empty()
        || !record.target.tid.is_empty();
    if !targeted {
        record.all_cpus = true;
    }
    let plan = Plan::new(&record, true)?;
    plan.refuse_live()?;
    let write_at_end = record.output.output.is_some() || record.output.format.is_some();
    let output = Output::from_args(&record.output, Fallback::file(plan.title()))?;
    if write_at_end {
        output.check_writable()?;
    }
    let refresh = args.refresh.unwrap_or(TOP_REFRESH);
    let batch = args.batch.is_some() || !std::io::stdout().is_terminal();
    let (command, threads) = (plan.command.clone(), plan.threads);
    let session = start(record, plan, output, refresh, batch)?;
    let settings = Settings {
        sort: SortBy::Own,
        kernel: true,
        grouping: Grouping::None,
        cumulative: args.cumulative,
        filter: String::new(),
    };
    let view = View::new(settings, refresh, args.window.unwrap_or(TOP_WINDOW));
    let (session, message) = match batch {
        true => batch::run(session, view, args.batch, args.rows)?,
        false => screen::run(session, view)?,
    };
    if let Some(message) = message {
        eprintln!("stackscope: {message}");
    }
    let recording = session
        .sampling
        .join()
        .map_err(|_| anyhow!("sampling stopped by a panic"))??;
    if write_at_end {
        let ending = record::ending(&command, threads);
        return summary::finish(recording, &session.output, ending, |o, p| o.write(p));
    }
    summary::say_failure(&recording);
    Ok(summary::exit_code(&recording).unwrap_or(0))
}

/// Starts sampling as `plan` says on a thread of its own, handing its stacks over every
/// `refresh`; announces it on stderr for the snapshots (the full-screen view says it itself).
fn start(
    record: crate::cli::RecordArgs,
    plan: Plan,
    output: Output,
    refresh: Duration,
    batch: bool,
) -> Result<Session> {
    let stop = stop_on_signals()?;
    crate::debuginfod::install(&record.debuginfod);
    let meta = Metadata {
        source: match plan.backend {
            crate::cli::BackendArg::Bpf => "ebpf",
            crate::cli::BackendArg::Perf => "perf_event",
        }
        .into(),
        event: "cpu-clock".into(),
        frequency_hz: plan.config.frequency,
        period: plan.config.period,
        command: plan.command.clone(),
        ..Metadata::default()
    };
    let per_sample = match (plan.config.frequency, plan.config.period) {
        (Some(hz), _) => 1.0 / hz as f64,
        (None, Some(ns)) => ns as f64 / 1e9,
        _ => 0.0,
    };
    let (updates_in, updates) = mpsc::channel();
    let (asks, asked) = mpsc::channel();
    let (answers_in, answers) = mpsc::channel();
    let live = Live {
        every: refresh,
        observe: Box::new(observer(updates_in, asked, answers_in)),
    };
    let announcement = plan.announcement(record.duration.duration);
    let sampling = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("stackscope-sample".into())
            .spawn(move || {
                let announce = || {
                    if batch {
                        eprintln!("{announcement}");
                    }
                };
                record::sample(&record, &plan, &stop, announce, Some(live))
            })?
    };
    Ok(Session {
        updates,
        snapshots: Snapshots { asks, answers },
        stop,
        sampling,
        refresh,
        figures: Figures::new(per_sample),
        output,
        started: Instant::now(),
        meta,
    })
}

/// What runs on the naming thread after each hand-over: passes what is new in the profile so
/// far and the hand-over's stacks to the view, and answers its asks for the profile so far.
fn observer(
    updates: Sender<Update>,
    asked: Receiver<Metadata>,
    answers: Sender<Profile>,
) -> impl FnMut(&LiveFold, &Interval) + Send {
    let (mut frames, mut stacks, mut threads) = (0, 0, 0);
    move |live, interval| {
        let so_far = live.so_far();
        let stats = &live.tally().stats;
        let update = Update {
            frames: so_far.frames[frames..].to_vec(),
            stacks: so_far.stacks[stacks..]
                .iter()
                .map(|s| s.frames.clone())
                .collect(),
            threads: so_far.threads[threads..].to_vec(),
            interval: interval.clone(),
            complete: (stats.complete, stats.user_stacks),
            past_kept: live.tally().past_kept_stacks,
        };
        (frames, stacks, threads) = (
            so_far.frames.len(),
            so_far.stacks.len(),
            so_far.threads.len(),
        );
        // The view may have ended first: then nobody reads.
        let _ = updates.send(update);
        while let Ok(meta) = asked.try_recv() {
            let _ = answers.send(live.snapshot(meta));
        }
    }
}

/// Whether a refresh is due, `since` the last one: with a hand-over that came in (`pending`),
/// or after three refreshes without one (naming a big program's first addresses can hold
/// hand-overs up; sampling hands one over every refresh, empty or not).
pub(crate) fn due(pending: bool, since: Duration, refresh: Duration) -> bool {
    (pending && since >= refresh / 2) || since >= refresh * 3
}

/// Stops sampling (the target, when launched, is ended as `record` ends it).
pub(crate) fn stop(session: &Session) {
    session.stop.store(true, Ordering::SeqCst);
}
