use super::*;
use crate::payload::{self, Payload};

fn decoded((header, bytes): (Header, Vec<u8>)) -> Event {
    decode(&header, &bytes)
        .expect("payload decodes")
        .expect("event is of a kind used")
}

#[test]
fn a_sampled_profile_event_gives_the_interrupted_thread_and_address() {
    let event = decoded(payload::sampled_profile(1000, 4242, 0x7ff7_1234_5678));
    assert_eq!(
        event,
        Event::Sample {
            timestamp: 1000,
            tid: 4242,
            cpu: 1,
            ip: 0x7ff7_1234_5678
        }
    );
}

#[test]
fn a_stack_walk_event_gives_whose_stack_it_is_and_every_frame() {
    let frames = [0xffff_f800_0010_0000, 0x7ff7_0000_1010, 0x7ffa_0000_2020];
    let event = decoded(payload::stack_walk(2000, 1000, 77, 4242, &frames));
    assert_eq!(
        event,
        Event::Stack {
            timestamp: 1000,
            pid: 77,
            tid: 4242,
            frames: frames.to_vec()
        }
    );
}

#[test]
fn image_loads_unloads_and_rundown_give_the_image() {
    let path = r"\Device\HarddiskVolume3\Windows\System32\ntdll.dll";
    for (op, change) in [
        (opcode::LOAD, Change::Start),
        (opcode::UNLOAD, Change::End),
        (opcode::DC_START, Change::Existing),
        (opcode::DC_END, Change::Remaining),
    ] {
        let event = decoded(payload::image(op, 77, 0x7ffa_0000_0000, 0x1f_8000, path));
        assert_eq!(
            event,
            Event::Image {
                change,
                image: Image {
                    pid: 77,
                    base: 0x7ffa_0000_0000,
                    size: 0x1f_8000,
                    path: path.to_string()
                }
            },
            "opcode {op}"
        );
    }
}

#[test]
fn process_events_give_pid_parent_exit_status_and_name_with_or_without_a_sid() {
    for rid in [Some(1001), None] {
        for (op, change) in [
            (opcode::START, Change::Start),
            (opcode::END, Change::End),
            (opcode::DC_START, Change::Existing),
        ] {
            let event = decoded(payload::process(op, 77, 12, -3, "myprog.exe", rid));
            assert_eq!(
                event,
                Event::Process {
                    change,
                    pid: 77,
                    parent: 12,
                    exit_status: -3,
                    name: "myprog.exe".to_string()
                },
                "opcode {op}, sid {rid:?}"
            );
        }
    }
}

#[test]
fn a_version_3_process_event_has_no_flags_field() {
    let bytes = Payload::default()
        .u64(0xffff_c001_0000_0080)
        .u32(77)
        .u32(12)
        .u32(1)
        .u32(0)
        .u64(0x1ad000)
        .u32(0)
        .ansi("old.exe")
        .bytes();
    let header = payload::header(provider::PROCESS, opcode::START, 3, 0);
    match decode(&header, &bytes) {
        Ok(Some(Event::Process { pid, name, .. })) => {
            assert_eq!((pid, name.as_str()), (77, "old.exe"))
        }
        other => panic!("not a process start: {other:?}"),
    }
}

#[test]
fn thread_events_give_the_thread_and_its_process() {
    for (op, change) in [
        (opcode::START, Change::Start),
        (opcode::END, Change::End),
        (opcode::DC_START, Change::Existing),
    ] {
        let event = decoded(payload::thread(op, 77, 4242));
        assert_eq!(
            event,
            Event::Thread {
                change,
                pid: 77,
                tid: 4242
            }
        );
    }
}

#[test]
fn other_events_are_left_alone_and_short_payloads_are_errors() {
    let (mut header, bytes) = payload::sampled_profile(1, 2, 3);
    header.opcode = 47;
    assert_eq!(decode(&header, &bytes), Ok(None));
    header.provider = 0x1234;
    assert_eq!(decode(&header, &bytes), Ok(None));

    let (header, bytes) = payload::image(opcode::LOAD, 77, 0x1000, 0x100, "x.dll");
    let err = decode(&header, &bytes[..20]).unwrap_err();
    assert_eq!(
        err,
        DecodeError::Short {
            event: "Image",
            len: 20
        }
    );
    assert_eq!(
        err.to_string(),
        "Image event's payload ends early (20 bytes)"
    );
    let (header, bytes) = payload::stack_walk(1, 1, 1, 1, &[]);
    assert!(decode(&header, &bytes[..10]).is_err());
}

#[test]
fn a_32_bit_kernels_pointers_are_4_bytes() {
    let bytes = Payload::default().u32(0x0040_1000).u32(9).u32(1).bytes();
    let mut header = payload::header(provider::PERF_INFO, opcode::SAMPLED_PROFILE, 2, 5);
    header.pointer_size = 4;
    assert_eq!(
        decode(&header, &bytes),
        Ok(Some(Event::Sample {
            timestamp: 5,
            tid: 9,
            cpu: 1,
            ip: 0x0040_1000
        }))
    );
}
