//! The Asterinas OSDK's profile JSON (`cargo osdk profile --format json`):
//! `{"stack_traces":[{"<cpu>":["leaf", ..., "root"], ...}, ...]}`, one map per sampling round
//! in which each vCPU's stack is a list of function names, leaf first.
//!
//! Read, each CPU becomes a thread as `stackscope gdb` makes them: pid 1 (process `guest`),
//! tid the CPU number, comm `cpuN`, and its samples carry that CPU. Written, a sample of count
//! n fills n rounds of its CPU, taken in sample order, so every CPU's rounds start at the first
//! one; samples with no CPU count as CPU 0. A round that names one CPU twice (`{"0":[...],
//! "0":[...]}`) gives that CPU both stacks: neither is dropped.

use super::ReadError;
use crate::{Frame, Metadata, Profile, ProfileBuilder, Thread};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io::{self, Write};

const KEY: &str = "stack_traces";

#[derive(Deserialize)]
struct File {
    stack_traces: Vec<Round>,
}

/// One round's stacks by CPU key, in the file's order, every key kept: a map would keep only
/// the last stack of a CPU named twice.
struct Round(Vec<(String, Vec<String>)>);

impl<'de> Deserialize<'de> for Round {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Stacks;
        impl<'de> Visitor<'de> for Stacks {
            type Value = Round;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of CPU numbers to stacks")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Round, A::Error> {
                let mut stacks = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    stacks.push(entry);
                }
                Ok(Round(stacks))
            }
        }
        deserializer.deserialize_map(Stacks)
    }
}

/// Whether `text` (already known to start as a JSON object) is OSDK JSON: its first key is
/// `"stack_traces"`.
pub(super) fn detect(text: &str) -> bool {
    let rest = text.trim_start().strip_prefix('{').unwrap_or("");
    rest.trim_start()
        .strip_prefix('"')
        .and_then(|r| r.strip_prefix(KEY))
        .is_some_and(|r| r.starts_with('"'))
}

pub(super) fn read(text: &str) -> Result<Profile, ReadError> {
    let file: File = serde_json::from_str(text).map_err(|e| ReadError::Osdk {
        place: format!("line {}, column {}", e.line(), e.column()),
        problem: e.to_string(),
    })?;
    // Parse every CPU key first, so threads come out in CPU order whatever the rounds' order.
    let mut rounds: Vec<Vec<(u32, &Vec<String>)>> = Vec::with_capacity(file.stack_traces.len());
    let mut cpus: Vec<u32> = Vec::new();
    for (i, round) in file.stack_traces.iter().enumerate() {
        let mut stacks = Vec::with_capacity(round.0.len());
        for (key, frames) in &round.0 {
            let cpu: u32 = key.trim().parse().map_err(|_| ReadError::Osdk {
                place: format!("{KEY}[{i}]"),
                problem: format!("CPU key {key:?} is not a CPU number"),
            })?;
            cpus.push(cpu);
            stacks.push((cpu, frames));
        }
        stacks.sort_by_key(|s| s.0);
        rounds.push(stacks);
    }
    cpus.sort_unstable();
    cpus.dedup();

    let mut b = ProfileBuilder::new(Metadata {
        source: "osdk".to_string(),
        event: "gdb-stop".to_string(),
        ..Metadata::default()
    });
    let threads: BTreeMap<u32, u32> = cpus
        .iter()
        .map(|&cpu| {
            let thread = b.thread(Thread {
                pid: 1,
                tid: cpu,
                comm: format!("cpu{cpu}"),
                process_name: "guest".to_string(),
            });
            (cpu, thread)
        })
        .collect();
    let mut ids: Vec<u32> = Vec::new();
    for stacks in rounds {
        for (cpu, names) in stacks {
            ids.clear();
            // Leaf first in the file, root first in the model.
            for name in names.iter().rev() {
                ids.push(b.frame(Frame {
                    name: name.clone(),
                    ..Frame::default()
                }));
            }
            let stack = b.stack(&ids);
            b.add(threads[&cpu], stack, Some(cpu), 1);
        }
    }
    Ok(b.finish())
}

/// The format has no counts, only rounds: the most rounds written, so a huge count is an error
/// rather than endless output.
const MAX_ROUNDS: u64 = 1 << 24;

pub(super) fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    // Each CPU's samples, in profile order, with the rounds each still has to fill.
    let mut queues: BTreeMap<u32, Vec<(u32, u64)>> = BTreeMap::new();
    let mut rounds: BTreeMap<u32, u64> = BTreeMap::new();
    for s in &profile.samples {
        if s.count > 0 {
            let cpu = s.cpu.unwrap_or(0);
            queues.entry(cpu).or_default().push((s.stack, s.count));
            // The counts were checked to sum within u64.
            let total = rounds.entry(cpu).or_default();
            *total += s.count;
            if *total > MAX_ROUNDS {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the osdk format writes a round per sample, and CPU {cpu} has more than {MAX_ROUNDS} samples"
                    ),
                ));
            }
        }
    }
    let mut queues: Vec<(u32, VecDeque<(u32, u64)>)> =
        queues.into_iter().map(|(cpu, q)| (cpu, q.into())).collect();
    // Each stack's JSON, made once.
    let mut stack_json: HashMap<u32, String> = HashMap::new();
    write!(out, "{{\"{KEY}\":[")?;
    let mut first_round = true;
    loop {
        let mut round = String::new();
        for (cpu, queue) in &mut queues {
            let Some(front) = queue.front_mut() else {
                continue;
            };
            let stack = front.0;
            front.1 -= 1;
            if front.1 == 0 {
                queue.pop_front();
            }
            let frames = match stack_json.entry(stack) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let names: Vec<Cow<str>> = profile
                        .stack_frames(stack)
                        .rev()
                        .map(|f| f.shown_name())
                        .collect();
                    e.insert(serde_json::to_string(&names)?)
                }
            };
            round.push(if round.is_empty() { '{' } else { ',' });
            round.push_str(&format!("\"{cpu}\":{frames}"));
        }
        if round.is_empty() {
            break;
        }
        round.push('}');
        out.write_all(if first_round { b"\n" } else { b",\n" })?;
        out.write_all(round.as_bytes())?;
        first_round = false;
    }
    out.write_all(b"\n]}\n")
}
