//! The sampling loop: each round stops the target, reads every selected vCPU's registers,
//! unwinds its stack from target memory (DWARF CFI from the ELF, frame pointers where there is
//! none), and resumes it; at the end the counted address stacks are symbolized once each into
//! a [`Profile`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder as _};
use stackscope_profile::{
    Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread, UnwindStats,
};
use stackscope_stacks::Rounds;
use stackscope_symbols::Symbolizer;

use crate::client::{Client, Registers, Stop};
use crate::error::Error;
use crate::image::Image;
use crate::names::rust_clean;
use crate::packet::{later, Stream};
use crate::space::Space;

/// How often at most the library list is read again when code outside the known files shows
/// up in stacks.
const LIBRARY_REFRESH: Duration = Duration::from_millis(100);
/// Deepest stack followed.
pub const MAX_FRAMES: usize = 256;
/// `AT_ENTRY` in the auxiliary vector: the program's entry point as loaded.
const AT_ENTRY: u64 = 9;
/// Where x86-64 kernels live (the upper half of the address space).
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// Longest wait for the stub to stop and let go of the target once a recording's duration
/// is over.
const DETACH_GRACE: Duration = Duration::from_secs(2);

/// What to sample and for how long.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Mean time between the starts of two rounds; zero samples back to back. Each gap is
    /// drawn between half and one and a half of it, so sampling never runs in lockstep with
    /// periodic work in the guest (timer ticks, loops) and over- or under-counts it.
    pub interval: Duration,
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
        space.add_libraries(&libraries);
    }
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
/// target running) and symbolizes. Errors before the first round are returned; later ones end
/// sampling and are reported in [`Recording::failure`] beside what was collected.
pub fn record<S: Stream>(
    client: &mut Client<S>,
    mut target: Target,
    options: &SamplerOptions,
    stop: &AtomicBool,
    mut on_round: impl FnMut(Progress),
) -> Recording {
    let mut stacks = StackCounts::default();
    let mut pauses = Vec::new();
    let mut cache = CacheX86_64::new();
    let mut addrs = Vec::with_capacity(64);
    let start = Instant::now();
    let end = options
        .duration
        .map(|d| start.checked_add(d).unwrap_or_else(|| later(d)));
    client.set_end(end);
    // Connecting stopped the target; the first round starts after it ran.
    let mut failure = client.resume(0).err();
    let mut running = failure.is_none();
    let mut jitter = Jitter::seeded();
    let mut next = after(start, jitter.around(options.interval));
    let mut rounds = 0u64;
    let mut unplaced = false;
    let mut last_refresh: Option<Instant> = None;
    while failure.is_none() {
        if options.rounds.is_some_and(|n| rounds >= n) || stop.load(Ordering::Relaxed) {
            break;
        }
        if options.duration.is_some_and(|d| {
            start.elapsed().saturating_add(options.interval.min(d)) > d && rounds > 0
        }) {
            break;
        }
        // A round due after the end would only be cut off; an interval longer than the
        // whole duration still gets its one round, at once.
        if end.is_some_and(|end| next >= end) {
            if rounds > 0 {
                break;
            }
            next = Instant::now();
        }
        if !wait_until(next, stop) {
            break;
        }
        let now = Instant::now();
        // Late rounds are made up for, but never closer than a quarter of the mean gap: samples
        // taken in a burst after a stall would all land on the same spot and count it many times.
        next = after(next, jitter.around(options.interval)).max(after(now, options.interval / 4));
        let round = (|| -> Result<(), Error> {
            let signal = match client.interrupt()? {
                Stop::Signal(s) => s,
                _ => 0,
            };
            running = false;
            let threads: Vec<u64> = target.vcpus.iter().map(|v| v.1).collect();
            let regs = client.registers_of(&threads)?;
            // Each stack's first chunks in one go: most unwinds need nothing more.
            let mut memories: Vec<Memory> = threads.iter().map(|&t| Memory::new(t)).collect();
            let reads: Vec<(u64, u64, usize)> = threads
                .iter()
                .zip(&regs)
                .flat_map(|(&thread, r)| {
                    let base = r.sp & !(CHUNK - 1);
                    [base, base.wrapping_add(CHUNK)].map(|b| (thread, b, CHUNK as usize))
                })
                .collect();
            let chunks = client.read_memory_of(&reads)?;
            for (i, ((_, base, _), chunk)) in reads.iter().zip(chunks).enumerate() {
                memories[i / 2].chunks.insert(*base, chunk);
            }
            for ((&(vcpu, _), regs), memory) in target.vcpus.iter().zip(regs).zip(&mut memories) {
                let complete = unwind(&target.space, &mut cache, client, memory, regs, &mut addrs)?;
                unplaced |= addrs.iter().any(|&a| target.space.image_of(a).is_none());
                stacks.add(vcpu, &addrs, complete);
            }
            // Code outside the known files: a library loaded since the list was last read.
            let can_refresh = last_refresh.is_none_or(|t: Instant| t.elapsed() >= LIBRARY_REFRESH);
            if unplaced && client.features().libraries_svr4 && can_refresh {
                last_refresh = Some(Instant::now());
                unplaced = false;
                if let Some(list) = client.libraries()? {
                    target.space.add_libraries(&list);
                }
            }
            // SIGINT and SIGTRAP come from our interrupt; other signals belong to the target.
            let deliver = if matches!(signal, 0 | 2 | 5) {
                0
            } else {
                signal
            };
            client.resume(deliver)?;
            running = true;
            Ok(())
        })();
        match round {
            Ok(()) => {
                pauses.push(now.elapsed());
                rounds += 1;
                on_round(Progress {
                    rounds,
                    elapsed: start.elapsed(),
                });
            }
            Err(e) => failure = Some(e),
        }
    }
    let elapsed = start.elapsed();
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
            failure = Some(e);
        }
    }
    client.set_end(None);
    pauses.sort();
    let figures = Rounds {
        rounds,
        stacks: stacks.total,
        elapsed,
        pause_median: percentile(&pauses, 50),
        pause_p95: percentile(&pauses, 95),
        threads: target.all_vcpus,
        sampled_threads: target.vcpus.len(),
    };
    let meta = Metadata {
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
    };
    let profile = stacks.into_profile(&target.space, meta, options.rust_clean);
    Recording {
        profile,
        failure: failure.map(|e| e.to_string()),
        rounds: Some(figures),
        ..Recording::default()
    }
}

/// A small pseudo-random generator (xorshift64*) for the gaps between rounds.
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter(nanos | 1)
    }

    /// A duration uniformly between half and one and a half of `mean`.
    fn around(&mut self, mean: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let unit = (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        Duration::try_from_secs_f64(mean.as_secs_f64() * (0.5 + unit)).unwrap_or(mean)
    }
}

/// `at + d`, or far in the future when that is past what the clock holds.
fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d).unwrap_or_else(|| later(d))
}

/// Sleeps until `deadline`, waking early for `stop`; false when stopped.
fn wait_until(deadline: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
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

/// Target memory read for one stack, in aligned chunks so that the words an unwind reads
/// cost one request per chunk; made anew for every stack, since the target ran in between and
/// each vCPU may map memory differently.
struct Memory {
    thread: u64,
    chunks: HashMap<u64, Option<Vec<u8>>>,
}

/// Bytes per memory request: a few stack frames, and far below every stub's packet size.
const CHUNK: u64 = 512;

impl Memory {
    fn new(thread: u64) -> Self {
        Memory {
            thread,
            chunks: HashMap::new(),
        }
    }

    /// The 8-byte little-endian word at `addr`; `Ok(None)` when the target cannot read it.
    fn word<S: Stream>(&mut self, client: &mut Client<S>, addr: u64) -> Result<Option<u64>, Error> {
        let mut bytes = [0u8; 8];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let Some(a) = addr.checked_add(i as u64) else {
                return Ok(None);
            };
            let base = a & !(CHUNK - 1);
            let chunk = match self.chunks.get(&base) {
                Some(chunk) => chunk,
                None => {
                    let read = client
                        .read_memory_of(&[(self.thread, base, CHUNK as usize)])?
                        .pop()
                        .flatten();
                    self.chunks.entry(base).or_insert(read)
                }
            };
            match chunk.as_ref().and_then(|c| c.get((a - base) as usize)) {
                Some(&b) => *byte = b,
                None => return Ok(None),
            }
        }
        Ok(Some(u64::from_le_bytes(bytes)))
    }
}

/// Unwinds one vCPU's stack into `out`, leaf first: the pc, then each return address minus 1
/// (inside the call, as symbolization wants). True when the unwind reached the outermost frame.
fn unwind<S: Stream>(
    space: &Space,
    cache: &mut CacheX86_64,
    client: &mut Client<S>,
    memory: &mut Memory,
    regs: Registers,
    out: &mut Vec<u64>,
) -> Result<bool, Error> {
    out.clear();
    out.push(regs.ip);
    let mut uregs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let mut address = FrameAddress::from_instruction_pointer(regs.ip);
    let unwinder = space.unwinder();
    if space.lacks_cfi(regs.ip) {
        // framehop would take this function for a frameless leaf; its frame pointer is the
        // better guess in a file whose CFI covers only part of the code.
        if regs.bp == 0 || regs.bp < regs.sp {
            return Ok(regs.bp == 0);
        }
        let (Some(caller_bp), Some(return_address)) = (
            memory.word(client, regs.bp)?,
            memory.word(client, regs.bp.wrapping_add(8))?,
        ) else {
            return Ok(false);
        };
        let Some(next) = FrameAddress::from_return_address(return_address) else {
            return Ok(true);
        };
        out.push(return_address - 1);
        uregs = UnwindRegsX86_64::new(return_address, regs.bp + 16, caller_bp);
        address = next;
    }
    let mut failed = None;
    while out.len() < MAX_FRAMES {
        let sp_before = uregs.sp();
        let mut read = |addr: u64| -> Result<u64, ()> {
            match memory.word(client, addr) {
                Ok(Some(w)) => Ok(w),
                Ok(None) => Err(()),
                Err(e) => {
                    failed = Some(e);
                    Err(())
                }
            }
        };
        let result = unwinder.unwind_frame(address, &mut uregs, cache, &mut read);
        if let Some(e) = failed {
            return Err(e);
        }
        match result {
            Ok(None) | Ok(Some(0)) => return Ok(true),
            Ok(Some(return_address)) => {
                // Every real frame pops at least its return address; anything else loops.
                if uregs.sp() <= sp_before {
                    return Ok(false);
                }
                let Some(next) = FrameAddress::from_return_address(return_address) else {
                    return Ok(true);
                };
                out.push(return_address - 1);
                address = next;
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(false)
}

/// Address stacks counted per vCPU.
#[derive(Default)]
struct StackCounts {
    counts: HashMap<(u32, Vec<u64>), u64>,
    total: u64,
    complete: u64,
}

impl StackCounts {
    fn add(&mut self, vcpu: u32, addrs: &[u64], complete: bool) {
        self.total += 1;
        self.complete += u64::from(complete);
        match self.counts.get_mut(&(vcpu, addrs.to_vec())) {
            Some(n) => *n += 1,
            None => {
                self.counts.insert((vcpu, addrs.to_vec()), 1);
            }
        }
    }

    /// Symbolizes each unique address once, then builds the profile (each vCPU a thread).
    fn into_profile(self, space: &Space, meta: Metadata, clean: bool) -> Profile {
        let mut unique: Vec<u64> = self
            .counts
            .keys()
            .flat_map(|(_, a)| a.iter().copied())
            .collect();
        unique.sort_unstable();
        unique.dedup();
        let mut symbolizer = Symbolizer::new();
        let mut names: HashMap<u64, Vec<Frame>> = HashMap::new();
        for image in space.images() {
            let module = Some(image.name());
            let (known, offsets): (Vec<u64>, Vec<u64>) = unique
                .iter()
                .filter(|&&a| image.address_range().contains(&a))
                .filter_map(|&a| image.file_offset(a).map(|o| (a, o)))
                .unzip();
            if offsets.is_empty() {
                continue;
            }
            let resolved = symbolizer
                .symbolize_file(image.path(), None, &offsets)
                .unwrap_or_else(|_| vec![Vec::new(); offsets.len()]);
            for (addr, syms) in known.into_iter().zip(resolved) {
                let kind = kind_of(addr);
                let frames = syms
                    .into_iter()
                    .map(|s| Frame {
                        name: if clean { rust_clean(&s.name) } else { s.name },
                        module: module.clone(),
                        file: s.file,
                        line: s.line,
                        inlined: s.inlined,
                        kind,
                    })
                    .collect();
                names.insert(addr, frames);
            }
        }
        let process_name = space.main().name();

        let mut builder = ProfileBuilder::new(meta);
        let mut with_unknown = 0;
        let mut threads = HashMap::new();
        let mut keys: Vec<_> = self.counts.into_iter().collect();
        // A stable order makes outputs reproducible run to run.
        keys.sort();
        let mut chain = Vec::new();
        for ((vcpu, addrs), count) in keys {
            chain.clear();
            let mut unknown = false;
            for &addr in addrs.iter().rev() {
                match names.get(&addr) {
                    Some(frames) if !frames.is_empty() => {
                        for f in frames {
                            chain.push(builder.frame(f.clone()));
                        }
                    }
                    _ => {
                        unknown = true;
                        chain.push(builder.frame(Frame {
                            name: stackscope_profile::UNKNOWN.into(),
                            kind: kind_of(addr),
                            ..Frame::default()
                        }));
                    }
                }
            }
            if unknown {
                with_unknown += count;
            }
            let stack = builder.stack(&chain);
            let thread = *threads.entry(vcpu).or_insert_with(|| {
                builder.thread(Thread {
                    pid: 1,
                    tid: vcpu,
                    comm: format!("cpu{vcpu}"),
                    process_name: process_name.clone(),
                })
            });
            builder.add(thread, stack, Some(vcpu), count);
        }
        builder.meta_mut().unwind = UnwindStats {
            user_stacks: self.total,
            complete: self.complete,
            with_unknown,
            truncated: 0,
            unreadable: 0,
        };
        builder.finish()
    }
}

fn kind_of(addr: u64) -> FrameKind {
    if addr >= KERNEL_HALF {
        FrameKind::Kernel
    } else {
        FrameKind::User
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_stay_within_half_and_one_and_a_half_of_the_mean() {
        let mut jitter = Jitter::seeded();
        let mean = Duration::from_millis(10);
        let gaps: Vec<Duration> = (0..10_000).map(|_| jitter.around(mean)).collect();
        assert!(gaps.iter().all(|&g| g >= mean / 2 && g <= mean * 3 / 2));
        let average = gaps.iter().sum::<Duration>() / gaps.len() as u32;
        assert!(
            average > mean * 95 / 100 && average < mean * 105 / 100,
            "{average:?}"
        );
        // Spread over the whole range, not stuck on a few values.
        assert!(
            gaps.iter().any(|&g| g < mean * 6 / 10) && gaps.iter().any(|&g| g > mean * 14 / 10)
        );
    }

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
