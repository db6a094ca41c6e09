//! speedscope's file format (`https://www.speedscope.app/file-format-schema.json`): shared
//! frames, and one "sampled" profile per thread whose samples are stacks of frame indices,
//! root first, each weighted by its count (in nanoseconds when the sampling period is known).

use crate::{printable, shown_name, Profile};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};

use super::WriteOptions;

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: String,
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SharedFrame<'a>>,
}

#[derive(Serialize, PartialEq, Eq, Hash, Clone)]
struct SharedFrame<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    r#type: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// Writes `profile` as speedscope JSON. The file is named after the title option, else the
/// profiled command.
pub fn write(profile: &Profile, opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    let (frames, shared_of) = shared_frames(profile);
    let mut profiles = thread_profiles(profile, &shared_of)?;
    // Threads with no samples would only be empty tabs.
    profiles.retain(|p| !p.samples.is_empty());
    let active_profile_index = profiles
        .iter()
        .enumerate()
        .max_by_key(|(i, p)| (p.end_value, std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);

    let file = File {
        schema: SCHEMA,
        shared: Shared { frames },
        profiles,
        name: printable(&opts.title.clone().unwrap_or_else(|| profile.meta.title())).into_owned(),
        active_profile_index,
        exporter: format!("stackscope {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_writer(&mut *out, &file)?;
    out.write_all(b"\n")
}

/// The shared frames, and the index among them of each model frame. speedscope tells frames
/// apart by name, file and line only, so frames that differ in nothing else share one entry.
fn shared_frames(profile: &Profile) -> (Vec<SharedFrame<'_>>, Vec<usize>) {
    let mut frames: Vec<SharedFrame> = Vec::new();
    let mut frame_index: HashMap<SharedFrame, usize> = HashMap::new();
    let shared_of: Vec<usize> = profile
        .frames
        .iter()
        .map(|f| {
            let frame = SharedFrame {
                name: f.shown_name(),
                // Without a source file, the module is the best place speedscope can show.
                file: f.file.as_deref().or(f.module.as_deref()).map(printable),
                line: f.line,
            };
            *frame_index.entry(frame.clone()).or_insert_with(|| {
                frames.push(frame);
                frames.len() - 1
            })
        })
        .collect();
    (frames, shared_of)
}

/// One sampled profile per thread, in the profile's thread order, each sample weighted by its
/// count (times the sampling period in nanoseconds, when known).
fn thread_profiles(profile: &Profile, shared_of: &[usize]) -> io::Result<Vec<SampledProfile>> {
    let nanos = profile.meta.sample_nanos();
    let mut profiles: Vec<SampledProfile> = profile
        .threads
        .iter()
        .map(|t| SampledProfile {
            r#type: "sampled",
            name: format!("{} (pid {}, tid {})", shown_name(&t.comm), t.pid, t.tid),
            unit: match (nanos, profile.meta.count_unit) {
                (Some(_), _) => "nanoseconds",
                (None, crate::CountUnit::Bytes) => "bytes",
                (None, _) => "none",
            },
            start_value: 0,
            end_value: 0,
            samples: Vec::new(),
            weights: Vec::new(),
        })
        .collect();
    for sample in &profile.samples {
        let p = &mut profiles[sample.thread as usize];
        let too_large = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "sample counts of thread {} weigh more than 2^64 nanoseconds in all, more than the speedscope format holds",
                    sample.thread
                ),
            )
        };
        let weight = sample
            .count
            .checked_mul(nanos.unwrap_or(1))
            .ok_or_else(too_large)?;
        p.samples.push(
            profile
                .stack(sample.stack)
                .frames
                .iter()
                .map(|&f| shared_of[f as usize])
                .collect(),
        );
        p.weights.push(weight);
        p.end_value = p.end_value.checked_add(weight).ok_or_else(too_large)?;
    }
    Ok(profiles)
}
