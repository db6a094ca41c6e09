//! An address space: the modules mapped into one process or one guest, as [`Mapping`]s kept
//! sorted and never overlapping, so that the mapping of a code address is one binary search.
//! Every source keeps its targets' mappings in one: a Linux process's from `/proc/PID/maps` and
//! mmap records, a Windows process's (and the Windows kernel's) from image loads, a GDB guest's
//! from its ELF files' loadable segments. It also remembers the jitdump a JIT runtime mapped
//! into it (Node's `--perf-prof` writes one in its working directory and maps it so that
//! profilers find it), whose names outlive the mapping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::Mapping;

/// The last generation given out, by any address space.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// Mappings sorted by address, never overlapping, with a generation that changes whenever they
/// do, so that what is built from them (an unwinder, unwind tables) knows when to rebuild.
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    mappings: Vec<Mapping>,
    generation: u64,
    jitdump: Option<Arc<str>>,
}

impl AddressSpace {
    /// Adds a mapping; whatever it overlaps is unmapped first, as mmap does: an older mapping
    /// it covers goes, one it covers in part keeps the part outside it. An empty mapping maps
    /// nothing and changes nothing.
    pub fn insert(&mut self, new: Mapping) {
        if new.start >= new.end {
            return;
        }
        if new.is_jitdump() {
            self.jitdump = Some(new.path.clone());
        }
        // Starts and ends are both sorted, so the overlapped mappings are one run.
        let first = self.mappings.partition_point(|m| m.end <= new.start);
        let past = self.mappings.partition_point(|m| m.start < new.end);
        let overlapped = &self.mappings[first..past];
        let head = overlapped
            .first()
            .filter(|old| old.start < new.start)
            .map(|old| Mapping {
                end: new.start,
                ..old.clone()
            });
        let tail = overlapped
            .last()
            .filter(|old| old.end > new.end)
            .map(|old| Mapping {
                start: new.end,
                offset: old.offset + (new.end - old.start),
                ..old.clone()
            });
        let pieces = head.into_iter().chain([new]).chain(tail);
        self.mappings.splice(first..past, pieces);
        self.changed();
    }

    /// Removes the mapping that begins at `start` (a module unloaded), if there is one.
    pub fn remove(&mut self, start: u64) -> Option<Mapping> {
        let at = self
            .mappings
            .binary_search_by_key(&start, |m| m.start)
            .ok()?;
        self.changed();
        Some(self.mappings.remove(at))
    }

    /// Forgets every mapping (the process called exec).
    pub fn clear(&mut self) {
        self.mappings.clear();
        self.changed();
    }

    /// The mapping holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let past = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(past.checked_sub(1)?)?;
        m.contains(addr).then_some(m)
    }

    /// The mappings in address order.
    pub fn iter(&self) -> std::slice::Iter<'_, Mapping> {
        self.mappings.iter()
    }

    /// The path of the last jitdump (`jit-PID.dump`) mapped, even if unmapped since.
    pub fn jitdump(&self) -> Option<&Arc<str>> {
        self.jitdump.as_ref()
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }

    /// Changes on every insert, removal and clear. Generations are unique across address
    /// spaces, so equal generations mean the same mappings, even of a process whose maps were
    /// read again from scratch (0: no mapping was ever added).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) {
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
    }
}

/// The mappings inserted in order: a later one replaces what it overlaps of earlier ones.
impl FromIterator<Mapping> for AddressSpace {
    fn from_iter<I: IntoIterator<Item = Mapping>>(mappings: I) -> Self {
        let mut space = AddressSpace::default();
        for m in mappings {
            space.insert(m);
        }
        space
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, offset: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset,
            path: path.into(),
            build_id: None,
        }
    }

    fn layout(space: &AddressSpace) -> Vec<(u64, u64, u64, &str)> {
        space
            .iter()
            .map(|m| (m.start, m.end, m.offset, &*m.path))
            .collect()
    }

    #[test]
    fn mappings_are_kept_in_address_order_whatever_order_they_arrive_in() {
        let space: AddressSpace = [
            mapping(0x5000, 0x6000, 0, "/c"),
            mapping(0x1000, 0x2000, 0, "/a"),
            mapping(0x3000, 0x4000, 0, "/b"),
        ]
        .into_iter()
        .collect();
        let paths: Vec<&str> = space.iter().map(|m| &*m.path).collect();
        assert_eq!(paths, ["/a", "/b", "/c"]);
    }

    #[test]
    fn insert_splits_overlapped_mappings() {
        let mut space = AddressSpace::default();
        space.insert(mapping(0x1000, 0x5000, 0, "/a"));
        space.insert(mapping(0x2000, 0x3000, 0, "/b"));
        assert_eq!(
            layout(&space),
            [
                (0x1000, 0x2000, 0, "/a"),
                (0x2000, 0x3000, 0, "/b"),
                (0x3000, 0x5000, 0x2000, "/a")
            ]
        );
        assert_eq!(&*space.find(0x3500).unwrap().path, "/a");
        space.clear();
        assert!(space.find(0x3500).is_none());
    }

    #[test]
    fn a_mapping_over_several_replaces_those_it_covers_and_trims_those_it_straddles() {
        let mut space: AddressSpace = [
            mapping(0x1000, 0x2000, 0x10, "/a"),
            mapping(0x2000, 0x3000, 0, "/b"),
            mapping(0x3000, 0x4000, 0, "/c"),
            mapping(0x5000, 0x6000, 0, "/d"),
        ]
        .into_iter()
        .collect();
        space.insert(mapping(0x1800, 0x3800, 0, "/new"));
        assert_eq!(
            layout(&space),
            [
                (0x1000, 0x1800, 0x10, "/a"),
                (0x1800, 0x3800, 0, "/new"),
                (0x3800, 0x4000, 0x800, "/c"),
                (0x5000, 0x6000, 0, "/d")
            ]
        );
        space.insert(mapping(0x1000, 0x1800, 0, "/same place"));
        space.insert(mapping(0x0, 0x10000, 0, "/all"));
        assert_eq!(layout(&space), [(0x0, 0x10000, 0, "/all")]);
    }

    #[test]
    fn an_address_is_found_from_a_mappings_first_byte_to_its_last() {
        let space: AddressSpace = [
            mapping(0x1000, 0x2000, 0x400, "/a"),
            mapping(0x2000, 0x2800, 0, "/b"),
            mapping(0x4000, 0x5000, 0, "/c"),
        ]
        .into_iter()
        .collect();
        let path = |addr| space.find(addr).map(|m| &*m.path);
        assert_eq!(path(0xfff), None, "below the first mapping");
        assert_eq!(path(0x1000), Some("/a"));
        assert_eq!(path(0x1fff), Some("/a"));
        assert_eq!(path(0x2000), Some("/b"), "where one ends the next begins");
        assert_eq!(path(0x2800), None, "end is exclusive");
        assert_eq!(path(0x3fff), None, "in a gap");
        assert_eq!(path(0x4fff), Some("/c"));
        assert_eq!(path(u64::MAX), None, "past the last mapping");
        assert_eq!(space.find(0x1010).unwrap().file_offset(0x1010), 0x410);
        assert!(AddressSpace::default().find(0x1000).is_none());
    }

    #[test]
    fn a_mapped_jitdump_is_remembered_after_it_is_unmapped() {
        let mut space: AddressSpace = [mapping(0x1000, 0x2000, 0, "/usr/bin/node")]
            .into_iter()
            .collect();
        space.insert(mapping(0x3000, 0x4000, 0, "/srv/jit-12.dump.old"));
        space.insert(mapping(0x5000, 0x6000, 0, "/srv/not-jit-12.dump"));
        assert_eq!(space.jitdump(), None);
        space.insert(mapping(0x7000, 0x8000, 0, "/srv/app/jit-4242.dump"));
        assert!(space.remove(0x7000).is_some());
        assert_eq!(
            space.jitdump().map(|p| &**p),
            Some("/srv/app/jit-4242.dump")
        );
    }

    #[test]
    fn a_removed_mapping_leaves_its_neighbours() {
        let mut space: AddressSpace = [
            mapping(0x1000, 0x2000, 0, "/a"),
            mapping(0x4000, 0x4800, 0, "/b"),
        ]
        .into_iter()
        .collect();
        assert_eq!(space.remove(0x4000).map(|m| m.path), Some("/b".into()));
        assert!(space.find(0x4000).is_none());
        assert!(space.find(0x1000).is_some());
        assert!(space.remove(0x1800).is_none(), "no mapping begins there");
        assert!(space.remove(0x1000).is_some());
        assert!(space.is_empty());
    }

    #[test]
    fn the_generation_changes_exactly_when_the_mappings_do() {
        let mut space = AddressSpace::default();
        let mut seen = vec![space.generation()];
        let mut changed = |space: &AddressSpace| {
            let new = !seen.contains(&space.generation());
            seen.push(space.generation());
            new
        };
        space.insert(mapping(0x1000, 0x2000, 0, "/a"));
        assert!(changed(&space), "insert");
        space.insert(mapping(0x1000, 0x2000, 0, "/a again"));
        assert!(changed(&space), "insert over the same place");
        space.insert(mapping(0x3000, 0x3000, 0, "/empty"));
        assert!(!changed(&space), "an empty mapping maps nothing");
        assert!(space.remove(0x1800).is_none());
        assert!(!changed(&space), "removing what is not there");
        assert!(space.remove(0x1000).is_some());
        assert!(changed(&space), "remove");
        space.clear();
        assert!(changed(&space), "clear");
    }
}
