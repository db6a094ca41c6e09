//! Attaching the counting program to the resolved probes. Each attachment carries its
//! event's index (the count key's `event`) as its attach cookie.

use std::collections::HashMap;

use libbpf_rs::{KprobeOpts, Link, TracepointCategory, TracepointOpts, UprobeOpts};

use super::alloc::{AllocKind, AllocSite};
use super::{Plan, Resolved};
use stackscope_stacks::Hint;

use crate::error::BpfError;
use crate::program::ProfileSkel;

/// The program's links to the probes; dropping a link detaches it.
pub(crate) struct Probes {
    links: Vec<Link>,
    /// The processes the probes in user code went into at the start (-1: every process).
    started: Vec<i32>,
    /// Processes the target started since (its children, followed as the timer follows
    /// them), each with its own links to the probes in user code.
    followed: HashMap<u32, Vec<Link>>,
    /// Why the probes could not go into a process started since, for one hint at the end.
    follow_error: Option<String>,
    /// Counting has stopped: nothing more is attached.
    stopped: bool,
}

impl Probes {
    /// Attaches the plan's probes, each as its event index (0 is the timer), named in errors
    /// as written. Uprobes, USDT probes and allocator entry points go into the processes
    /// `pids` only (-1: every process mapping the file), so other processes calling the same
    /// library do not pay for them; kprobes and tracepoints see every task and the program's
    /// filter keeps the target's.
    pub fn attach(skel: &ProfileSkel<'_>, plan: &Plan, pids: &[i32]) -> Result<Probes, BpfError> {
        let mut links = Vec::new();
        for &pid in pids {
            attach_in_process(skel, plan, pid, &mut links)?;
        }
        attach_in_kernel(skel, plan, &mut links)?;
        Ok(Probes {
            links,
            started: pids.to_vec(),
            followed: HashMap::new(),
            follow_error: None,
            stopped: false,
        })
    }

    /// Puts the probes in user code into `pid`, a process the target started, once: a uprobe
    /// attached to one process is not inherited by its children. Called at the child's fork,
    /// and again where the program holds it at its first library load (before any of its
    /// code runs), so a child that execs at once is counted from its start.
    pub fn follow(&mut self, skel: &ProfileSkel<'_>, plan: &Plan, pid: u32) {
        let none_in_user = plan.alloc.is_none()
            && !(plan.probes.iter())
                .any(|p| matches!(p, Resolved::Uprobe { .. } | Resolved::Usdt { .. }));
        if none_in_user
            || self.stopped
            || self.started.iter().any(|&p| p == -1 || p == pid as i32)
            || self.followed.contains_key(&pid)
        {
            return;
        }
        let mut links = Vec::new();
        match attach_in_process(skel, plan, pid as i32, &mut links) {
            Ok(()) => {
                self.followed.insert(pid, links);
            }
            // A child gone already needs no probes.
            Err(_) if !stackscope_process::target::is_alive(pid) => {}
            Err(e) => {
                self.follow_error.get_or_insert(format!("pid {pid}: {e}"));
            }
        }
    }

    /// Why the probes could not go into a process the target started, once, as a hint.
    pub fn follow_hint(&mut self) -> Option<Hint> {
        let e = self.follow_error.take()?;
        Some(Hint::Said(format!(
            "the probes could not go into a process the target started ({e}): its calls are not counted"
        )))
    }

    /// A followed process exited: its probes go.
    pub fn forget(&mut self, pid: u32) {
        self.followed.remove(&pid);
    }

    /// Detaches every probe.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.links.clear();
        self.followed.clear();
    }
}

/// Each probe of the plan with its cookie (its event index: 0 is the timer's) and what makes
/// an attach error of it, named as written.
fn each_probe(
    plan: &Plan,
) -> impl Iterator<Item = (u64, &Resolved, impl Fn(libbpf_rs::Error) -> BpfError + '_)> {
    let names = &plan.names[1..];
    (plan.probes.iter().zip(names).enumerate()).map(|(i, (probe, name))| {
        let failed = move |e: libbpf_rs::Error| attach_error(name, e);
        (i as u64 + 1, probe, failed)
    })
}

/// Attaches the plan's uprobes, USDT probes and allocator entry points in process `pid` (-1:
/// every process mapping their files).
fn attach_in_process(
    skel: &ProfileSkel<'_>,
    plan: &Plan,
    pid: i32,
    links: &mut Vec<Link>,
) -> Result<(), BpfError> {
    for (cookie, probe, failed) in each_probe(plan) {
        match probe {
            Resolved::Uprobe { path, func, ret } => {
                let opts = UprobeOpts {
                    cookie,
                    retprobe: *ret,
                    func_name: Some(func.clone()),
                    ..Default::default()
                };
                let link = skel
                    .progs
                    .on_probe
                    .attach_uprobe_with_opts(pid, path, 0, opts);
                links.push(link.map_err(&failed)?);
            }
            Resolved::Usdt { path, sites } => {
                for &(offset, semaphore) in sites {
                    let opts = UprobeOpts {
                        cookie,
                        ref_ctr_offset: semaphore as usize,
                        ..Default::default()
                    };
                    let link = skel.progs.on_probe.attach_uprobe_with_opts(
                        pid,
                        path,
                        offset as usize,
                        opts,
                    );
                    links.push(link.map_err(&failed)?);
                }
            }
            Resolved::Kprobe { .. } | Resolved::Tracepoint { .. } => {}
        }
    }
    if let Some(alloc) = &plan.alloc {
        attach_alloc_sites(skel, &alloc.sites, pid, links)?;
    }
    Ok(())
}

/// Attaches the plan's kprobes and tracepoints, which see every task.
fn attach_in_kernel(
    skel: &ProfileSkel<'_>,
    plan: &Plan,
    links: &mut Vec<Link>,
) -> Result<(), BpfError> {
    for (cookie, probe, failed) in each_probe(plan) {
        match probe {
            Resolved::Kprobe { func, ret } => {
                let opts = KprobeOpts {
                    cookie,
                    ..Default::default()
                };
                let link = skel
                    .progs
                    .on_probe
                    .attach_kprobe_with_opts(*ret, func, opts);
                links.push(link.map_err(&failed)?);
            }
            Resolved::Tracepoint { category, name } => {
                let opts = TracepointOpts {
                    cookie,
                    ..Default::default()
                };
                let link = skel.progs.on_tracepoint.attach_tracepoint_with_opts(
                    TracepointCategory::Custom(category.clone()),
                    name,
                    opts,
                );
                links.push(link.map_err(&failed)?);
            }
            Resolved::Uprobe { .. } | Resolved::Usdt { .. } => {}
        }
    }
    Ok(())
}

/// Attaches the allocation programs to each allocator entry point in process `pid` (-1: every
/// process mapping its file): the entry with its kind as cookie, and the return of those that
/// allocate.
fn attach_alloc_sites(
    skel: &ProfileSkel<'_>,
    sites: &[AllocSite],
    pid: i32,
    links: &mut Vec<Link>,
) -> Result<(), BpfError> {
    for site in sites {
        let name = format!("uprobe:{}:{}", site.path.display(), site.func);
        for retprobe in [false, true] {
            let prog = match retprobe {
                false => &skel.progs.on_alloc,
                true if site.kind != AllocKind::Free => &skel.progs.on_alloc_return,
                true => continue,
            };
            let opts = UprobeOpts {
                cookie: site.kind as u64,
                retprobe,
                func_name: Some(site.func.clone()),
                ..Default::default()
            };
            // libbpf adds the offset to the function's address.
            let link = prog.attach_uprobe_with_opts(pid, &site.path, site.offset as usize, opts);
            links.push(link.map_err(|e| attach_error(&name, e))?);
        }
    }
    Ok(())
}

fn attach_error(name: &str, err: libbpf_rs::Error) -> BpfError {
    let euid = unsafe { libc::geteuid() };
    if euid != 0 && err.kind() == libbpf_rs::ErrorKind::PermissionDenied {
        return BpfError::NotPermitted { euid };
    }
    BpfError::bpf(format!("attach {name}"), err)
}
