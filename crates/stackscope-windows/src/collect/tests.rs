//! A decoded event stream through the middle to a profile, as a recording on Windows feeds
//! it: an attached process whose images are known only from the rundown, a launched child,
//! a sample whose kernel and user stacks come as two events, and another process filtered out.

use std::collections::BTreeMap;

use super::*;
use crate::event::opcode::{DC_START, END, LOAD, START};
use crate::event::Header;
use crate::payload;

const PROG: u64 = 0x7ff7_1000_0000;
const NTDLL: u64 = 0x7ffa_2000_0000;
const NT: u64 = 0xffff_f804_5000_0000;

fn paths() -> DevicePaths {
    DevicePaths::new(
        vec![(r"\Device\HarddiskVolume3".into(), "C:".into())],
        Some(r"C:\Windows".into()),
    )
}

/// Each sample as `process;frame;frame` (root first, frames as the profile names them).
fn folded(profile: &Profile) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for sample in &profile.samples {
        let thread = profile.thread(sample.thread);
        let mut line = vec![thread.process_name.clone()];
        line.extend(
            profile
                .stack_frames(sample.stack)
                .map(|f| format!("{}@{}", f.name, f.module.as_deref().unwrap_or("-"))),
        );
        *out.entry(line.join(";")).or_insert(0) += sample.count;
    }
    out
}

/// A collector of process 77's samples alone.
fn attached() -> Collector {
    Collector::new(
        Target::Pids {
            pids: vec![77],
            children: false,
        },
        paths(),
    )
}

/// The rundown of the attached process: it, its thread and images, and the kernel.
fn rundown() -> Vec<(Header, Vec<u8>)> {
    vec![
        payload::process(DC_START, 77, 12, 0, "myprog.exe", Some(1001)),
        payload::thread(DC_START, 77, 4242),
        payload::image(
            DC_START,
            77,
            PROG,
            0x2_0000,
            r"\Device\HarddiskVolume3\src\myprog.exe",
        ),
        payload::image(
            DC_START,
            77,
            NTDLL,
            0x1f_8000,
            r"\Device\HarddiskVolume3\Windows\System32\ntdll.dll",
        ),
        payload::image(
            DC_START,
            0,
            NT,
            0x100_0000,
            r"\SystemRoot\system32\ntoskrnl.exe",
        ),
    ]
}

fn stream(collector: &mut Collector) {
    let mut events = rundown();
    events.extend([
        // Another process, in the rundown too.
        payload::process(DC_START, 88, 12, 0, "other.exe", None),
        payload::thread(DC_START, 88, 888),
        // A sample in user code: one stack event.
        payload::sampled_profile(100, 4242, PROG + 0x1234),
        payload::stack_walk(
            101,
            100,
            77,
            4242,
            &[PROG + 0x1234, PROG + 0x2000, NTDLL + 0x5000],
        ),
        // Another process's sample, not profiled.
        payload::sampled_profile(110, 888, 0x40_1000),
        payload::stack_walk(111, 110, 88, 888, &[0x40_1000]),
        // A sample in the kernel: its kernel part now, its user part on return to user mode.
        payload::sampled_profile(200, 4242, NT + 0x100),
        payload::stack_walk(201, 200, 77, 4242, &[NT + 0x100, NT + 0x2000]),
        payload::stack_walk(260, 250, 77, 4242, &[PROG + 0x1500, NTDLL + 0x5000]),
        // The profiled process starts a child, which loads its image and is sampled.
        payload::process(START, 99, 77, 0, "child.exe", None),
        payload::thread(START, 99, 999),
        payload::image(
            LOAD,
            99,
            PROG,
            0x2_0000,
            r"\Device\HarddiskVolume3\src\child.exe",
        ),
        payload::sampled_profile(300, 999, PROG + 0x10),
        payload::stack_walk(301, 300, 99, 999, &[PROG + 0x10]),
        // An address in no image.
        payload::sampled_profile(400, 4242, 0x1234_0000),
        payload::stack_walk(401, 400, 77, 4242, &[0x1234_0000, PROG + 0x2000]),
        payload::process(END, 99, 77, 3, "child.exe", None),
    ]);
    for (header, bytes) in events {
        collector.record(header, bytes);
    }
}

#[test]
fn a_decoded_stream_becomes_a_profile_named_by_module() {
    let target = Target::Pids {
        pids: vec![77],
        children: true,
    };
    let mut collector = Collector::new(target, paths());
    stream(&mut collector);
    let counts = collector.counts();
    assert_eq!(counts.samples, 4, "the other process's sample is left out");
    assert_eq!(counts.undecodable, 0);
    let (profile, tally, hints) = collector.finish(&mut Symbolizer::new(), Metadata::default());
    assert!(hints.is_empty(), "{hints:?}");
    // No file of these images is here: each frame is named by its module and RVA, a return
    // address stepped back into its call.
    let expected: BTreeMap<String, u64> = [
        ("myprog.exe;ntdll.dll+0x4fff@ntdll.dll;myprog.exe+0x1fff@myprog.exe;myprog.exe+0x1234@myprog.exe", 1),
        ("myprog.exe;ntdll.dll+0x4fff@ntdll.dll;myprog.exe+0x14ff@myprog.exe;ntoskrnl.exe+0x1fff@ntoskrnl.exe;ntoskrnl.exe+0x100@ntoskrnl.exe", 1),
        ("child.exe;child.exe+0x10@child.exe", 1),
        ("myprog.exe;myprog.exe+0x1fff@myprog.exe;[unknown]@-", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(folded(&profile), expected);
    let kinds: Vec<_> = profile
        .frames
        .iter()
        .filter(|f| f.module.as_deref() == Some("ntoskrnl.exe"))
        .map(|f| f.kind)
        .collect();
    assert_eq!(kinds, [FrameKind::Kernel, FrameKind::Kernel]);
    assert_eq!(tally.stats.user_stacks, 4);
    assert_eq!(tally.stats.with_unknown, 1);
}

#[test]
fn the_whole_system_counts_every_process_and_a_lost_user_part_is_said() {
    let mut collector = Collector::new(Target::System { idle: false }, paths());
    stream(&mut collector);
    // An idle CPU's sample, left out.
    for (header, bytes) in [
        payload::sampled_profile(450, 0, NT + 0x900),
        payload::stack_walk(451, 450, 0, 0, &[NT + 0x900]),
    ] {
        collector.record(header, bytes);
    }
    // A sample in the kernel whose thread ends before returning to user mode.
    for (header, bytes) in [
        payload::sampled_profile(500, 888, NT + 0x100),
        payload::stack_walk(501, 500, 88, 888, &[NT + 0x100]),
        payload::thread(END, 88, 888),
    ] {
        collector.record(header, bytes);
    }
    let (header, bytes) = payload::image(LOAD, 77, PROG, 0x100, "x.dll");
    collector.record(header, bytes[..12].to_vec());
    let counts = collector.counts();
    assert_eq!(
        (counts.samples, counts.user_missing, counts.undecodable),
        (6, 1, 1)
    );
    let (profile, _, hints) = collector.finish(&mut Symbolizer::new(), Metadata::default());
    assert_eq!(profile.total_samples(), 6);
    assert!(folded(&profile).contains_key("other.exe;ntoskrnl.exe+0x100@ntoskrnl.exe"));
    assert_eq!(hints.len(), 2, "{hints:?}");
}

#[test]
fn without_the_rundown_an_attached_process_has_no_module_names() {
    let mut collector = attached();
    for (header, bytes) in [
        payload::sampled_profile(100, 4242, PROG + 0x1234),
        payload::stack_walk(101, 100, 77, 4242, &[PROG + 0x1234]),
    ] {
        collector.record(header, bytes);
    }
    let (profile, _, _) = collector.finish(&mut Symbolizer::new(), Metadata::default());
    let names: Vec<&str> = profile.frames.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["[unknown]"]);
}

#[test]
fn user_or_kernel_frames_alone_are_kept_when_asked() {
    for (user, kernel, expected) in [
        (
            true,
            false,
            "myprog.exe;ntdll.dll+0x4fff@ntdll.dll;myprog.exe+0x14ff@myprog.exe",
        ),
        (
            false,
            true,
            "myprog.exe;ntoskrnl.exe+0x1fff@ntoskrnl.exe;ntoskrnl.exe+0x100@ntoskrnl.exe",
        ),
    ] {
        let mut collector = attached();
        collector.keep(user, kernel);
        stream(&mut collector);
        let (profile, _, _) = collector.finish(&mut Symbolizer::new(), Metadata::default());
        let folded = folded(&profile);
        assert!(folded.contains_key(expected), "{folded:#?}");
    }
}

#[test]
fn a_user_stack_delivered_before_its_sample_is_stitched_once_put_back_in_order() {
    let mut collector = attached();
    collector.reorder_within(1000);
    // The rundown, then a sample in the kernel whose user stack (logged on another CPU when
    // the thread returned to user mode) is delivered first.
    let mut events = rundown();
    events.push(payload::stack_walk(260, 250, 77, 4242, &[PROG + 0x1500]));
    events.push(payload::sampled_profile(200, 4242, NT + 0x100));
    events.push(payload::stack_walk(201, 200, 77, 4242, &[NT + 0x100]));
    for (header, bytes) in events {
        collector.record(header, bytes);
    }
    let (profile, _, hints) = collector.finish(&mut Symbolizer::new(), Metadata::default());
    assert!(hints.is_empty(), "{hints:?}");
    let expected = "myprog.exe;myprog.exe+0x14ff@myprog.exe;ntoskrnl.exe+0x100@ntoskrnl.exe";
    assert_eq!(
        folded(&profile),
        BTreeMap::from([(expected.to_string(), 1)])
    );
}

/// A program built here for Windows, with its PDB: clang for the MSVC target, no Windows SDK.
const PDB_PROGRAM: &str = r#"
static volatile int counter;
__attribute__((noinline)) static int helper(int x) { counter += x; return counter * 3; }
static inline int twice(int x) { return helper(x) + helper(x + 1); }
__attribute__((noinline)) int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += twice(i);
    return s;
}
int mainCRTStartup(void) { return work(10); }
"#;

#[test]
fn frames_in_an_image_with_a_pdb_are_named_from_it_inlined_functions_too() {
    use stackscope_testkit::pe::{build_msvc, calls_to};

    let dir = tempfile::TempDir::new().unwrap();
    let flags: &[&str] = &["-g", "-gcodeview", "-O1"];
    let prog = build_msvc(dir.path(), "t", &[("t.c", PDB_PROGRAM, "clang", flags)]);
    let (work, helper) = (prog.rva(|n| n == "work"), prog.rva(|n| n == "helper"));
    let call = calls_to(&prog, work, helper)[0];
    // The image's file, as the kernel logs a path it has no device for.
    let logged = format!(r"\??\{}", prog.exe.display());
    let mut collector = attached();
    for (header, bytes) in [
        payload::process(DC_START, 77, 12, 0, "t.exe", None),
        payload::thread(DC_START, 77, 4242),
        payload::image(DC_START, 77, PROG, 0x1_0000, &logged),
        payload::sampled_profile(100, 4242, PROG + helper + 2),
        // In `helper`, called from `twice` inlined into `work`: the return address follows
        // the call.
        payload::stack_walk(101, 100, 77, 4242, &[PROG + helper + 2, PROG + call + 5]),
    ] {
        collector.record(header, bytes);
    }
    let (profile, tally, _) = collector.finish(&mut Symbolizer::new(), Metadata::default());
    assert_eq!(
        folded(&profile),
        BTreeMap::from([("t.exe;work@t.exe;twice@t.exe;helper@t.exe".to_string(), 1)])
    );
    let twice = profile.frames.iter().find(|f| f.name == "twice").unwrap();
    assert!(twice.inlined);
    assert!(twice.line.is_some());
    assert_eq!(tally.stats.with_unnamed, 0);
}
