//! Event payloads laid out byte by byte as a 64-bit Windows kernel logs them, for the tests.

use crate::event::{opcode, provider, Header};

#[derive(Default)]
pub(crate) struct Payload(Vec<u8>);

impl Payload {
    pub(crate) fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }

    pub(crate) fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn utf16(mut self, s: &str) -> Self {
        for unit in s.encode_utf16().chain([0]) {
            self = self.u16(unit);
        }
        self
    }

    pub(crate) fn ansi(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.u8(0)
    }

    /// A TOKEN_USER (two pointers) and the SID S-1-5-21-a-b-c-rid.
    pub(crate) fn sid(self, rid: u32) -> Self {
        let mut p = self.u64(0xffff_a000_1234_5678).u64(0).u8(1).u8(5);
        for b in [0, 0, 0, 0, 0, 5] {
            p = p.u8(b);
        }
        p.u32(21).u32(1111).u32(2222).u32(3333).u32(rid)
    }

    pub(crate) fn bytes(self) -> Vec<u8> {
        self.0
    }
}

pub(crate) fn header(provider: u128, opcode: u8, version: u8, timestamp: u64) -> Header {
    Header {
        provider,
        opcode,
        version,
        timestamp,
        // Kernel events log -1 (or the logging thread) here; the payloads say whose they are.
        pid: u32::MAX,
        tid: u32::MAX,
        cpu: 1,
        pointer_size: 8,
    }
}

/// PerfInfo SampledProfile: InstructionPointer, ThreadId, Count.
pub(crate) fn sampled_profile(timestamp: u64, tid: u32, ip: u64) -> (Header, Vec<u8>) {
    let bytes = Payload::default().u64(ip).u32(tid).u32(1).bytes();
    (
        header(provider::PERF_INFO, opcode::SAMPLED_PROFILE, 2, timestamp),
        bytes,
    )
}

/// StackWalk Stack: EventTimeStamp, StackProcess, StackThread, frames.
pub(crate) fn stack_walk(
    logged_at: u64,
    timestamp: u64,
    pid: u32,
    tid: u32,
    frames: &[u64],
) -> (Header, Vec<u8>) {
    let mut p = Payload::default().u64(timestamp).u32(pid).u32(tid);
    for &f in frames {
        p = p.u64(f);
    }
    (
        header(provider::STACK_WALK, opcode::STACK, 2, logged_at),
        p.bytes(),
    )
}

/// Image_Load (version 3), for a load, unload or rundown opcode.
pub(crate) fn image(op: u8, pid: u32, base: u64, size: u64, path: &str) -> (Header, Vec<u8>) {
    let bytes = Payload::default()
        .u64(base)
        .u64(size)
        .u32(pid)
        .u32(0x0004_5e1d) // checksum
        .u32(0x6512_3456) // link time
        .u32(0)
        .u64(0x1_4000_0000) // preferred base
        .u32(0)
        .u32(0)
        .u32(0)
        .u32(0)
        .utf16(path)
        .bytes();
    (header(provider::IMAGE, op, 3, 0), bytes)
}

/// Process_TypeGroup1 (version 4), with a user SID when `rid` is given.
pub(crate) fn process(
    op: u8,
    pid: u32,
    parent: u32,
    exit_status: i32,
    name: &str,
    rid: Option<u32>,
) -> (Header, Vec<u8>) {
    let p = Payload::default()
        .u64(0xffff_c001_0000_0080) // process object
        .u32(pid)
        .u32(parent)
        .u32(1) // session
        .u32(exit_status as u32)
        .u64(0x1ad000) // page table
        .u32(0); // flags
    let p = match rid {
        Some(rid) => p.sid(rid),
        None => p.u32(0),
    };
    let bytes = p
        .ansi(name)
        .utf16(&format!("{name} --flag"))
        .utf16("")
        .utf16("")
        .bytes();
    (header(provider::PROCESS, op, 4, 0), bytes)
}

/// Thread_TypeGroup1 (version 3).
pub(crate) fn thread(op: u8, pid: u32, tid: u32) -> (Header, Vec<u8>) {
    let mut p = Payload::default().u32(pid).u32(tid);
    for v in [
        0xffff_d000_0001_0000u64,
        0xffff_d000_0000_a000,
        0x7000_0000,
        0x6ff0_0000,
        3,
    ] {
        p = p.u64(v);
    }
    let bytes = p
        .u64(0x7ff7_0000_1000) // start address
        .u64(0x7000_1000) // TEB
        .u32(0)
        .u8(8)
        .u8(5)
        .u8(2)
        .u8(0)
        .bytes();
    (header(provider::THREAD, op, 3, 0), bytes)
}
