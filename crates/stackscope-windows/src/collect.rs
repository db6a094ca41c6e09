//! From decoded events to counted stacks: processes, threads and their images kept up to
//! date, each sample's stacks stitched, the samples of the profiled processes counted in the
//! middle's [`StackTable`], and the profile built by its one naming step.

use std::collections::{HashMap, HashSet};

use stackscope_profile::{FrameKind, Metadata, Profile, Thread};
use stackscope_stacks::table::{RawFrame, Sampled, StackTable, Tally};
use stackscope_stacks::walk::{lookup_addresses, WalkEnd};
use stackscope_stacks::Hint;
use stackscope_symbols::Symbolizer;

use crate::event::{decode, is_kernel, Change, Event, Header};
use crate::images::Images;
use crate::order::Reorder;
use crate::paths::DevicePaths;
use crate::stitch::{Sample, Stitcher};

/// Whose samples are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// These processes, and with `children` the processes they start during the recording.
    Pids { pids: Vec<u32>, children: bool },
    /// Every process, the kernel's too; the idle process's samples (pid 0: a CPU with
    /// nothing to run) only with `idle`.
    System { idle: bool },
}

/// What the events held, beyond the stacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events decoded (of the kinds used).
    pub events: u64,
    /// Samples counted.
    pub samples: u64,
    /// Events whose payload could not be decoded.
    pub undecodable: u64,
    /// Samples taken in the kernel whose user stack never came.
    pub user_missing: u64,
}

/// The recording's state, fed one event at a time.
pub struct Collector {
    target: Target,
    wanted: HashSet<u32>,
    paths: DevicePaths,
    images: Images,
    stitcher: Stitcher,
    /// The process of each thread, for samples whose stack did not say it.
    threads: HashMap<u32, u32>,
    /// Each process's executable name.
    names: HashMap<u32, String>,
    table: StackTable,
    stitched: Vec<Sample>,
    counts: Counts,
    /// Which parts of each stack are kept.
    user: bool,
    kernel: bool,
    order: Reorder,
}

impl Collector {
    pub fn new(target: Target, paths: DevicePaths) -> Self {
        let wanted = match &target {
            Target::Pids { pids, .. } => pids.iter().copied().collect(),
            Target::System { .. } => HashSet::new(),
        };
        Collector {
            target,
            wanted,
            paths,
            images: Images::default(),
            stitcher: Stitcher::default(),
            threads: HashMap::new(),
            names: HashMap::new(),
            table: StackTable::default(),
            stitched: Vec::new(),
            counts: Counts::default(),
            user: true,
            kernel: true,
            order: Reorder::default(),
        }
    }

    /// Puts events back in the order they were logged, waiting until the newest is `window`
    /// (in the events' timestamp units) later than an event before taking it in.
    pub fn reorder_within(&mut self, window: u64) {
        self.order = Reorder::new(window);
    }

    /// Keeps only the user frames, or only the kernel frames, of each stack.
    pub fn keep(&mut self, user: bool, kernel: bool) {
        self.user = user;
        self.kernel = kernel;
    }

    /// Takes one event in, once its turn comes; an event of another kind is left alone.
    pub fn record(&mut self, header: Header, payload: Vec<u8>) {
        let mut order = std::mem::take(&mut self.order);
        order.push(header, payload, &mut |h, p| self.decoded(h, p));
        self.order = order;
    }

    fn decoded(&mut self, header: &Header, payload: &[u8]) {
        match decode(header, payload) {
            Ok(Some(event)) => self.take(event),
            Ok(None) => {}
            Err(_) => self.counts.undecodable += 1,
        }
    }

    /// Takes in one decoded event.
    pub fn take(&mut self, event: Event) {
        self.counts.events += 1;
        let mut stitched = std::mem::take(&mut self.stitched);
        match event {
            Event::Sample {
                timestamp,
                tid,
                cpu,
                ip,
            } => self.stitcher.sample(timestamp, tid, cpu, ip, &mut stitched),
            Event::Stack {
                timestamp,
                pid,
                tid,
                frames,
            } => self
                .stitcher
                .stack(timestamp, pid, tid, &frames, &mut stitched),
            Event::Image { change, image } => match change {
                Change::Start | Change::Existing => {
                    let path = self.paths.dos_path(&image.path);
                    self.images.load(&image, &path);
                }
                Change::End => self.images.unload(&image),
                Change::Remaining => {}
            },
            Event::Process {
                change,
                pid,
                parent,
                name,
                ..
            } => self.process(change, pid, parent, name),
            Event::Thread { change, pid, tid } => match change {
                Change::Start | Change::Existing => {
                    self.threads.insert(tid, pid);
                }
                Change::End => self.stitcher.thread_ended(tid, &mut stitched),
                Change::Remaining => {}
            },
        }
        for sample in stitched.drain(..) {
            self.count(sample);
        }
        self.stitched = stitched;
    }

    fn process(&mut self, change: Change, pid: u32, parent: u32, name: String) {
        match change {
            Change::Start | Change::Existing => {
                if change == Change::Start
                    && matches!(self.target, Target::Pids { children: true, .. })
                    && self.wanted.contains(&parent)
                {
                    self.wanted.insert(pid);
                }
                self.names.insert(pid, name);
            }
            // The images go, the name stays for the samples still waiting for their stacks.
            Change::End => self.images.process_ended(pid),
            Change::Remaining => {}
        }
    }

    fn count(&mut self, sample: Sample) {
        let pid = sample
            .pid
            .or_else(|| self.threads.get(&sample.tid).copied())
            .unwrap_or(0);
        let counted = match self.target {
            Target::System { idle } => idle || pid != 0,
            Target::Pids { .. } => self.wanted.contains(&pid),
        };
        if !counted {
            return;
        }
        self.counts.samples += 1;
        self.counts.user_missing += u64::from(sample.user_missing);
        let frames: Vec<RawFrame> = lookup_addresses(&sample.frames)
            .filter(|&addr| {
                if is_kernel(addr) {
                    self.kernel
                } else {
                    self.user
                }
            })
            .map(|addr| {
                let kind = if is_kernel(addr) {
                    FrameKind::Kernel
                } else {
                    FrameKind::User
                };
                let image = self.images.find(pid, addr);
                self.table.frame_in(pid, addr, image, kind)
            })
            .collect();
        // The kernel walks user stacks by the images' unwind tables to their end.
        let end = if self.user && sample.frames.iter().any(|&a| !is_kernel(a)) {
            WalkEnd::Complete
        } else {
            WalkEnd::NoStack
        };
        let sampled = Sampled {
            pid,
            tid: sample.tid,
            cpu: u32::from(sample.cpu),
            names: None,
        };
        self.table.count(sampled, &frames, end, 1);
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Counts the samples still waiting for their stacks, and names every frame once.
    pub fn finish(
        mut self,
        symbolizer: &mut Symbolizer,
        meta: Metadata,
    ) -> (Profile, Tally, Vec<Hint>) {
        let mut order = std::mem::take(&mut self.order);
        order.flush(&mut |h, p| self.decoded(h, p));
        let mut stitched = Vec::new();
        self.stitcher.finish(&mut stitched);
        for sample in stitched {
            self.count(sample);
        }
        let hints = self.hints();
        let names = self.names;
        let thread = |pid: u32, tid: u32| {
            let name = names.get(&pid).cloned().unwrap_or_default();
            Thread {
                pid,
                tid,
                comm: name.clone(),
                process_name: name,
            }
        };
        let (profile, tally) = self.table.into_profile(symbolizer, meta, &thread);
        (profile, tally, hints)
    }

    fn hints(&self) -> Vec<Hint> {
        let mut hints = Vec::new();
        let c = self.counts;
        if c.user_missing > 0 {
            hints.push(Hint::Said(format!(
                "{} of {} samples were taken in the kernel and their user stack never came (the thread ended first, or the recording did)",
                c.user_missing, c.samples
            )));
        }
        if c.undecodable > 0 {
            hints.push(Hint::Said(format!(
                "{} kernel events could not be decoded and were left out",
                c.undecodable
            )));
        }
        hints
    }
}

#[cfg(test)]
mod tests;
