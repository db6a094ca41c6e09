//! The images each process maps, from image loads during the session and the rundown of
//! those loaded before it, and the kernel's modules (drivers), kept as one [`AddressSpace`] per
//! process and one for the kernel: a PE image as a [`Mapping`] at its base with file offset 0, so that a
//! frame's offset in it is the address's RVA, which the symbolizer names PE files by.

use std::collections::HashMap;
use std::sync::Arc;

use stackscope_stacks::{AddressSpace, Mapping};

use crate::event::{is_kernel, Image};

/// The address space of every process, and the kernel's.
#[derive(Debug, Default)]
pub struct Images {
    by_process: HashMap<u32, AddressSpace>,
    kernel: AddressSpace,
}

impl Images {
    /// Adds an image, at `path` (already turned into a path the symbolizer opens). Images do
    /// not overlap in one address space, so one loaded over another means the other's unload
    /// was missed: the new one takes its place.
    pub fn load(&mut self, image: &Image, path: &str) {
        self.space_mut(image).insert(Mapping {
            start: image.base,
            end: image.base.saturating_add(image.size),
            offset: 0,
            path: Arc::from(path),
            build_id: None,
        });
    }

    pub fn unload(&mut self, image: &Image) {
        self.space_mut(image).remove(image.base);
    }

    /// A process ended: its images go with it (its pid may be reused).
    pub fn process_ended(&mut self, pid: u32) {
        self.by_process.remove(&pid);
    }

    /// The image holding `addr` in process `pid`, or the kernel module holding it.
    pub fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let space = if is_kernel(addr) {
            &self.kernel
        } else {
            self.by_process.get(&pid)?
        };
        space.find(addr)
    }

    fn space_mut(&mut self, image: &Image) -> &mut AddressSpace {
        if is_kernel(image.base) {
            &mut self.kernel
        } else {
            self.by_process.entry(image.pid).or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(pid: u32, base: u64, size: u64) -> Image {
        Image {
            pid,
            base,
            size,
            path: String::new(),
        }
    }

    #[test]
    fn an_address_is_found_in_its_process_image_or_the_kernels_module() {
        let mut images = Images::default();
        images.load(&image(7, 0x1000, 0x1000), r"C:\a.exe");
        images.load(&image(7, 0x4000, 0x800), r"C:\b.dll");
        images.load(&image(0, 0xffff_f800_0000_0000, 0x10_0000), r"C:\nt.exe");
        let path = |pid, addr| images.find(pid, addr).map(|m| &*m.path);
        assert_eq!(path(7, 0x1000), Some(r"C:\a.exe"));
        assert_eq!(path(7, 0x1fff), Some(r"C:\a.exe"));
        assert_eq!(path(7, 0x2000), None, "one past the image");
        assert_eq!(path(7, 0x47ff), Some(r"C:\b.dll"));
        assert_eq!(path(8, 0x1000), None, "another process maps nothing there");
        assert_eq!(path(8, 0xffff_f800_0000_1234), Some(r"C:\nt.exe"));
    }

    #[test]
    fn unloaded_images_and_ended_processes_are_forgotten() {
        let mut images = Images::default();
        images.load(&image(7, 0x1000, 0x1000), r"C:\a.exe");
        images.load(&image(7, 0x4000, 0x800), r"C:\b.dll");
        images.unload(&image(7, 0x4000, 0x800));
        assert!(images.find(7, 0x4000).is_none());
        assert!(images.find(7, 0x1000).is_some());
        images.process_ended(7);
        assert!(images.find(7, 0x1000).is_none());
    }
}
