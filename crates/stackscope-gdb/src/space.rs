//! The code the target runs: its ELF file and, for a Linux program under gdbserver, the shared
//! libraries the stub lists (`qXfer:libraries-svr4:read`), each at its load address, with one
//! unwinder over all of them, for the main file's architecture, and their loadable segments as
//! the target's [`AddressSpace`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::arch::Unwinder;
use crate::client::MAX_LIBRARIES;
use crate::image::Image;
use stackscope_stacks::{AddressSpace, Mapping};

/// The target's files, the main one first.
pub struct Space {
    images: Vec<Image>,
    unwinder: Unwinder,
    /// The images' loadable segments.
    mappings: AddressSpace,
}

impl Space {
    pub fn new(main: Image) -> Space {
        let mut space = Space {
            unwinder: Unwinder::of(main.arch(), &[]),
            images: vec![main],
            mappings: AddressSpace::default(),
        };
        space.rebuild();
        space
    }

    /// The file given on the command line.
    pub fn main(&self) -> &Image {
        &self.images[0]
    }

    pub fn images(&self) -> &[Image] {
        &self.images
    }

    /// The file whose segments hold `addr`.
    pub fn image_of(&self, addr: u64) -> Option<&Image> {
        self.images
            .iter()
            .find(|image| image.address_range().contains(&addr))
    }

    /// The loadable segment that holds `addr`, for the stack table.
    pub fn mapping_of(&self, addr: u64) -> Option<&Mapping> {
        self.mappings.find(addr)
    }

    /// True when `addr` lies in a function of a file whose CFI does not describe it.
    pub fn lacks_cfi(&self, addr: u64) -> bool {
        self.image_of(addr)
            .is_some_and(|image| image.lacks_cfi(addr))
    }

    pub fn unwinder(&self) -> &Unwinder {
        &self.unwinder
    }

    /// Adds the libraries of `list` (path, load bias) not known yet; files that cannot be read
    /// (the vDSO, a path of another machine) are skipped, and so is a file the list names again
    /// at other addresses (a stale entry, or a stub listing one file thousands of times: each
    /// image holds the file's unwind tables). A later list may place a file again elsewhere (a
    /// library unloaded and loaded again), up to [`MAX_LIBRARIES`] files held in all. Stops
    /// adding when `stopped()` says so (Ctrl-C). True when any was added.
    pub fn add_libraries(&mut self, list: &[(PathBuf, u64)], stopped: impl Fn() -> bool) -> bool {
        let mut added = false;
        let mut listed = HashSet::new();
        for (path, bias) in list {
            if stopped() || self.images.len() > MAX_LIBRARIES {
                break;
            }
            if !listed.insert(path) || self.has(path, *bias) {
                continue;
            }
            let Ok(mut image) = Image::open(path) else {
                continue;
            };
            if image.arch() != self.main().arch() {
                continue;
            }
            image.set_bias(*bias);
            // A second file over the same addresses would be a stale entry; the first wins
            // (unlike mmap, where the newer mapping replaces the older: the stub's list is
            // not an order of events).
            let range = image.address_range();
            if self.images.iter().any(|i| {
                let r = i.address_range();
                r.start < range.end && range.start < r.end
            }) {
                continue;
            }
            self.images.push(image);
            added = true;
        }
        if added {
            self.rebuild();
        }
        added
    }

    fn has(&self, path: &Path, bias: u64) -> bool {
        self.images
            .iter()
            .any(|i| i.path() == path && i.bias() == bias)
    }

    fn rebuild(&mut self) {
        self.unwinder = Unwinder::of(self.main().arch(), &self.images);
        self.mappings = self.images.iter().flat_map(Image::mappings).collect();
    }
}
