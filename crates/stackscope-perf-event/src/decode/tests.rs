use super::*;
use crate::perf::{record_at, EventRequest};
use linux_perf_data::linux_perf_event_reader::{RecordParseInfo, RecordType};
use stackscope_stacks::arch::Arch;

/// What the sampler asks for in DWARF mode: callchains, user registers and a stack copy.
fn dwarf_layout() -> RecordParseInfo {
    EventRequest {
        rate: stackscope_process::cpu_clock::Rate::Frequency(99),
        inherit: true,
        enable_on_exec: false,
        kernel_callchain: true,
        user_callchain: false,
        user_regs: Some(Arch::X86_64),
        stack_bytes: 64,
        exclude_kernel: false,
        build_id: true,
        wakeup_bytes: 1,
    }
    .record_layout()
    .expect("our own attr reads back")
}

/// A record as the kernel lays it out: header, body, and for other records than samples the
/// `sample_id_all` trailer (pid/tid, time, cpu).
fn record(kind: u32, misc: u16, body: &[u8], trailer: Option<(u32, u32, u64)>) -> Vec<u8> {
    let mut out = Vec::new();
    let size = 8 + body.len() + if trailer.is_some() { 24 } else { 0 };
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&misc.to_ne_bytes());
    out.extend_from_slice(&(size as u16).to_ne_bytes());
    out.extend_from_slice(body);
    if let Some((pid, tid, time)) = trailer {
        out.extend_from_slice(&pid.to_ne_bytes());
        out.extend_from_slice(&tid.to_ne_bytes());
        out.extend_from_slice(&time.to_ne_bytes());
        out.extend_from_slice(&[0; 8]);
    }
    out
}

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn pid_tid(pid: u32, tid: u32) -> [u8; 8] {
    let mut out = [0; 8];
    out[..4].copy_from_slice(&pid.to_ne_bytes());
    out[4..].copy_from_slice(&tid.to_ne_bytes());
    out
}

/// A name padded with NULs to whole words, as the kernel pads strings in records.
fn padded(name: &[u8]) -> Vec<u8> {
    let mut out = name.to_vec();
    out.resize((name.len() + 1).div_ceil(8) * 8, 0);
    out
}

fn comm_record(pid: u32, tid: u32, name: &[u8], time: u64) -> Vec<u8> {
    let mut body = pid_tid(pid, tid).to_vec();
    body.extend(padded(name));
    let exec = b::PERF_RECORD_MISC_COMM_EXEC as u16;
    record(b::PERF_RECORD_COMM, exec, &body, Some((pid, tid, time)))
}

fn mmap2_record(prot: u32, build_id: Option<&[u8]>, path: &[u8]) -> Vec<u8> {
    let mut body = pid_tid(7, 8).to_vec();
    body.extend(words(&[0x40_0000, 0x2000, 0x1000]));
    let mut misc = b::PERF_RECORD_MISC_USER as u16;
    let mut ids = [0u8; 24];
    if let Some(id) = build_id {
        misc |= b::PERF_RECORD_MISC_MMAP_BUILD_ID as u16;
        ids[0] = id.len() as u8;
        let n = id.len().min(20);
        ids[4..4 + n].copy_from_slice(&id[..n]);
    }
    body.extend_from_slice(&ids);
    body.extend_from_slice(&prot.to_ne_bytes());
    body.extend_from_slice(&2u32.to_ne_bytes());
    body.extend(padded(path));
    record(b::PERF_RECORD_MMAP2, misc, &body, Some((7, 8, 5)))
}

/// The one event of a lone record, decoded as the live rings decode it.
fn decode_one(copy: &[u8], with: impl FnOnce(Option<Event<'_>>)) {
    let (raw, size) = record_at(copy, 0, dwarf_layout()).expect("a whole record");
    assert_eq!(size, copy.len());
    let parsed = parse(&raw).expect("decodes");
    let mut decoder = Decoder::new(Some(Arch::X86_64));
    with(decoder.event(&parsed));
}

#[test]
fn callchain_split_drops_markers() {
    let k = b::PERF_CONTEXT_KERNEL;
    let u = b::PERF_CONTEXT_USER;
    let chain = [
        k,
        0xffff_ffff_8100_0000,
        0xffff_ffff_8100_0010,
        u,
        0x401000,
        0x401100,
    ];
    let (kernel, user) = split_callchain(&chain);
    assert_eq!(kernel, &[0xffff_ffff_8100_0000, 0xffff_ffff_8100_0010]);
    assert_eq!(user, &[0x401000, 0x401100]);
    let only_user = [u, 0x401000];
    let (kernel, user) = split_callchain(&only_user);
    assert!(kernel.is_empty());
    assert_eq!(user, &[0x401000]);
    assert_eq!(split_callchain(&[]), (&[][..], &[][..]));
}

#[test]
fn parses_comm_record_and_its_trailer_time() {
    let copy = comm_record(42, 43, b"busy-loop", 123_456);
    let (raw, _) = record_at(&copy, 0, dwarf_layout()).unwrap();
    assert_eq!(raw.timestamp(), Some(123_456));
    decode_one(&copy, |event| match event {
        Some(Event::Comm {
            pid,
            tid,
            comm,
            exec,
        }) => assert_eq!((pid, tid, comm, exec), (42, 43, "busy-loop", true)),
        other => panic!("not a comm record: {other:?}"),
    });
}

#[test]
fn a_thread_name_cut_mid_character_keeps_its_whole_characters() {
    // The kernel cuts names at 15 bytes, here inside the two-byte "é".
    let copy = comm_record(1, 1, b"caf\xc3", 5);
    decode_one(&copy, |event| match event {
        Some(Event::Comm { comm, .. }) => assert_eq!(comm, "caf"),
        other => panic!("not a comm record: {other:?}"),
    });
}

#[test]
fn a_record_cut_short_is_not_framed_and_one_too_short_for_its_fields_is_refused() {
    let copy = comm_record(1, 1, b"x", 5);
    assert!(record_at(&copy[..copy.len() - 8], 0, dwarf_layout()).is_none());
    let fork = record(b::PERF_RECORD_FORK, 0, &pid_tid(1, 1), None);
    let (raw, _) = record_at(&fork, 0, dwarf_layout()).unwrap();
    assert!(parse(&raw).is_err());
    // A header claiming less than itself frames nothing.
    let mut tiny = fork.clone();
    tiny[6..8].copy_from_slice(&4u16.to_ne_bytes());
    assert!(record_at(&tiny, 0, dwarf_layout()).is_none());
}

#[test]
fn a_sample_gives_its_kernel_stack_registers_and_stack_copy_without_copying_the_stack() {
    let mut body = words(&[0x40_1234]); // ip
    body.extend(pid_tid(10, 11));
    body.extend(words(&[777, 0, 1_000_000])); // time, cpu 0, period
    let chain = [b::PERF_CONTEXT_KERNEL, 0xffff_ffff_8100_0000];
    body.extend(words(&[chain.len() as u64]));
    body.extend(words(&chain));
    // Registers in mask order: frame pointer, stack pointer, instruction pointer.
    body.extend(words(&[
        b::PERF_SAMPLE_REGS_ABI_64 as u64,
        0x7ff0,
        0x7fe0,
        0x40_1234,
    ]));
    let stack: Vec<u8> = (0..64).collect();
    body.extend(words(&[64]));
    body.extend_from_slice(&stack);
    body.extend(words(&[40])); // dyn_size: the part of the copy that is stack
    let copy = record(
        b::PERF_RECORD_SAMPLE,
        b::PERF_RECORD_MISC_USER as u16,
        &body,
        None,
    );
    decode_one(&copy, |event| {
        let Some(Event::Sample(s)) = event else {
            panic!("not a sample: {event:?}");
        };
        assert_eq!((s.pid, s.tid, s.time, s.period), (10, 11, 777, 1_000_000));
        assert_eq!(s.kernel_stack, &[0xffff_ffff_8100_0000]);
        assert!(s.user_callchain.is_empty());
        let regs = s.user_regs.expect("registers");
        assert_eq!((regs.fp, regs.sp, regs.pc), (0x7ff0, 0x7fe0, 0x40_1234));
        assert_eq!(s.user_stack, &stack[..40]);
        assert!(copy.as_ptr_range().contains(&s.user_stack.as_ptr()));
        assert!(s.in_user);
    });
}

#[test]
fn executable_mappings_keep_their_build_id_and_data_mappings_are_dropped() {
    let id = [0xab; 20];
    let exec = libc::PROT_READ as u32 | libc::PROT_EXEC as u32;
    decode_one(&mmap2_record(exec, Some(&id), b"/usr/bin/true"), |event| {
        let Some(Event::Mmap { pid, tid, mapping }) = event else {
            panic!("not a mapping: {event:?}");
        };
        assert_eq!((pid, tid), (7, 8));
        assert_eq!(
            (mapping.start, mapping.end, mapping.offset),
            (0x40_0000, 0x40_2000, 0x1000)
        );
        assert_eq!(&*mapping.path, "/usr/bin/true");
        assert_eq!(mapping.build_id.as_deref(), Some(&id[..]));
    });
    // The kernel sends an empty build-id when it could not read the file's.
    decode_one(&mmap2_record(exec, Some(&[]), b"/usr/bin/true"), |event| {
        let Some(Event::Mmap { mapping, .. }) = event else {
            panic!("not a mapping: {event:?}");
        };
        assert_eq!(mapping.build_id, None);
    });
    decode_one(
        &mmap2_record(libc::PROT_READ as u32, None, b"/data"),
        |event| {
            assert!(event.is_none(), "{event:?}");
        },
    );
}

#[test]
fn a_build_id_longer_than_its_field_is_refused_not_trusted() {
    let copy = mmap2_record(libc::PROT_EXEC as u32, Some(&[1; 21]), b"/x");
    let (raw, _) = record_at(&copy, 0, dwarf_layout()).unwrap();
    let refused = parse(&raw).unwrap_err();
    assert!(refused.contains("21 bytes"), "{refused}");
}

#[test]
fn a_record_in_two_pieces_reads_as_one() {
    let copy = comm_record(3, 4, b"wrapped-name", 9);
    let body = &copy[8..];
    let (first, second) = body.split_at(13);
    let raw = RawEventRecord::new(
        RecordType::COMM,
        b::PERF_RECORD_MISC_COMM_EXEC as u16,
        RawData::Split(first, second),
        dwarf_layout(),
    );
    let parsed = parse(&raw).unwrap();
    let mut decoder = Decoder::new(Some(Arch::X86_64));
    match decoder.event(&parsed) {
        Some(Event::Comm { comm, .. }) => assert_eq!(comm, "wrapped-name"),
        other => panic!("not a comm record: {other:?}"),
    }
}
