//! The Firefox Profiler's processed profile format, built with `fxprof-processed-profile`: one
//! process per pid, one thread per profiled thread, frames by name in a User or Kernel
//! category, and each sample weighted by its count.
//!
//! The model keeps counts, not times: a thread's samples are laid out one after another, each
//! `count` sampling intervals long, so the timeline shows their proportions in model order.

use crate::{printable, shown_name, FrameKind, Profile};
use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CategoryPairHandle, CpuDelta, Frame, FrameFlags, FrameInfo,
    ProcessHandle, Profile as FxProfile, ReferenceTimestamp, SamplingInterval, ThreadHandle,
    Timestamp,
};
use std::collections::HashMap;
use std::io::{self, Write};

use super::WriteOptions;

/// The interval shown when the profile does not say how often it sampled.
const DEFAULT_INTERVAL_NANOS: u64 = 1_000_000;

/// A sample's weight is an i32: a larger count takes several samples, at most this many.
const MAX_SAMPLES_PER_COUNT: u64 = 1024;

/// Builds the Firefox Profiler profile for `profile`. Fails with
/// [`io::ErrorKind::InvalidData`] on a count too large for [`MAX_SAMPLES_PER_COUNT`] samples.
pub fn to_fxprof(profile: &Profile, opts: &WriteOptions) -> io::Result<FxProfile> {
    check_counts(profile)?;
    let title = opts.title.clone().unwrap_or_else(|| profile.meta.title());
    let product = printable(&title);
    let interval = profile
        .meta
        .sample_nanos()
        .unwrap_or(DEFAULT_INTERVAL_NANOS);
    // The model has no start time; a fixed one keeps the output reproducible.
    let mut fx = FxProfile::new(
        &product,
        ReferenceTimestamp::from_millis_since_unix_epoch(0.0),
        SamplingInterval::from_nanos(interval),
    );
    let categories = Categories {
        user: fx.add_category("User", CategoryColor::Yellow).into(),
        kernel: fx.add_category("Kernel", CategoryColor::Orange).into(),
        other: CategoryHandle::OTHER.into(),
    };
    let threads = add_threads(&mut fx, profile);
    let names: Vec<_> = profile
        .frames
        .iter()
        .map(|f| fx.intern_string(&f.shown_name()))
        .collect();

    let mut clock = vec![0u64; threads.len()];
    for sample in &profile.samples {
        let thread = threads[sample.thread as usize];
        let frames = profile
            .stack(sample.stack)
            .frames
            .iter()
            .map(|&f| FrameInfo {
                frame: Frame::Label(names[f as usize]),
                category_pair: categories.of(profile.frame(f).kind),
                flags: FrameFlags::empty(),
            });
        let stack = fx.intern_stack_frames(thread, frames);
        // A weight is an i32: larger counts take several samples.
        let mut left = sample.count;
        while left > 0 {
            let weight = left.min(i32::MAX as u64);
            left -= weight;
            let now = &mut clock[sample.thread as usize];
            let time = Timestamp::from_nanos_since_reference(*now);
            let busy = weight.saturating_mul(interval);
            *now = now.saturating_add(busy);
            fx.add_sample(
                thread,
                time,
                stack,
                CpuDelta::from_nanos(busy),
                weight as i32,
            );
        }
    }
    Ok(fx)
}

/// Refuses a sample whose count needs more than [`MAX_SAMPLES_PER_COUNT`] samples.
fn check_counts(profile: &Profile) -> io::Result<()> {
    let weight_max = i32::MAX as u64;
    if let Some((i, s)) = profile
        .samples
        .iter()
        .enumerate()
        .find(|(_, s)| s.count.div_ceil(weight_max) > MAX_SAMPLES_PER_COUNT)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "sample {i} counts {}, more than the firefox format shows in one stack ({MAX_SAMPLES_PER_COUNT} samples of weight at most {weight_max})",
                s.count
            ),
        ));
    }
    Ok(())
}

/// The category each kind of frame is shown in.
struct Categories {
    user: CategoryPairHandle,
    kernel: CategoryPairHandle,
    other: CategoryPairHandle,
}

impl Categories {
    fn of(&self, kind: FrameKind) -> CategoryPairHandle {
        match kind {
            FrameKind::User => self.user,
            FrameKind::Kernel => self.kernel,
            FrameKind::Marker => self.other,
        }
    }
}

/// Adds a process per pid and a thread per profiled thread, in the profile's thread order.
fn add_threads(fx: &mut FxProfile, profile: &Profile) -> Vec<ThreadHandle> {
    let start = Timestamp::from_nanos_since_reference(0);
    let mut processes: HashMap<u32, ProcessHandle> = HashMap::new();
    profile
        .threads
        .iter()
        .map(|t| {
            let process = *processes.entry(t.pid).or_insert_with(|| {
                let name = if t.process_name.is_empty() {
                    &t.comm
                } else {
                    &t.process_name
                };
                fx.add_process(&shown_name(name), t.pid, start)
            });
            let thread = fx.add_thread(process, t.tid, start, t.tid == t.pid);
            fx.set_thread_name(thread, &shown_name(&t.comm));
            thread
        })
        .collect()
}

/// Writes `profile` as a Firefox Profiler processed profile (JSON).
pub fn write(profile: &Profile, opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &to_fxprof(profile, opts)?)?;
    out.write_all(b"\n")
}
