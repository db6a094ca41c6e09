//! Attaching the counting program to the resolved probes. Each attachment carries its
//! event's index (the count key's `event`) as its attach cookie.

use libbpf_rs::{KprobeOpts, Link, TracepointCategory, TracepointOpts, UprobeOpts};

use super::alloc::{AllocKind, AllocSite};
use super::{Plan, Resolved};
use crate::error::BpfError;
use crate::program::ProfileSkel;

/// The program's links to the probes; dropping a link detaches it.
pub(crate) struct Probes {
    links: Vec<Link>,
}

impl Probes {
    /// Attaches the plan's probes, each as its event index (0 is the timer), named in errors
    /// as written. Uprobes and USDT probes go into the processes `pids` only (-1: every process
    /// mapping the file), so other processes calling the same library do not pay for them;
    /// kprobes and tracepoints see every task and the program's filter keeps the target's.
    pub fn attach(skel: &ProfileSkel<'_>, plan: &Plan, pids: &[i32]) -> Result<Probes, BpfError> {
        let mut links = Vec::new();
        // names[0] is the timer's.
        for (i, (probe, name)) in plan.probes.iter().zip(&plan.names[1..]).enumerate() {
            let cookie = i as u64 + 1;
            let failed = |e: libbpf_rs::Error| attach_error(name, e);
            match probe {
                Resolved::Uprobe { path, func, ret } => {
                    for &pid in pids {
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
                        links.push(link.map_err(failed)?);
                    }
                }
                Resolved::Usdt { path, sites } => {
                    for &pid in pids {
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
                            links.push(link.map_err(failed)?);
                        }
                    }
                }
                Resolved::Kprobe { func, ret } => {
                    let opts = KprobeOpts {
                        cookie,
                        ..Default::default()
                    };
                    let link = skel
                        .progs
                        .on_probe
                        .attach_kprobe_with_opts(*ret, func, opts);
                    links.push(link.map_err(failed)?);
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
                    links.push(link.map_err(failed)?);
                }
            }
        }
        if let Some(alloc) = &plan.alloc {
            attach_alloc_sites(skel, &alloc.sites, pids, &mut links)?;
        }
        Ok(Probes { links })
    }

    /// Detaches every probe.
    pub fn stop(&mut self) {
        self.links.clear();
    }
}

/// Attaches the allocation programs to each allocator entry point in each of `pids` (-1: every
/// process mapping its file): the entry with its kind as cookie, and the return of those that
/// allocate.
fn attach_alloc_sites(
    skel: &ProfileSkel<'_>,
    sites: &[AllocSite],
    pids: &[i32],
    links: &mut Vec<Link>,
) -> Result<(), BpfError> {
    for site in sites {
        let name = format!("uprobe:{}:{}", site.path.display(), site.func);
        for &pid in pids {
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
                let link =
                    prog.attach_uprobe_with_opts(pid, &site.path, site.offset as usize, opts);
                links.push(link.map_err(|e| attach_error(&name, e))?);
            }
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
