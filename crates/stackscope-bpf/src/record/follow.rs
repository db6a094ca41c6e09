//! Following the sampled processes while the program counts: their forks, execs, library
//! loads and exits from the event ring, code mapped without an event, the target's end, and a
//! live view's drains every refresh.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use libbpf_rs::RingBuffer;
use stackscope_process::target::{self, HeldChild, Target};

use super::live::LiveDrain;
use super::{BpfConfig, MAPS_INTERVAL, POLL_INTERVAL};
use crate::layout::Event;
use crate::probe::{Plan, Probes};
use crate::processes::Processes;
use crate::program::ProfileSkel;

/// Follows the processes' events until the duration ends, the target exits or `stop` is set,
/// draining the counts for `live` when given; true when `stop` ended it.
pub(super) fn sample_until_end(
    (config, stop): (&BpfConfig, &AtomicBool),
    (ring, events): (&RingBuffer<'_>, &RefCell<Vec<Event>>),
    counting: &mut Counting<'_, '_>,
    mut child: Option<&mut HeldChild>,
    mut live: Option<&mut LiveDrain>,
) -> bool {
    let started = Instant::now();
    let mut maps_read = Instant::now();
    loop {
        // An error here is EINTR from a signal (Ctrl-C): the stop flag below tells.
        let _ = ring.poll(POLL_INTERVAL);
        handle_events(&mut events.borrow_mut(), counting, config.user);
        if maps_read.elapsed() >= MAPS_INTERVAL {
            counting.processes.note_new_mappings();
            maps_read = Instant::now();
        }
        if let Some(live) = live.as_deref_mut() {
            let (skel, plan) = (counting.skel, counting.plan);
            live.when_due(skel, config, counting.processes, plan);
        }
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        if config.duration.is_some_and(|d| started.elapsed() >= d) {
            return false;
        }
        if target_finished(&config.target, child.as_deref_mut()) {
            return false;
        }
    }
}

/// What the program told: the processes followed start, exec, load libraries and exit; each
/// one's tables and probes follow, and a held one is let go once they are in.
pub(super) fn handle_events(events: &mut Vec<Event>, counting: &mut Counting<'_, '_>, user: bool) {
    let Counting {
        skel,
        plan,
        processes,
        probes,
    } = counting;
    let (skel, plan) = (*skel, *plan);
    for event in events.drain(..) {
        match event {
            Event::Loaded { pid, held: true } => {
                processes.note_held(pid);
                probes.follow(skel, plan, pid);
                processes.release_held(skel, pid);
            }
            // A sample taken as a process exits finds its tables gone: it needs none.
            Event::NoTables { pid } | Event::Loaded { pid, .. } if processes.has_exited(pid) => {}
            Event::Fork { pid, .. } => {
                processes.note_started(pid);
                probes.follow(skel, plan, pid);
                if user {
                    processes.load(skel, pid);
                }
            }
            Event::NoTables { pid } | Event::Exec { pid } | Event::Loaded { pid, .. } => {
                if user {
                    processes.load(skel, pid);
                }
            }
            Event::Exit { pid } => {
                processes.forget(skel, pid);
                probes.forget(pid);
            }
        }
    }
}

/// What handling the program's events changes: the processes' tables and the probes.
pub(super) struct Counting<'a, 's> {
    pub skel: &'a ProfileSkel<'s>,
    pub plan: &'a Plan,
    pub processes: &'a mut Processes,
    pub probes: &'a mut Probes,
}

fn target_finished(target: &Target, child: Option<&mut HeldChild>) -> bool {
    match (target, child) {
        (Target::Command(_), Some(child)) => child.wait(false),
        (Target::Pids(ids), _) | (Target::Tids(ids), _) => {
            !ids.iter().any(|&id| target::is_alive(id))
        }
        _ => false,
    }
}
