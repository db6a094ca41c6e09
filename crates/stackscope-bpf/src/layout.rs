//! The records the BPF program shares with user space (src/bpf/profile.h), decoded from the
//! bytes the maps and the ring buffer hand out.

use stackscope_stacks::walk::WalkEnd;

/// `-EFAULT` as a stack id: no stack of that kind in the sample (not a failure).
pub(crate) const NO_STACK: i64 = -(libc::EFAULT as i64);
/// `-EEXIST` from bpf_get_stackid: a different stack already holds the hash bucket (the
/// kernel's stack map keeps one stack per bucket and, without `BPF_F_REUSE_STACKID`, does not
/// replace it).
pub(crate) const STACK_COLLISION: i64 = -(libc::EEXIST as i64);
/// `-ENOMEM` from bpf_get_stackid: every entry of the kernel's stack map is taken.
pub(crate) const KERNEL_STACKS_FULL: i64 = -(libc::ENOMEM as i64);
/// `-E2BIG` from the user-stack map: full.
pub(crate) const STACK_STORAGE_FULL: i64 = -(libc::E2BIG as i64);

pub(crate) const DROP_COUNT_MAP_FULL: u32 = 0;
pub(crate) const DROP_USER_STACK_FULL: u32 = 1;
pub(crate) const DROP_LIVE_FULL: u32 = 2;
pub(crate) const DROP_LIVE_FULL_BYTES: u32 = 3;

/// Frames of a kernel stack, and of a user stack in `user_stacks`.
pub(crate) const MAX_STACK_FRAMES: usize = 127;
/// `DEEP_STACK_ID`: set in the ids of user stacks kept in `deep_stacks`.
pub(crate) const DEEP_STACK_ID: i64 = 1 << 62;

/// The bytes of a stored user stack of `frames` frames: `len`, `end`, then the addresses.
pub(crate) fn user_stack_size(frames: usize) -> usize {
    8 + frames * 8
}

/// `enum user_end`, as the walk's end: where it stopped is named once the frames are placed
/// in their files ([`WalkEnd::in_module`]).
fn walk_end(user_end: u32) -> WalkEnd {
    match user_end {
        // USER_END_COMPLETE: the program ends a walk at a zero return address or frame
        // pointer as it does where the tables mark the end.
        0 => WalkEnd::Unconfirmed { module: None },
        // USER_END_TRUNCATED: its frame limit was reached.
        1 => WalkEnd::Truncated,
        // USER_END_BROKEN: no rule for a pc, or an unreadable stack word; it does not say which.
        2 => WalkEnd::Stopped {
            module: None,
            why: None,
        },
        // USER_END_FRAME_POINTER: the kernel's walk, before the process had tables.
        _ => WalkEnd::FramePointerChain,
    }
}

/// `struct count_key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CountKey {
    pub pid: u32,
    pub tid: u32,
    pub user_stack_id: i64,
    pub kernel_stack_id: i32,
    /// Which event counted the stack: 0 (`EVENT_INDEX_TIMER`) for the cpu-clock samples, else
    /// the loader's index of a probe.
    pub event: u32,
    pub comm: String,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl CountKey {
    pub fn from_bytes(b: &[u8]) -> Option<CountKey> {
        let comm = b.get(24..40)?;
        let len = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
        Some(CountKey {
            pid: u32_at(b, 0)?,
            tid: u32_at(b, 4)?,
            user_stack_id: u64_at(b, 8)? as i64,
            kernel_stack_id: u32_at(b, 16)? as i32,
            event: u32_at(b, 20)?,
            comm: String::from_utf8_lossy(&comm[..len]).into_owned(),
        })
    }
}

/// `struct user_stack` (the prefix a map keeps): addresses leaf first.
#[derive(Debug, Clone)]
pub(crate) struct UserStack {
    pub ips: Vec<u64>,
    pub end: WalkEnd,
}

impl UserStack {
    pub fn from_bytes(b: &[u8]) -> Option<UserStack> {
        let held = b.len().checked_sub(8)? / 8;
        let len = (u32_at(b, 0)? as usize).min(held);
        Some(UserStack {
            ips: words(&b[8..8 + len * 8]).collect(),
            end: walk_end(u32_at(b, 4)?),
        })
    }
}

/// `enum event_kind` with its `struct event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    NoTables { pid: u32 },
    Fork { pid: u32, parent: u32 },
    Exec { pid: u32 },
    Loaded { pid: u32, held: bool },
    Exit { pid: u32 },
}

impl Event {
    pub fn from_bytes(b: &[u8]) -> Option<Event> {
        let pid = u32_at(b, 4)?;
        Some(match u32_at(b, 0)? {
            1 => Event::NoTables { pid },
            2 => Event::Fork {
                pid,
                parent: u32_at(b, 8)?,
            },
            3 => Event::Exec { pid },
            4 => Event::Loaded {
                pid,
                held: u32_at(b, 12)? != 0,
            },
            5 => Event::Exit { pid },
            _ => return None,
        })
    }
}

/// The native-endian u64 words of a byte slice.
pub(crate) fn words(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8-byte chunk")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_count_keys_and_user_stacks() {
        let mut key = Vec::new();
        key.extend(7u32.to_ne_bytes());
        key.extend(8u32.to_ne_bytes());
        key.extend((-14i64).to_ne_bytes());
        key.extend(3i32.to_ne_bytes());
        key.extend(2u32.to_ne_bytes());
        key.extend(b"prog\0\0\0\0\0\0\0\0\0\0\0\0");
        let k = CountKey::from_bytes(&key).unwrap();
        assert_eq!(
            (k.pid, k.tid, k.user_stack_id, k.kernel_stack_id),
            (7, 8, NO_STACK, 3)
        );
        assert_eq!(k.event, 2);
        assert_eq!(k.comm, "prog");

        let mut stack = vec![0u8; user_stack_size(MAX_STACK_FRAMES)];
        stack[..4].copy_from_slice(&2u32.to_ne_bytes());
        stack[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        stack[16..24].copy_from_slice(&0x2000u64.to_ne_bytes());
        let s = UserStack::from_bytes(&stack).unwrap();
        assert_eq!(s.ips, [0x1000, 0x2000]);
        assert_eq!(s.end, WalkEnd::Unconfirmed { module: None });
        // A length beyond what the value holds reads what it holds.
        stack[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(
            UserStack::from_bytes(&stack).unwrap().ips.len(),
            MAX_STACK_FRAMES
        );
        assert!(UserStack::from_bytes(&stack[..4]).is_none());
    }
}
