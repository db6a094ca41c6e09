//! pprof: a gzipped `perftools.profiles.Profile` protocol buffer, as `go tool pprof` reads it.
//!
//! Each sample carries two values, `samples/count` and `cpu/nanoseconds` (count × sampling
//! period; the latter only when the period is known as a time), and its thread as labels
//! (`thread`, `pid`, `tid`). Samples of one stack on one thread are one pprof sample whatever
//! CPU they were taken on: pprof keeps apart samples whose labels differ, so a `cpu` label
//! would print one stack once per CPU in `-traces`. A profile of time (counts in
//! microseconds: off-CPU, or on- and off-CPU) carries one, `off-cpu/nanoseconds` or
//! `wall/nanoseconds`. A profile of bytes carries two, as Go's heap profiles do:
//! `alloc_objects/count` and `alloc_space/bytes` for the bytes allocated, `inuse_objects/count`
//! and `inuse_space/bytes` for those still held ([`IN_USE_EVENT`]), the space shown by
//! default. When stacks are rooted in the event that counted them (several events),
//! each sample also has an `event` label naming it, for `-tagfocus`. A location is one machine
//! address: a frame and the frames inlined into it (the model's [`Frame::inlined`] flag marks
//! a frame that shares its caller's address) become one location with one line per frame,
//! innermost first. Every module becomes a mapping, with its build-id where the profile has
//! one; kernel frames belong to `[kernel.kallsyms]`. The model keeps no addresses, so
//! locations carry address 0 and mappings no address range; pprof then goes by the function
//! names, files and lines.
//!
//! A function's `name` is the whole demangled name, generics and closures included
//! (`core::num::<impl u64>::wrapping_add`); its `system_name` is left empty, because pprof takes
//! a name equal to its system name for one still to demangle, and shortens one that merely
//! looks demangled by cutting out everything between `<>` and `()`.

use crate::{printable, CountUnit, Frame, FrameKind, Profile, IN_USE_EVENT};
use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;
use std::collections::HashMap;
use std::io::{self, Write};

use super::WriteOptions;

/// The module kernel frames belong to when the source named none.
const KERNEL_MODULE: &str = "[kernel.kallsyms]";

pub mod proto;

/// Builds the protocol buffer message (not yet encoded) for `profile`.
pub fn to_message(profile: &Profile) -> proto::Profile {
    Encoder::new(profile).encode()
}

/// Writes `profile` as a gzipped pprof protocol buffer.
pub fn write(profile: &Profile, _opts: &WriteOptions, out: &mut dyn Write) -> io::Result<()> {
    // Values are int64: a larger one would be written clamped, that is wrong.
    let nanos = profile.meta.sample_nanos().unwrap_or(1);
    let too_large = |count: u64| {
        count
            .checked_mul(nanos)
            .is_none_or(|v| i64::try_from(v).is_err())
    };
    if let Some((stack, _, count, _)) = per_thread(profile).into_iter().find(|s| too_large(s.2)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "stack {stack} counts {count} samples of {nanos} ns on one thread, more than pprof's 64-bit signed values hold"
            ),
        ));
    }
    let bytes = to_message(profile).encode_to_vec();
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}

/// The string-table indices of the label names every sample uses.
struct LabelKeys {
    thread: i64,
    pid: i64,
    tid: i64,
    event: i64,
}

struct Encoder<'a> {
    profile: &'a Profile,
    message: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, Option<String>), u64>,
    mappings: HashMap<String, u64>,
    /// Locations by mapping and lines (innermost first).
    locations: HashMap<(u64, Vec<proto::Line>), u64>,
}

impl<'a> Encoder<'a> {
    fn new(profile: &'a Profile) -> Self {
        let mut encoder = Encoder {
            profile,
            message: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
        };
        // The string table must start with the empty string.
        encoder.string("");
        encoder
    }

    /// Interns `s` as `go tool pprof` will print it, [`printable`].
    fn string(&mut self, s: &str) -> i64 {
        let s = printable(s);
        if let Some(&i) = self.strings.get(s.as_ref()) {
            return i;
        }
        let i = self.message.string_table.len() as i64;
        self.message.string_table.push(s.to_string());
        self.strings.insert(s.into_owned(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    fn encode(mut self) -> proto::Profile {
        let meta = &self.profile.meta;
        let nanos = meta.sample_nanos();
        let timed = meta.count_unit == CountUnit::Microseconds;
        let bytes = meta.count_unit == CountUnit::Bytes;
        if bytes {
            self.space_types();
        } else {
            self.value_types(timed, nanos);
        }
        self.message.duration_nanos = clamp_f64(meta.duration_secs * 1e9);
        for comment in comments(self.profile) {
            let i = self.string(&comment);
            self.message.comment.push(i);
        }

        let keys = LabelKeys {
            thread: self.string("thread"),
            pid: self.string("pid"),
            tid: self.string("tid"),
            event: self.string("event"),
        };
        let events = rooted_events(self.profile);
        let mut stack_locations: HashMap<u32, Vec<u64>> = HashMap::new();
        for (stack, thread, count, objects) in per_thread(self.profile) {
            let location_id = match stack_locations.get(&stack) {
                Some(ids) => ids.clone(),
                None => {
                    let ids = self.stack(stack);
                    stack_locations.insert(stack, ids.clone());
                    ids
                }
            };
            let mut value = Vec::with_capacity(2);
            if bytes {
                value.push(clamp(objects));
            } else if !timed {
                value.push(clamp(count));
            }
            if bytes {
                value.push(clamp(count));
            } else if let Some(nanos) = nanos {
                value.push(clamp(count.saturating_mul(nanos)));
            }
            let label = self.labels(&keys, &events, stack, thread);
            self.message.sample.push(proto::Sample {
                location_id,
                value,
                label,
            });
        }
        self.message
    }

    /// What each sample's values are, and which one pprof shows by default: the time when
    /// counts are time (`timed`), else the count and, when the period is a time (`nanos` a
    /// sample), the CPU time.
    fn value_types(&mut self, timed: bool, nanos: Option<u64>) {
        let meta = &self.profile.meta;
        if timed {
            // Counts are time already: one value, the time.
            let events = meta.event.split(", ").count();
            let kind = if events > 1 {
                "wall"
            } else {
                meta.event.as_str()
            };
            let time_type = self.value_type(kind, "nanoseconds");
            self.message.sample_type.push(time_type);
            self.message.period_type = Some(time_type);
            self.message.period = 1000;
            self.message.default_sample_type = time_type.r#type;
        } else if let Some(nanos) = nanos {
            let count_type = self.value_type("samples", "count");
            self.message.sample_type.push(count_type);
            let cpu_type = self.value_type("cpu", "nanoseconds");
            self.message.sample_type.push(cpu_type);
            self.message.period_type = Some(cpu_type);
            self.message.period = clamp(nanos);
            self.message.default_sample_type = cpu_type.r#type;
        } else {
            let count_type = self.value_type("samples", "count");
            self.message.sample_type.push(count_type);
            self.message.period_type = Some(count_type);
            self.message.period = 1;
        }
    }

    /// A profile of bytes: the allocations and their bytes, allocated or still held, as Go's
    /// heap profiles name them; the bytes are shown by default.
    fn space_types(&mut self) {
        let held = self.profile.meta.event == IN_USE_EVENT;
        let prefix = if held { "inuse" } else { "alloc" };
        let objects = self.value_type(&format!("{prefix}_objects"), "count");
        let space = self.value_type(&format!("{prefix}_space"), "bytes");
        self.message.sample_type.extend([objects, space]);
        self.message.period_type = Some(self.value_type("space", "bytes"));
        // One allocation in `period` bytes is counted when allocations are sampled.
        self.message.period = self.profile.meta.period.map_or(1, clamp);
        self.message.default_sample_type = space.r#type;
    }

    /// A sample's labels: its thread, and the event its stack is rooted in when stacks are.
    fn labels(
        &mut self,
        keys: &LabelKeys,
        events: &[&str],
        stack: u32,
        thread: u32,
    ) -> Vec<proto::Label> {
        let thread = self.profile.thread(thread);
        let mut label = vec![
            proto::Label {
                key: keys.thread,
                str: self.string(&thread.comm),
                ..Default::default()
            },
            proto::Label {
                key: keys.pid,
                num: thread.pid.into(),
                ..Default::default()
            },
            proto::Label {
                key: keys.tid,
                num: thread.tid.into(),
                ..Default::default()
            },
        ];
        let root = self.profile.stack(stack).frames.first();
        if let Some(event) = root.and_then(|&f| event_root(self.profile, events, f)) {
            label.push(proto::Label {
                key: keys.event,
                str: self.string(event),
                ..Default::default()
            });
        }
        label
    }

    /// The location ids of a stack, leaf first as pprof wants them.
    fn stack(&mut self, stack: u32) -> Vec<u64> {
        let frames = &self.profile.stack(stack).frames;
        // Group root first: a frame that is not inlined opens a location, the inlined frames
        // after it (its callees at the same address) join it.
        let mut groups: Vec<&[u32]> = Vec::new();
        let mut start = 0;
        for i in 1..=frames.len() {
            if i == frames.len() || !self.profile.frame(frames[i]).inlined {
                if start < i {
                    groups.push(&frames[start..i]);
                }
                start = i;
            }
        }
        groups
            .into_iter()
            .rev()
            .map(|group| self.location(group))
            .collect()
    }

    /// The location of one address: `group` holds its frames root first.
    fn location(&mut self, group: &[u32]) -> u64 {
        let profile = self.profile;
        let outer = profile.frame(group[0]);
        let mapping_id = self.mapping(outer);
        let lines: Vec<proto::Line> = group
            .iter()
            .rev()
            .map(|&f| {
                let frame = profile.frame(f);
                proto::Line {
                    function_id: self.function(frame),
                    line: frame.line.map_or(0, i64::from),
                    column: 0,
                }
            })
            .collect();
        let key = (mapping_id, lines);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.message.location.len() as u64 + 1;
        self.message.location.push(proto::Location {
            id,
            mapping_id,
            address: 0,
            line: key.1.clone(),
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    fn function(&mut self, frame: &Frame) -> u64 {
        let key = (frame.shown_name().into_owned(), frame.file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.message.function.len() as u64 + 1;
        let name = self.string(&key.0);
        let filename = self.string(frame.file.as_deref().unwrap_or(""));
        self.message.function.push(proto::Function {
            id,
            name,
            // The model keeps demangled names only; a system name equal to the name would
            // have pprof shorten it (see the module's documentation).
            system_name: 0,
            filename,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    /// The mapping of a frame's module; 0 (none) for a frame with no module outside the kernel.
    fn mapping(&mut self, frame: &Frame) -> u64 {
        let module = match (&frame.module, frame.kind) {
            (Some(m), _) if !m.is_empty() => m.as_str(),
            (_, FrameKind::Kernel) => KERNEL_MODULE,
            _ => return 0,
        };
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.message.mapping.len() as u64 + 1;
        let filename = self.string(module);
        let build_id = match self.profile.meta.build_ids.get(module) {
            Some(id) => self.string(id),
            None => 0,
        };
        // Symbols were resolved when the profile was taken: pprof must not look for them again.
        self.message.mapping.push(proto::Mapping {
            id,
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        });
        self.mappings.insert(module.to_string(), id);
        id
    }
}

/// The samples as pprof gets them: (stack, thread, count, objects), the counts of one stack
/// on one thread added up over the CPUs, in the order each first appears. A sum past
/// `u64::MAX` stays there, which [`write`] refuses as it refuses any count too large.
fn per_thread(profile: &Profile) -> Vec<(u32, u32, u64, u64)> {
    let mut at: HashMap<(u32, u32), usize> = HashMap::new();
    let mut merged: Vec<(u32, u32, u64, u64)> = Vec::new();
    for sample in &profile.samples {
        match at.get(&(sample.stack, sample.thread)) {
            Some(&i) => {
                merged[i].2 = merged[i].2.saturating_add(sample.count);
                merged[i].3 = merged[i].3.saturating_add(sample.objects);
            }
            None => {
                at.insert((sample.stack, sample.thread), merged.len());
                merged.push((sample.stack, sample.thread, sample.count, sample.objects));
            }
        }
    }
    merged
}

/// The events stacks are rooted in: those `meta.event` lists, when it lists several.
fn rooted_events(profile: &Profile) -> Vec<&str> {
    let events: Vec<&str> = profile.meta.event.split(", ").collect();
    if events.len() > 1 {
        events
    } else {
        Vec::new()
    }
}

/// The event a stack's root frame names, if it is an event's marker.
fn event_root<'p>(profile: &'p Profile, events: &[&str], root: u32) -> Option<&'p str> {
    let frame = profile.frame(root);
    (frame.kind == FrameKind::Marker && events.contains(&frame.name.as_str()))
        .then_some(frame.name.as_str())
}

/// What pprof shows as comments: how the profile was taken, and its hints.
fn comments(profile: &Profile) -> Vec<String> {
    let meta = &profile.meta;
    let mut out = Vec::new();
    if !meta.source.is_empty() || !meta.event.is_empty() {
        out.push(format!("source: {}, event: {}", meta.source, meta.event));
    }
    if let Some(hz) = meta.frequency_hz {
        out.push(format!("frequency: {hz} Hz"));
    }
    if let Some(period) = meta.period {
        out.push(format!("period: {period}"));
    }
    if !meta.command.is_empty() {
        out.push(format!("command: {}", meta.command.join(" ")));
    }
    if meta.lost_samples > 0 {
        out.push(format!("lost samples: {}", meta.lost_samples));
    }
    out.extend(meta.hints.iter().cloned());
    out
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn clamp_f64(x: f64) -> i64 {
    if x.is_finite() && x > 0.0 {
        // `as` saturates at i64::MAX.
        x as i64
    } else {
        0
    }
}
