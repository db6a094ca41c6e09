//! Free index ranges of the walker's arrays: first fit, merged when freed.

use std::ops::Range;

/// Free index ranges of an array, first fit, merged when freed.
#[derive(Debug)]
pub(super) struct FreeRanges {
    /// Sorted, disjoint, never adjacent.
    free: Vec<Range<u32>>,
}

impl FreeRanges {
    pub(super) fn new(len: u32) -> Self {
        let mut free = Vec::new();
        if len > 0 {
            free.push(0..len);
        }
        FreeRanges { free }
    }

    pub(super) fn alloc(&mut self, count: u32) -> Option<Range<u32>> {
        if count == 0 {
            return Some(0..0);
        }
        let i = self.free.iter().position(|r| r.end - r.start >= count)?;
        let r = &mut self.free[i];
        let out = r.start..r.start + count;
        r.start += count;
        if r.start == r.end {
            self.free.remove(i);
        }
        Some(out)
    }

    pub(super) fn free(&mut self, range: Range<u32>) {
        if range.start >= range.end {
            return;
        }
        let i = self.free.partition_point(|r| r.start < range.start);
        self.free.insert(i, range);
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].end == self.free[i + 1].start {
            self.free[i].end = self.free[i + 1].end;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].end == self.free[i].start {
            self.free[i - 1].end = self.free[i].end;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ranges_reuse_and_merge() {
        let mut f = FreeRanges::new(10);
        let a = f.alloc(4).unwrap();
        let b = f.alloc(4).unwrap();
        assert_eq!((a.clone(), b.clone()), (0..4, 4..8));
        assert!(f.alloc(3).is_none(), "only 2 left");
        f.free(a);
        assert_eq!(f.alloc(3), Some(0..3));
        f.free(0..3);
        f.free(b);
        assert_eq!(f.free, vec![0..10]);
        // Nothing to place takes nothing, even from a full array.
        assert_eq!(f.alloc(10), Some(0..10));
        assert_eq!(f.alloc(0), Some(0..0));
        f.free(0..0);
        f.free(0..10);
        assert_eq!(f.free, vec![0..10]);
    }
}
