//! The sampling loop: each round ([`round`]) stops the target, reads every selected vCPU's
//! registers, walks its stack from target memory ([`memory`]: DWARF CFI from the ELF, frame
//! pointers where there is none), and resumes it, at a jittered pace ([`pace`]) that never
//! stops the target more than the share of the time it may be stopped ([`budget`]); one
//! round in ten only stops and resumes it, the floor the others' pause is weighed against. At
//! the end the counted stacks are named once each into a [`Profile`] by the stack table's
//! naming step.

mod budget;
mod memory;
mod pace;
mod reach;
mod round;
mod steps;
mod wake;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use stackscope_profile::Metadata;
use stackscope_stacks::table::{Naming, StackTable};
use stackscope_stacks::{Rounds, SourceFigures};
use stackscope_symbols::Symbolizer;

use crate::client::Client;
use crate::error::Error;
use crate::image::Image;
use crate::packet::{later, Stream};
use crate::space::Space;

use pace::{after, Pace};
use round::{vcpu_thread, Sampling};
use steps::Steps;

/// `AT_ENTRY` in the auxiliary vector: the program's entry point as loaded.
const AT_ENTRY: u64 = 9;
/// Longest wait for the stub to stop and let go of the target once a recording's duration
/// is over.
const DETACH_GRACE: Duration = Duration::from_secs(2);
/// Rounds whose median pause decides whether an interval asked for is allowed.
const FIRST_ROUNDS: usize = 8;
/// One round in this many only stops the target, reads the registers and resumes it: the
/// floor that the pause of the others is weighed against, measured under the same host load.
const FLOOR_EVERY: u64 = 10;

/// What to sample and for how long.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Mean time between the starts of two rounds; zero samples as often as `max_slowdown`
    /// lets. Each gap is drawn between half and one and a half of the mean, so sampling never
    /// runs in lockstep with periodic work in the guest (timer ticks, loops) and over- or
    /// under-counts it.
    pub interval: Duration,
    /// The share of wall time the target may be stopped (above 0, at most 1: no limit):
    /// rounds wait until the time stopped so far allows them.
    pub max_slowdown: f64,
    /// The interval was asked for: one shorter than the first rounds' pause allows under
    /// `max_slowdown` is refused ([`Error::TooFrequent`]) rather than stretched.
    pub interval_asked: bool,
    /// Stop after this many rounds.
    pub rounds: Option<u64>,
    /// Stop after this long, even in the middle of a round: no wait for the stub lasts past
    /// it, and detaching afterwards takes at most 2 s more.
    pub duration: Option<Duration>,
    /// vCPU `i` (the stub's `i`-th thread) is sampled when bit `i` is set.
    pub cpu_mask: u128,
    /// Shorten Rust names as the Asterinas OSDK does.
    pub rust_clean: bool,
    /// Sampling frequency to record in the profile's metadata, when sampling by frequency.
    pub frequency_hz: Option<u64>,
}

/// Where sampling stands, for a progress display.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub rounds: u64,
    pub elapsed: Duration,
}

/// The result of a sampling run: the one result type every source hands back, with the
/// rounds' figures.
pub use stackscope_stacks::Recording;

/// What [`prepare`] found out before sampling starts.
pub struct Target {
    /// `(vCPU index, stub thread id)` of the vCPUs to sample.
    vcpus: Vec<(u32, u64)>,
    all_vcpus: usize,
    space: Space,
}

impl Target {
    pub fn vcpus(&self) -> usize {
        self.all_vcpus
    }

    pub fn sampled_vcpus(&self) -> usize {
        self.vcpus.len()
    }

    /// The ELF file, placed at its load address.
    pub fn image(&self) -> &Image {
        self.space.main()
    }
}

/// Checks the target is there, lists its vCPUs, and places the ELF file at its load address.
/// The target is left stopped, as connecting left it.
pub fn prepare<S: Stream>(
    client: &mut Client<S>,
    mut image: Image,
    cpu_mask: u128,
) -> Result<Target, Error> {
    client.status()?;
    let threads = client.threads()?;
    let vcpus: Vec<(u32, u64)> = threads
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < 128 && cpu_mask & (1u128 << i) != 0)
        .map(|(i, &tid)| (i as u32, tid))
        .collect();
    if vcpus.is_empty() {
        return Err(Error::NoVcpu {
            vcpus: threads.len(),
            mask: cpu_mask,
        });
    }
    if image.is_position_independent() {
        image.set_bias(load_bias(client, &image)?);
    }
    let mut space = Space::new(image);
    if let Some(libraries) = client.libraries()? {
        space.add_libraries(&libraries, || client.stopped());
    }
    // After `?`: gdbserver describes the thread it last reported, and without one it aborts.
    client.describe(space.main().arch(), space.main().path())?;
    Ok(Target {
        vcpus,
        all_vcpus: threads.len(),
        space,
    })
}

/// Where a position-independent file was loaded: `AT_ENTRY` against the file's entry point,
/// else the stub's text offset; 0 when the stub tells neither.
fn load_bias<S: Stream>(client: &mut Client<S>, image: &Image) -> Result<u64, Error> {
    if let Some(auxv) = client.auxv()? {
        if let Some(&(_, entry)) = auxv.iter().find(|(key, _)| *key == AT_ENTRY) {
            return Ok(entry.wrapping_sub(image.entry()));
        }
    }
    Ok(client.text_offset()?.unwrap_or(0))
}

/// Samples until the options' limit, `stop`, or the target's end, then detaches (leaving the
/// target running) and symbolizes. Errors end sampling and are reported in
/// [`Recording::failure`] beside what was collected; an interval asked for that the first
/// rounds show stops the target more than `max_slowdown` allows is refused
/// ([`Error::TooFrequent`]), the target let go.
pub fn record<S: Stream>(
    client: &mut Client<S>,
    mut target: Target,
    options: &SamplerOptions,
    stop: &AtomicBool,
    mut on_round: impl FnMut(Progress),
) -> Result<Recording, Error> {
    // A share of nothing would never let a round start.
    let options = &SamplerOptions {
        max_slowdown: options.max_slowdown.clamp(0.001, 1.0),
        ..options.clone()
    };
    let mut sampling = sampling_for(client, &target, options);
    let mut pauses = Vec::new();
    // Given back when sampling is over.
    let _slice = wake::ask_for_short_slices();
    let start = Instant::now();
    let end = options.duration.map(|d| after(start, d));
    client.set_end(end);
    // Connecting stopped the target; the first round starts after it ran.
    let mut failure = client.resume(0).err();
    if failure.is_none() {
        sampling.resumed();
    }
    let mut pace = Pace::new(start, end, options.interval, options.max_slowdown);
    let mut floor_pauses = Vec::new();
    let mut rounds = 0u64;
    let mut refusal = None;
    while failure.is_none() {
        let Some(now) = pace.wait(options, rounds, stop) else {
            break;
        };
        let slot = rounds + floor_pauses.len() as u64;
        let floor = slot % FLOOR_EVERY == FLOOR_EVERY - 1;
        let done = if floor {
            sampling.floor_round(client, &target)
        } else {
            sampling.round(client, &mut target)
        };
        if let Err(e) = done {
            failure = Some(e);
            break;
        }
        let pause = now.elapsed();
        pace.paused(pause, Instant::now());
        if floor {
            floor_pauses.push(pause);
            continue;
        }
        pauses.push(pause);
        rounds += 1;
        if pauses.len() == FIRST_ROUNDS {
            refusal = too_frequent(options, &pauses);
            if refusal.is_some() {
                break;
            }
        }
        on_round(Progress {
            rounds,
            elapsed: start.elapsed(),
        });
    }
    // Fewer rounds than the check takes are checked all the same.
    if pauses.len() < FIRST_ROUNDS && failure.is_none() {
        refusal = too_frequent(options, &pauses);
    }
    let elapsed = start.elapsed();
    detach(client, end, sampling.running, &mut failure);
    if let Some(refusal) = refusal {
        return Err(refusal);
    }
    let log = RoundLog {
        rounds,
        pauses,
        floor_pauses,
        paused: pace.total_paused(),
        late: pace.late,
    };
    Ok(collected(sampling, &target, options, log, elapsed, failure))
}

/// The rounds' state for `target`, its stacks named as `options` say.
fn sampling_for<S: Stream>(
    client: &Client<S>,
    target: &Target,
    options: &SamplerOptions,
) -> Sampling {
    let mut stacks = StackTable::default();
    stacks.set_naming(Naming {
        short_rust_names: options.rust_clean,
    });
    let packet_size = client.features().packet_size;
    Sampling::new(stacks, target.image().name(), packet_size)
}

/// What one run's rounds were: their count, their pauses and the floor rounds' pauses, the
/// time the target was stopped in all, and the rounds that waited for the allowance.
struct RoundLog {
    rounds: u64,
    pauses: Vec<Duration>,
    floor_pauses: Vec<Duration>,
    paused: Duration,
    late: u64,
}

/// The recording of a finished run: its rounds' figures and its stacks, named.
fn collected(
    mut sampling: Sampling,
    target: &Target,
    options: &SamplerOptions,
    log: RoundLog,
    elapsed: Duration,
    failure: Option<Error>,
) -> Recording {
    let RoundLog {
        rounds,
        mut pauses,
        mut floor_pauses,
        paused,
        late,
    } = log;
    pauses.sort();
    floor_pauses.sort();
    sampling.runs.sort();
    let figures = Rounds {
        rounds,
        stacks: sampling.counted,
        elapsed,
        pause_median: percentile(&pauses, 50),
        pause_p95: percentile(&pauses, 95),
        pause_longest: percentile(&pauses, 100),
        threads: target.all_vcpus,
        sampled_threads: target.vcpus.len(),
        pause_steps: std::mem::replace(&mut sampling.steps, Steps::new()).medians(),
        stale_looks: sampling.stale,
        run_median: percentile(&sampling.runs, 50),
        paused,
        max_slowdown: options.max_slowdown,
        late_rounds: late,
        floor_rounds: floor_pauses.len() as u64,
        floor_median: percentile(&floor_pauses, 50),
    };
    let meta = metadata(target, options, elapsed);
    let thread = vcpu_thread(target.image().name());
    let (profile, _) =
        sampling
            .into_table(&target.space)
            .into_profile(&mut Symbolizer::new(), meta, &thread);
    Recording {
        profile,
        failure: failure.map(|e| e.to_string()),
        figures: Some(SourceFigures::Gdb(figures)),
        ..Recording::default()
    }
}

/// The refusal of an interval asked for that stops the target more than `max_slowdown`
/// allows at the median of `pauses`, the first rounds' pauses.
fn too_frequent(options: &SamplerOptions, pauses: &[Duration]) -> Option<Error> {
    let unlimited = options.max_slowdown >= 1.0;
    if unlimited || !options.interval_asked || options.interval.is_zero() || pauses.is_empty() {
        return None;
    }
    let mut sorted = pauses.to_vec();
    sorted.sort();
    let pause = percentile(&sorted, 50);
    let least_interval = pause.div_f64(options.max_slowdown);
    (options.interval < least_interval).then_some(Error::TooFrequent {
        interval: options.interval,
        least_interval,
        pause,
        share: options.max_slowdown,
        rounds: pauses.len(),
    })
}

/// Lets go of the target, leaving it running, unless it is gone; a failure to is the
/// recording's failure when it has none yet.
fn detach<S: Stream>(
    client: &mut Client<S>,
    end: Option<Instant>,
    running: bool,
    failure: &mut Option<Error>,
) {
    // Past the duration the stub gets a short grace to let go, not a reply timeout per step.
    client.set_end(end.map(|_| later(DETACH_GRACE.min(client.timeout()))));
    let target_gone = failure.as_ref().is_some_and(Error::is_end_of_target);
    if !target_gone {
        let detached = (|| -> Result<(), Error> {
            if running {
                client.interrupt()?;
            }
            client.detach()
        })();
        if let (Err(e), None) = (detached, &failure) {
            *failure = Some(e);
        }
    }
    client.set_end(None);
}

fn metadata(target: &Target, options: &SamplerOptions, elapsed: Duration) -> Metadata {
    Metadata {
        source: "gdb".into(),
        event: "gdb-interrupt".into(),
        frequency_hz: options.frequency_hz,
        duration_secs: elapsed.as_secs_f64(),
        hints: if target.image().has_unwind_info() {
            Vec::new()
        } else {
            vec![format!(
                "{} has no .eh_frame or .debug_frame: stacks were unwound by frame pointers, which breaks in code built without them (build with -C force-frame-pointers=yes / -fno-omit-frame-pointer, or keep unwind tables)",
                target.image().path().display()
            )]
        },
        ..Metadata::default()
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_pauses() {
        let ms = |v: u64| Duration::from_millis(v);
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 50), ms(50));
        assert_eq!(percentile(&sorted, 95), ms(95));
        assert_eq!(percentile(&[ms(7)], 95), ms(7));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
