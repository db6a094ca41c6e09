//! Events stacks are counted at besides the cpu-clock timer (`--event`): uprobes and
//! uretprobes, kprobes and kretprobes, tracepoints and USDT probes, spelled as bpftrace and
//! cargo-trace spell them, resolved to what the kernel attaches to before anything is loaded
//! (so a probe that cannot attach is one line naming near matches), and attached to the one
//! counting program.

mod alloc;
mod attach;
mod near;
mod probed_file;
mod resolve;
mod usdt;

use std::fmt;
use std::str::FromStr;

use stackscope_process::target::Target;

use crate::error::BpfError;
use crate::{MemoryProfile, Rate, TimeProfile};
pub use alloc::AllocFn;
use alloc::{alloc_sites, AllocSite};
pub(crate) use attach::Probes;
use resolve::{resolve, Resolved};
use stackscope_process::SampleError;

/// One event, as `--event` spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSpec {
    /// `profile:hz:N`: the cpu-clock timer, N samples per second per CPU.
    Timer { hz: u64 },
    /// `uprobe:FILE:FUNC` or `uretprobe:FILE:FUNC`: FILE is a path, a library name as the
    /// loader finds it (`libc`) or a program in PATH.
    Uprobe {
        file: String,
        func: String,
        ret: bool,
    },
    /// `kprobe:FUNC` or `kretprobe:FUNC`.
    Kprobe { func: String, ret: bool },
    /// `tracepoint:CATEGORY:NAME`.
    Tracepoint { category: String, name: String },
    /// `usdt:FILE:PROVIDER:NAME` (or `usdt:FILE:NAME`, any provider).
    Usdt {
        file: String,
        provider: Option<String>,
        name: String,
    },
}

impl EventSpec {
    /// Whether the event is the timer rather than a probe.
    pub fn is_timer(&self) -> bool {
        matches!(self, EventSpec::Timer { .. })
    }
}

/// What a recording counts at: whether the timer runs, the probes resolved, and each event's
/// name by its index in the count key (0: the timer).
pub(crate) struct Plan {
    pub timer: bool,
    pub probes: Vec<Resolved>,
    pub names: Vec<String>,
    /// The event index off-CPU time is counted under, when it is.
    pub off_cpu: Option<u32>,
    /// Nanoseconds of CPU time a timer sample stands for, when counts are time (`--wall`).
    pub timer_ns: Option<u64>,
    /// Memory counted at the allocator's entry points, when it is.
    pub alloc: Option<AllocPlan>,
}

/// How memory is counted (`--alloc`, `--in-use`).
pub(crate) struct AllocPlan {
    /// The event index allocations are counted under.
    pub event: u32,
    pub sites: Vec<AllocSite>,
    /// Keep live blocks, up to this many (`--in-use`); `None`: totals by stack (`--alloc`).
    pub max_live: Option<u32>,
}

/// The names of on-CPU and off-CPU time, as events and as root frames.
pub(crate) const ON_CPU: &str = "on-cpu";
pub(crate) const OFF_CPU: &str = "off-cpu";

impl Plan {
    /// True when nothing but the cpu-clock timer's samples is counted.
    pub fn only_timer(&self) -> bool {
        self.timer && self.probes.is_empty() && self.off_cpu.is_none() && self.alloc.is_none()
    }

    /// Resolves the probes of `events` (none: the timer alone) for `target`; `timer` names the
    /// timer when it is implied.
    pub fn new(events: &[EventSpec], target: &Target, timer: &str) -> Result<Plan, BpfError> {
        let running = match target {
            Target::Pids(ids) | Target::Tids(ids) => ids.first().copied(),
            _ => None,
        };
        let mut plan = Plan {
            timer: events.is_empty(),
            probes: Vec::new(),
            names: vec![timer.to_string()],
            off_cpu: None,
            timer_ns: None,
            alloc: None,
        };
        for event in events {
            if event.is_timer() {
                plan.timer = true;
                plan.names[0] = event.to_string();
            } else if !plan.names[1..].contains(&event.to_string()) {
                plan.probes.push(resolve(event, running)?);
                plan.names.push(event.to_string());
            }
        }
        Ok(plan)
    }

    /// Adds off-CPU time (`--off-cpu`), or on- and off-CPU time (`--wall`, the timer at
    /// `rate`), to a plan that counts no probes: a profile weighs its stacks by one unit.
    pub fn with_time(mut self, time: Option<&TimeProfile>, rate: Rate) -> Result<Plan, BpfError> {
        let Some(time) = time else {
            return Ok(self);
        };
        if let Some(probe) = self.names.get(1) {
            return Err(SampleError::InvalidConfig(format!(
                "{probe} counts hits and {time} counts time: record them apart"
            ))
            .into());
        }
        match time {
            TimeProfile::OffCpu { .. } => self.timer = false,
            TimeProfile::Wall => {
                self.timer = true;
                self.names[0] = ON_CPU.to_string();
                // The cpu-clock event runs every 1e9/hz ns (perf turns a frequency into that
                // period for clock events).
                self.timer_ns = Some(match rate {
                    Rate::Frequency(hz) => 1_000_000_000 / hz.max(1),
                    Rate::Period(ns) => ns,
                });
            }
        }
        self.off_cpu = Some(self.names.len() as u32);
        self.names.push(OFF_CPU.to_string());
        Ok(self)
    }

    /// Counts memory instead (`--alloc`, `--in-use`) at the allocator's entry points of the
    /// files `target` runs and at the program's own allocators `own`, in a plan that counts nothing else: a profile weighs its stacks by
    /// one unit.
    pub fn with_memory(
        mut self,
        memory: Option<&MemoryProfile>,
        target: &Target,
        own: &[AllocFn],
    ) -> Result<Plan, BpfError> {
        let Some(memory) = memory else {
            return Ok(self);
        };
        if let Some(other) = self.names.get(1) {
            return Err(SampleError::InvalidConfig(format!(
                "{other} counts hits or time and {memory} counts bytes: record them apart"
            ))
            .into());
        }
        let max_live = match memory {
            MemoryProfile::Allocated => None,
            MemoryProfile::InUse { max_live, .. } => Some(*max_live),
        };
        self.timer = false;
        self.alloc = Some(AllocPlan {
            event: self.names.len() as u32,
            sites: alloc_sites(target, max_live.is_some(), own)?,
            max_live,
        });
        self.names.push(memory.event().to_string());
        Ok(self)
    }

    /// What a count of `event` weighs in the profile: the count itself, or with time counted,
    /// microseconds (rounded) of the nanoseconds off the CPU or of the timer's samples.
    pub fn weight(&self, event: u32, count: u64) -> u64 {
        if self.off_cpu.is_none() {
            return count;
        }
        let ns = match (event, self.timer_ns) {
            (0, Some(period)) => count.saturating_mul(period),
            _ => count,
        };
        ns.saturating_add(500) / 1000
    }

    /// The events counted, in the count key's order (the timer first when it runs).
    pub fn counted(&self) -> impl Iterator<Item = &str> {
        let skip = usize::from(!self.timer);
        self.names[skip..].iter().map(String::as_str)
    }

    /// Whether stacks carry their event as a root frame to stay apart: with several events.
    pub fn marks_events(&self) -> bool {
        self.counted().count() > 1
    }

    /// Whether the stacks counted under `event` were taken just after a return: a uretprobe's
    /// and an allocation's (the caller's stack, whose leaf is a return address).
    pub fn taken_at_return(&self, event: u32) -> bool {
        if self.alloc.as_ref().is_some_and(|a| a.event == event) {
            return true;
        }
        let probe = (event as usize)
            .checked_sub(1)
            .and_then(|i| self.probes.get(i));
        matches!(probe, Some(Resolved::Uprobe { ret: true, .. }))
    }

    pub fn has_tracepoints(&self) -> bool {
        self.probes
            .iter()
            .any(|p| matches!(p, Resolved::Tracepoint { .. }))
    }

    /// Whether a uprobe, USDT probe or kprobe is counted.
    pub fn has_probes(&self) -> bool {
        self.probes
            .iter()
            .any(|p| !matches!(p, Resolved::Tracepoint { .. }))
    }
}

const SYNTAX: &str = "profile:hz:N, uprobe:FILE:FUNC, uretprobe:FILE:FUNC, kprobe:FUNC, kretprobe:FUNC, tracepoint:CATEGORY:NAME or usdt:FILE:[PROVIDER:]NAME";

impl FromStr for EventSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("event `{s}`: {why} (events are {SYNTAX})");
        let (kind, rest) = s.split_once(':').ok_or_else(|| bad("no probe type"))?;
        let nonempty = |part: &str, what: &str| {
            if part.is_empty() {
                Err(bad(&format!("no {what}")))
            } else {
                Ok(part.to_string())
            }
        };
        // A file may hold no ':', so the function is what follows the last one.
        let file_and = |what: &str| -> Result<(String, String), String> {
            let (file, last) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("give FILE:{what}")))?;
            Ok((nonempty(file, "file")?, nonempty(last, what)?))
        };
        Ok(match kind {
            "profile" | "p" => {
                let hz = rest
                    .strip_prefix("hz:")
                    .ok_or_else(|| bad("give profile:hz:N"))?;
                match hz.parse::<u64>() {
                    Ok(hz) if hz > 0 => EventSpec::Timer { hz },
                    _ => return Err(bad("N must be a number of samples per second above 0")),
                }
            }
            "uprobe" | "u" | "uretprobe" | "ur" => {
                let (file, func) = file_and("FUNC")?;
                EventSpec::Uprobe {
                    file,
                    func,
                    ret: kind.starts_with("ur"),
                }
            }
            "kprobe" | "k" | "kretprobe" | "kr" => {
                if rest.contains(':') {
                    return Err(bad("kernel modules are not named: give kprobe:FUNC"));
                }
                EventSpec::Kprobe {
                    func: nonempty(rest, "function")?,
                    ret: kind.starts_with("kr"),
                }
            }
            "tracepoint" | "t" => {
                let (category, name) = rest
                    .split_once(':')
                    .ok_or_else(|| bad("give tracepoint:CATEGORY:NAME"))?;
                EventSpec::Tracepoint {
                    category: nonempty(category, "category")?,
                    name: nonempty(name, "name")?,
                }
            }
            "usdt" | "U" => {
                let (head, name) = file_and("NAME")?;
                // usdt:FILE:PROVIDER:NAME when the file part holds another ':' that is not
                // the only one of a path.
                let (file, provider) = match head.rsplit_once(':') {
                    Some((file, provider)) if !file.is_empty() => {
                        (file.to_string(), Some(nonempty(provider, "provider")?))
                    }
                    _ => (head, None),
                };
                EventSpec::Usdt {
                    file,
                    provider,
                    name,
                }
            }
            _ => return Err(bad(&format!("unknown probe type `{kind}`"))),
        })
    }
}

impl fmt::Display for EventSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventSpec::Timer { hz } => write!(f, "profile:hz:{hz}"),
            EventSpec::Uprobe { file, func, ret } => {
                let kind = if *ret { "uretprobe" } else { "uprobe" };
                write!(f, "{kind}:{file}:{func}")
            }
            EventSpec::Kprobe { func, ret } => {
                let kind = if *ret { "kretprobe" } else { "kprobe" };
                write!(f, "{kind}:{func}")
            }
            EventSpec::Tracepoint { category, name } => write!(f, "tracepoint:{category}:{name}"),
            EventSpec::Usdt {
                file,
                provider: Some(provider),
                name,
            } => write!(f, "usdt:{file}:{provider}:{name}"),
            EventSpec::Usdt {
                file,
                provider: None,
                name,
            } => write!(f, "usdt:{file}:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> EventSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_every_kind_and_spells_it_back() {
        for s in [
            "profile:hz:99",
            "uprobe:/lib/x86_64-linux-gnu/libc.so.6:malloc",
            "uprobe:libc:malloc",
            "uretprobe:./prog:parse",
            "kprobe:do_sys_openat2",
            "kretprobe:do_sys_openat2",
            "tracepoint:syscalls:sys_enter_write",
            "usdt:./prog:provider:name",
            "usdt:./prog:name",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
        assert_eq!(
            parse("u:libc:malloc"),
            EventSpec::Uprobe {
                file: "libc".into(),
                func: "malloc".into(),
                ret: false
            }
        );
        assert_eq!(parse("kr:vfs_read").to_string(), "kretprobe:vfs_read");
        assert!(parse("profile:hz:99").is_timer());
    }

    #[test]
    fn refuses_malformed_events_in_one_line() {
        for s in [
            "malloc",
            "profile:hz:0",
            "profile:ms:10",
            "uprobe:malloc",
            "uprobe::malloc",
            "uprobe:libc:",
            "kprobe:",
            "tracepoint:sched",
            "hardware:cycles",
        ] {
            let err = s.parse::<EventSpec>().unwrap_err();
            assert!(err.contains(s) && !err.contains('\n'), "{s}: {err}");
        }
    }
}
