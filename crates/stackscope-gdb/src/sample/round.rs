//! One round: stop the target, read every sampled vCPU's registers, walk each stack from
//! target memory, count it, and let the target run again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stackscope_profile::FrameKind;
use stackscope_stacks::arch::WalkCache;
use stackscope_stacks::table::{RawFrame, Sampled, StackTable};
use stackscope_stacks::walk::WalkEnd;

use crate::client::{Answer, Ask, Client, Registers, StopReply};
use crate::error::Error;
use crate::packet::Stream;
use crate::space::Space;

use super::memory::{Contents, Memory};
use super::reach::{Reach, PAGE};
use super::steps::{Step, Steps};
use super::Target;

/// How often at most the library list is read again when code outside the known files shows
/// up in stacks.
const LIBRARY_REFRESH: Duration = Duration::from_millis(100);
/// Where x86-64 kernels live (the upper half of the address space).
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// The process every vCPU is a thread of.
const PID: u32 = 1;
/// What a stub takes in one memory request when it does not say: far below every stub's
/// packet size.
const DEFAULT_READ: u64 = 1024;
/// How far below the last look's stack pointer a round reads ahead, within its page: a
/// look a few calls deeper in the same stack finds its words read.
const AHEAD_BELOW: u64 = 512;
/// Pcs whose instruction before them is remembered (a guest idles at a few).
const MAX_IDLE_PCS: usize = 1 << 12;

/// What sampling keeps from round to round.
pub(super) struct Sampling {
    stacks: StackTable,
    /// Stacks counted.
    pub(super) counted: u64,
    /// True while the target runs.
    pub(super) running: bool,
    cache: WalkCache,
    addrs: Vec<u64>,
    frames: Vec<RawFrame>,
    /// The main file's name, as every vCPU's process name.
    process: String,
    /// Set when code outside the known files showed up in a stack.
    unplaced: bool,
    last_refresh: Option<Instant>,
    /// Stacks with code outside the known files, counted by address until the end: a library
    /// list read later may place them (a program's first stacks are taken before its
    /// libraries are listed).
    held: HashMap<(u32, Vec<u64>, WalkEnd), u64>,
    /// How much stack to read first, per pc.
    reach: Reach,
    /// Per vCPU, the stretch of stack its next look likely needs, read together with the
    /// stop and the registers: around the stack its last look walked.
    ahead: HashMap<u32, (u64, usize)>,
    /// Whether the instruction before a pc waits for an interrupt, per pc seen not to run.
    idles_at: HashMap<u64, bool>,
    /// Each vCPU's registers at its last look, as a digest.
    last_look: HashMap<u32, u64>,
    /// Looks at a vCPU that had not run since the round before, left uncounted.
    pub(super) stale: u64,
    /// Where each round's pause went.
    pub(super) steps: Steps,
    /// When the target was last let run, and how long it ran before each round.
    resumed: Option<Instant>,
    pub(super) runs: Vec<Duration>,
}

/// What a round learnt of each sampled vCPU at the stop, in `Target::vcpus` order.
struct Looks {
    regs: Vec<Registers>,
    /// The stack read ahead with the stop, where the stub answered.
    ahead: Vec<Option<(u64, Vec<u8>)>>,
    /// Whether the registers are all as they were at the vCPU's last look.
    unchanged: Vec<bool>,
}

impl Sampling {
    /// Memory reads of at most `packet_size` bytes of reply (the stub's `PacketSize`).
    pub(super) fn new(stacks: StackTable, process: String, packet_size: Option<usize>) -> Sampling {
        // Hex doubles each byte; a few bytes go to the framing.
        let most = packet_size.map_or(DEFAULT_READ, |size| size.saturating_sub(8) as u64 / 2);
        Sampling {
            stacks,
            counted: 0,
            running: false,
            cache: WalkCache::default(),
            addrs: Vec::with_capacity(64),
            frames: Vec::with_capacity(64),
            process,
            unplaced: false,
            last_refresh: None,
            held: HashMap::new(),
            reach: Reach::new(most),
            ahead: HashMap::new(),
            idles_at: HashMap::new(),
            last_look: HashMap::new(),
            stale: 0,
            steps: Steps::new(),
            resumed: None,
            runs: Vec::new(),
        }
    }

    /// The target runs from now on.
    pub(super) fn resumed(&mut self) {
        self.running = true;
        self.resumed = Some(Instant::now());
    }

    /// Samples every selected vCPU once, the target stopped meanwhile.
    pub(super) fn round<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        target: &mut Target,
    ) -> Result<(), Error> {
        self.steps.start();
        if let Some(resumed) = self.resumed.take() {
            self.runs.push(resumed.elapsed());
        }
        let (stop, asks, answers) = self.stop_and_ask(client, target)?;
        self.steps.end(Step::StopAndRegisters);
        let mut looks = self.looks(target, &asks, answers);
        let idle = target.space.main().arch().idle_instruction();
        let probes = self.idle_probes(target, &looks, idle);
        let memories = self.stack_memories(client, target, &mut looks, &probes, idle)?;
        self.steps.end(Step::StackMemory);
        self.walk_and_count(client, target, &looks, memories)?;
        self.steps.end(Step::Walk);
        self.refresh_libraries(client, &mut target.space)?;
        client.resume(signal_to_deliver(stop))?;
        self.resumed();
        self.steps.end(Step::Resume);
        Ok(())
    }

    /// A round that only stops the target with every sampled vCPU's registers read and
    /// resumes it: the least any round costs on this stub and host, against which the
    /// others' pause is weighed. Nothing is walked or counted.
    pub(super) fn floor_round<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        target: &Target,
    ) -> Result<(), Error> {
        let asks: Vec<Ask> = target
            .vcpus
            .iter()
            .map(|&(_, thread)| Ask::Registers(thread))
            .collect();
        let (stop, _) = client.interrupt_and_ask(&asks)?;
        self.running = false;
        client.resume(signal_to_deliver(stop))?;
        self.resumed();
        Ok(())
    }

    /// Stops the target and asks, in the stop's round trip, each vCPU's registers and the
    /// stack its last look walked.
    fn stop_and_ask<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        target: &Target,
    ) -> Result<(StopReply, Vec<Ask>, Vec<Answer>), Error> {
        let mut asks = Vec::with_capacity(target.vcpus.len() * 2);
        for &(vcpu, thread) in &target.vcpus {
            asks.push(Ask::Registers(thread));
            if let Some(&(addr, len)) = self.ahead.get(&vcpu) {
                asks.push(Ask::Memory { thread, addr, len });
            }
        }
        let (stop, answers) = client.interrupt_and_ask(&asks)?;
        self.running = false;
        Ok((stop, asks, answers))
    }

    /// Each vCPU's look from the answers to `asks`: its registers, the stack read ahead with
    /// them, and whether they are as they were at its last look.
    fn looks(&mut self, target: &Target, asks: &[Ask], answers: Vec<Answer>) -> Looks {
        let mut regs = Vec::with_capacity(target.vcpus.len());
        let mut ahead = Vec::with_capacity(target.vcpus.len());
        for (ask, answer) in asks.iter().zip(answers) {
            match (ask, answer) {
                (_, Answer::Registers(r)) => {
                    regs.push(r);
                    ahead.push(None);
                }
                (&Ask::Memory { addr, .. }, Answer::Memory(Some(bytes))) => {
                    if let Some(last) = ahead.last_mut() {
                        *last = Some((addr, bytes));
                    }
                }
                _ => {}
            }
        }
        let unchanged = self.unchanged(target, &regs);
        Looks {
            regs,
            ahead,
            unchanged,
        }
    }

    /// The instruction before the pc of each vCPU that seems not to have run, where not known
    /// yet, as `(thread, addr, len)` reads: one that waits for an interrupt says it idles
    /// instead.
    fn idle_probes(&self, target: &Target, looks: &Looks, idle: &[u8]) -> Vec<(u64, u64, usize)> {
        target
            .vcpus
            .iter()
            .zip(&looks.regs)
            .zip(&looks.unchanged)
            .filter(|((_, r), &same)| same && !self.idles_at.contains_key(&r.pc))
            .map(|((&(_, thread), r), _)| {
                (thread, r.pc.wrapping_sub(idle.len() as u64), idle.len())
            })
            .collect()
    }

    /// Each stack's words, `None` for a look known to repeat the last: from what was read
    /// ahead where that covers them, else read now in one round trip with `probes`, whose
    /// answers teach which pcs idle.
    fn stack_memories<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        target: &Target,
        looks: &mut Looks,
        probes: &[(u64, u64, usize)],
        idle: &[u8],
    ) -> Result<Vec<Option<Memory>>, Error> {
        let mut memories: Vec<Option<Memory>> = Vec::with_capacity(looks.regs.len());
        let mut stacks = Vec::new();
        let mut unread = Vec::new();
        let read_ahead = std::mem::take(&mut looks.ahead);
        for (((&(_, thread), r), ahead), &same) in target
            .vcpus
            .iter()
            .zip(&looks.regs)
            .zip(read_ahead)
            .zip(&looks.unchanged)
        {
            // A look known to repeat the last is not walked.
            if same && self.idles_at.get(&r.pc) == Some(&false) {
                memories.push(None);
                continue;
            }
            let len = self.reach.of(r.pc, r.sp);
            let memory =
                ahead.and_then(|(addr, bytes)| Memory::within(thread, r.sp, len, addr, bytes));
            if memory.is_none() {
                unread.push(memories.len());
                stacks.push((thread, r.sp, len));
            }
            memories.push(memory);
        }
        if !stacks.is_empty() || !probes.is_empty() {
            let (read, probed) = Memory::of_stacks(client, &stacks, probes)?;
            for (i, memory) in unread.into_iter().zip(read) {
                memories[i] = Some(memory);
            }
            self.learn_idles(probes, probed, idle);
        }
        Ok(memories)
    }

    /// Remembers, per probed pc, whether the instruction before it is `idle`.
    fn learn_idles(&mut self, probes: &[(u64, u64, usize)], probed: Contents, idle: &[u8]) {
        for (&(_, addr, _), bytes) in probes.iter().zip(probed) {
            let pc = addr.wrapping_add(idle.len() as u64);
            if self.idles_at.len() >= MAX_IDLE_PCS {
                self.idles_at.clear();
            }
            // Unreadable code is not known not to idle: asked again next time.
            if let Some(bytes) = bytes {
                self.idles_at.insert(pc, bytes == idle);
            }
        }
    }

    /// Walks each stack read and counts it, or holds it by address when it reaches code a
    /// library list read later may place; a vCPU that has not run since its last look (and
    /// does not idle) is left uncounted as stale.
    fn walk_and_count<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        target: &Target,
        looks: &Looks,
        memories: Vec<Option<Memory>>,
    ) -> Result<(), Error> {
        let may_place_later = client.features().libraries_svr4;
        for (((&(vcpu, _), &regs), memory), &same) in target
            .vcpus
            .iter()
            .zip(&looks.regs)
            .zip(memories)
            .zip(&looks.unchanged)
        {
            if same && self.idles_at.get(&regs.pc) != Some(&true) {
                self.stale += 1;
                continue;
            }
            let Some(mut memory) = memory else { continue };
            let space = &target.space;
            let end = memory.unwind(space, &mut self.cache, client, regs, &mut self.addrs)?;
            self.reach.learn(regs.pc, memory.reach);
            self.ahead.insert(vcpu, self.read_ahead(regs));
            let unplaced = self.addrs.iter().any(|&a| space.image_of(a).is_none());
            self.unplaced |= unplaced;
            self.counted += 1;
            if unplaced && may_place_later {
                let key = (vcpu, self.addrs.clone(), end);
                *self.held.entry(key).or_insert(0) += 1;
            } else {
                let addrs = std::mem::take(&mut self.addrs);
                self.count(space, vcpu, &addrs, end, 1);
                self.addrs = addrs;
            }
        }
        Ok(())
    }

    /// What the next round reads ahead for a vCPU whose look had `regs`: from a little below
    /// the stack pointer (not past its page) up to what a walk from the pc reads.
    fn read_ahead(&self, regs: Registers) -> (u64, usize) {
        let end = regs
            .sp
            .saturating_add(self.reach.of(regs.pc, regs.sp) as u64);
        let floor = (regs.sp & !(PAGE - 1)).max(end.saturating_sub(self.reach.most()));
        let start = regs.sp.saturating_sub(AHEAD_BELOW).max(floor);
        (start, (end - start) as usize)
    }

    /// For each sampled vCPU, whether its registers are all as they were at its last look;
    /// remembers them for the next.
    fn unchanged(&mut self, target: &Target, regs: &[Registers]) -> Vec<bool> {
        target
            .vcpus
            .iter()
            .zip(regs)
            .map(|(&(vcpu, _), r)| {
                self.last_look.insert(vcpu, r.fingerprint) == Some(r.fingerprint)
            })
            .collect()
    }

    /// The stacks counted, the held ones placed among the files known at the end.
    pub(super) fn into_table(mut self, space: &Space) -> StackTable {
        for ((vcpu, addrs, end), n) in std::mem::take(&mut self.held) {
            self.count(space, vcpu, &addrs, end, n);
        }
        self.stacks
    }

    /// Counts `n` samples of vCPU `vcpu` with the stack `addrs`.
    fn count(&mut self, space: &Space, vcpu: u32, addrs: &[u64], end: WalkEnd, n: u64) {
        self.frames.clear();
        for &addr in addrs {
            let frame = self
                .stacks
                .frame_in(PID, addr, space.mapping_of(addr), kind_of(addr));
            self.frames.push(frame);
        }
        // Where the walk stopped: the file of the last address it reached.
        let end = end.in_module(|| {
            let last = addrs.last().and_then(|&a| space.image_of(a));
            last.map(|image| Arc::from(image.name()))
        });
        let comm = format!("cpu{vcpu}");
        let sampled = Sampled {
            pid: PID,
            tid: vcpu,
            cpu: vcpu,
            names: Some((comm.as_str(), self.process.as_str())),
        };
        self.stacks.count(sampled, &self.frames, end, n);
    }

    /// Reads the library list again when code outside the known files showed up: a library
    /// loaded since it was last read.
    fn refresh_libraries<S: Stream>(
        &mut self,
        client: &mut Client<S>,
        space: &mut Space,
    ) -> Result<(), Error> {
        let can_refresh = self
            .last_refresh
            .is_none_or(|t: Instant| t.elapsed() >= LIBRARY_REFRESH);
        if self.unplaced && client.features().libraries_svr4 && can_refresh {
            self.last_refresh = Some(Instant::now());
            self.unplaced = false;
            if let Some(list) = client.libraries()? {
                space.add_libraries(&list, || client.stopped());
            }
        }
        Ok(())
    }
}

/// The signal to hand the target as it resumes after `stop`: SIGINT and SIGTRAP come from
/// our interrupt; other signals belong to the target.
fn signal_to_deliver(stop: StopReply) -> u8 {
    match stop {
        StopReply::Signal(0 | 2 | 5) => 0,
        StopReply::Signal(signal) => signal,
        _ => 0,
    }
}

/// A guest kernel's frames are kernel code, wherever its file placed them.
fn kind_of(addr: u64) -> FrameKind {
    if addr >= KERNEL_HALF {
        FrameKind::Kernel
    } else {
        FrameKind::User
    }
}

/// The thread of a vCPU whose samples were counted without names; every sample is counted
/// with them, but the table wants an answer all the same.
pub(super) fn vcpu_thread(process: String) -> impl Fn(u32, u32) -> stackscope_profile::Thread {
    move |pid, tid| stackscope_profile::Thread {
        pid,
        tid,
        comm: format!("cpu{tid}"),
        process_name: process.clone(),
    }
}
