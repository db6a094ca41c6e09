//! The images each process maps, from image loads during the session and the rundown of
//! those loaded before it, and the kernel's modules (drivers), placed where the middle takes
//! them: a PE image as a [`Mapping`] at its base with file offset 0, so that a frame's offset
//! in it is the address's RVA, which the symbolizer names PE files by.

use std::collections::HashMap;
use std::sync::Arc;

use stackscope_stacks::Mapping;

use crate::event::{is_kernel, Image};

/// The mapped images of every process, and the kernel's.
#[derive(Debug, Default)]
pub struct Images {
    by_process: HashMap<u32, Vec<Mapping>>,
    kernel: Vec<Mapping>,
}

impl Images {
    /// Adds an image, at `path` (already turned into a path the symbolizer opens).
    pub fn load(&mut self, image: &Image, path: &str) {
        let mapping = Mapping {
            start: image.base,
            end: image.base.saturating_add(image.size),
            offset: 0,
            path: Arc::from(path),
            build_id: None,
        };
        let list = self.list_mut(image);
        list.retain(|m| m.start != mapping.start);
        let at = list.partition_point(|m| m.start < mapping.start);
        list.insert(at, mapping);
    }

    pub fn unload(&mut self, image: &Image) {
        let list = self.list_mut(image);
        list.retain(|m| m.start != image.base);
    }

    /// A process ended: its images go with it (its pid may be reused).
    pub fn process_ended(&mut self, pid: u32) {
        self.by_process.remove(&pid);
    }

    /// The image holding `addr` in process `pid`, or the kernel module holding it.
    pub fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let list = if is_kernel(addr) {
            &self.kernel
        } else {
            self.by_process.get(&pid)?
        };
        let at = list.partition_point(|m| m.start <= addr);
        list[..at].last().filter(|m| m.contains(addr))
    }

    fn list_mut(&mut self, image: &Image) -> &mut Vec<Mapping> {
        if is_kernel(image.base) {
            &mut self.kernel
        } else {
            self.by_process.entry(image.pid).or_default()
        }
    }
}
