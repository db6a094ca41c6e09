//! What was running before sampling began: thread names and mappings of the target's
//! processes read from `/proc`, handed out as events before any ring record.

use super::{Kind, Sampler};
use stackscope_process::maps::{read_proc_maps, Mapping};
use stackscope_process::target;

/// Pre-existing state read from `/proc`, delivered before any ring record.
pub(super) enum Synthetic {
    Comm { pid: u32, tid: u32, comm: String },
    Mmap { pid: u32, mapping: Mapping },
}

impl Sampler {
    /// Reads what the target runs now; delivered by the next `poll`.
    pub(super) fn synthesize(&mut self) {
        let processes: Vec<(u32, Vec<u32>)> = match self.kind {
            Kind::Command => Vec::new(),
            Kind::Pids => self
                .watched
                .iter()
                .map(|&pid| (pid, target::threads_of(pid).unwrap_or_default()))
                .collect(),
            Kind::Tids => {
                let mut by_pid: Vec<(u32, Vec<u32>)> = Vec::new();
                for &tid in &self.watched {
                    let Ok(pid) = target::process_of(tid) else {
                        continue;
                    };
                    match by_pid.iter_mut().find(|(p, _)| *p == pid) {
                        Some((_, tids)) => tids.push(tid),
                        None => by_pid.push((pid, vec![tid])),
                    }
                }
                by_pid
            }
            Kind::System => target::all_pids()
                .unwrap_or_default()
                .into_iter()
                .map(|pid| (pid, target::threads_of(pid).unwrap_or_default()))
                .collect(),
        };
        for (pid, tids) in processes {
            for tid in tids {
                if let Some(comm) = target::thread_comm(pid, tid) {
                    self.synthetic.push(Synthetic::Comm { pid, tid, comm });
                }
            }
            // Unreadable maps (a process that just exited, or kernel threads) simply add nothing.
            if let Ok(maps) = read_proc_maps(pid) {
                for mapping in maps.iter() {
                    self.synthetic.push(Synthetic::Mmap {
                        pid,
                        mapping: mapping.clone(),
                    });
                }
            }
        }
    }
}
