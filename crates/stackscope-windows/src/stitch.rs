//! Stitching a sample's stacks. The kernel walks the stack of a SampledProfile event and logs
//! it as StackWalk events carrying the sample's timestamp: when the timer interrupted user
//! code, one event with the user frames; when it interrupted kernel code, one event with the
//! kernel frames right away, and the user frames only when the thread next returns to user
//! mode, in one event that serves every sample the thread took in the kernel meanwhile (its
//! timestamp is the first of them). So a sample waits, per thread, until its user part comes.

use std::collections::{HashMap, VecDeque};

use crate::event::is_kernel;

/// Processes that never run user code: the idle process and the System process.
const KERNEL_PROCESSES: [u32; 2] = [0, 4];

/// Samples a thread may keep waiting for their user stack; past it the oldest are given up
/// waiting, so a thread that stays in the kernel cannot hold memory without bound.
const MAX_WAITING: usize = 4096;

/// One sample with its whole stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// From the stack's event; `None` when no stack came (the caller looks up the thread).
    pub pid: Option<u32>,
    pub tid: u32,
    pub cpu: u16,
    pub timestamp: u64,
    /// Leaf first: the kernel frames, then the user frames.
    pub frames: Vec<u64>,
    /// The sample's kernel part came, but its user part never did (the thread ended, or the
    /// recording did, first).
    pub user_missing: bool,
}

#[derive(Debug)]
struct Waiting {
    timestamp: u64,
    cpu: u16,
    ip: u64,
    pid: Option<u32>,
    kernel: Vec<u64>,
}

impl Waiting {
    fn complete(self, tid: u32, user: &[u64]) -> Sample {
        let user_missing = user.is_empty() && is_kernel(self.ip) && !self.in_kernel_process();
        let mut frames = self.kernel;
        frames.extend_from_slice(user);
        if frames.is_empty() && self.ip != 0 {
            frames.push(self.ip);
        }
        Sample {
            pid: self.pid,
            tid,
            cpu: self.cpu,
            timestamp: self.timestamp,
            user_missing,
            frames,
        }
    }

    fn in_kernel_process(&self) -> bool {
        self.pid.is_some_and(|p| KERNEL_PROCESSES.contains(&p))
    }
}

/// Samples waiting for their stacks, by thread, oldest first.
#[derive(Debug, Default)]
pub struct Stitcher {
    waiting: HashMap<u32, VecDeque<Waiting>>,
}

impl Stitcher {
    /// A SampledProfile event: the sample waits for its stacks.
    pub fn sample(&mut self, timestamp: u64, tid: u32, cpu: u16, ip: u64, out: &mut Vec<Sample>) {
        let queue = self.waiting.entry(tid).or_default();
        queue.push_back(Waiting {
            timestamp,
            cpu,
            ip,
            pid: None,
            kernel: Vec::new(),
        });
        if queue.len() > MAX_WAITING {
            let oldest = queue.pop_front().expect("queue is not empty");
            out.push(oldest.complete(tid, &[]));
        }
    }

    /// A StackWalk event: its kernel frames go to the sample of the same timestamp, its user
    /// frames to every sample of the thread up to that timestamp, which are then whole.
    pub fn stack(
        &mut self,
        timestamp: u64,
        pid: u32,
        tid: u32,
        frames: &[u64],
        out: &mut Vec<Sample>,
    ) {
        let split = frames
            .iter()
            .position(|&a| !is_kernel(a))
            .unwrap_or(frames.len());
        let (kernel, user) = frames.split_at(split);
        let queue = self.waiting.entry(tid).or_default();
        if !kernel.is_empty() {
            let same = queue
                .iter()
                .position(|w| w.timestamp == timestamp && w.kernel.is_empty());
            let index = same.unwrap_or_else(|| {
                // A stack whose sample event was lost: it is a sample still.
                queue.push_back(Waiting {
                    timestamp,
                    cpu: 0,
                    ip: kernel[0],
                    pid: None,
                    kernel: Vec::new(),
                });
                queue.len() - 1
            });
            queue[index].kernel = kernel.to_vec();
            queue[index].pid = Some(pid);
            if user.is_empty() && KERNEL_PROCESSES.contains(&pid) {
                // The idle and System threads never return to user mode.
                let waiting = queue.remove(index).expect("index is in the queue");
                out.push(waiting.complete(tid, &[]));
            }
        }
        if !user.is_empty() {
            let mut served = false;
            while queue.front().is_some_and(|w| w.timestamp <= timestamp) {
                let mut waiting = queue.pop_front().expect("front exists");
                waiting.pid = Some(pid);
                out.push(waiting.complete(tid, user));
                served = true;
            }
            if !served {
                out.push(Sample {
                    pid: Some(pid),
                    tid,
                    cpu: 0,
                    timestamp,
                    frames: user.to_vec(),
                    user_missing: false,
                });
            }
        }
        if queue.is_empty() {
            self.waiting.remove(&tid);
        }
    }

    /// The thread ended: its samples will get no user stack.
    pub fn thread_ended(&mut self, tid: u32, out: &mut Vec<Sample>) {
        if let Some(queue) = self.waiting.remove(&tid) {
            out.extend(queue.into_iter().map(|w| w.complete(tid, &[])));
        }
    }

    /// The recording ended: every waiting sample is taken with what it has.
    pub fn finish(&mut self, out: &mut Vec<Sample>) {
        for (tid, queue) in self.waiting.drain() {
            out.extend(queue.into_iter().map(|w| w.complete(tid, &[])));
        }
    }
}

#[cfg(test)]
mod tests;
