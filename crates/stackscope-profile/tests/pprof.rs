//! The pprof writer: the decoded message of the fixture profile against a golden dump, and the
//! real consumer, `go tool pprof`, reading what we write.

mod fixture;

use flate2::read::GzDecoder;
use prost::Message;
use stackscope_profile::format::pprof::proto;
use stackscope_profile::format::{write, Format, WriteOptions};
use stackscope_profile::{Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread};
use stackscope_testkit::peers::go_pprof;
use std::fmt::Write as _;
use std::io::Read;
use std::path::Path;

fn pprof_bytes(profile: &Profile) -> Vec<u8> {
    let mut out = Vec::new();
    write(profile, Format::Pprof, &WriteOptions::default(), &mut out).unwrap();
    out
}

fn decode(gz: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("pprof output is gzip");
    proto::Profile::decode(raw.as_slice()).expect("pprof output is a Profile message")
}

/// A readable, stable dump of the message: every table with strings resolved.
fn dump(p: &proto::Profile) -> String {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut out = String::new();
    let vt = |v: &proto::ValueType| format!("{}/{}", s(v.r#type), s(v.unit));
    let types: Vec<String> = p.sample_type.iter().map(vt).collect();
    writeln!(out, "sample_type: {}", types.join(", ")).unwrap();
    writeln!(
        out,
        "period: {} {}",
        p.period,
        p.period_type.as_ref().map(vt).unwrap_or_default()
    )
    .unwrap();
    writeln!(out, "default_sample_type: {}", s(p.default_sample_type)).unwrap();
    writeln!(out, "duration_nanos: {}", p.duration_nanos).unwrap();
    for c in &p.comment {
        writeln!(out, "comment: {}", s(*c)).unwrap();
    }
    for m in &p.mapping {
        writeln!(
            out,
            "mapping {}: {} build_id={:?} functions={} filenames={} lines={} inline={}",
            m.id,
            s(m.filename),
            s(m.build_id),
            m.has_functions,
            m.has_filenames,
            m.has_line_numbers,
            m.has_inline_frames
        )
        .unwrap();
    }
    for f in &p.function {
        writeln!(
            out,
            "function {}: {:?} system={:?} file={:?}",
            f.id,
            s(f.name),
            s(f.system_name),
            s(f.filename)
        )
        .unwrap();
    }
    for l in &p.location {
        let lines: Vec<String> = l
            .line
            .iter()
            .map(|x| format!("f{}:{}", x.function_id, x.line))
            .collect();
        writeln!(
            out,
            "location {}: mapping {} address {:#x} lines [{}]",
            l.id,
            l.mapping_id,
            l.address,
            lines.join(" ")
        )
        .unwrap();
    }
    for sample in &p.sample {
        let labels: Vec<String> = sample
            .label
            .iter()
            .map(|l| {
                if l.str != 0 {
                    format!("{}={}", s(l.key), s(l.str))
                } else {
                    format!("{}={}", s(l.key), l.num)
                }
            })
            .collect();
        writeln!(
            out,
            "sample {:?} locations {:?} labels {}",
            sample.value,
            sample.location_id,
            labels.join(",")
        )
        .unwrap();
    }
    out
}

#[test]
fn pprof_golden() {
    let mut profile = fixture::profile();
    profile
        .meta
        .build_ids
        .insert("worker".to_string(), "0a1b2c3d4e5f".to_string());
    let p = decode(&pprof_bytes(&profile));
    fixture::check_golden("profile.pprof.txt", &dump(&p));
}

#[test]
fn inlined_frames_are_lines_of_one_location() {
    let p = decode(&pprof_bytes(&fixture::profile()));
    let s = |i: i64| p.string_table[i as usize].as_str();
    let name_of = |id: u64| s(p.function.iter().find(|f| f.id == id).unwrap().name);
    // `square` was inlined into `compute`: one location, innermost line first.
    let loc = p
        .location
        .iter()
        .find(|l| l.line.iter().any(|x| name_of(x.function_id) == "square"))
        .expect("a location for square");
    let names: Vec<&str> = loc.line.iter().map(|x| name_of(x.function_id)).collect();
    assert_eq!(names, ["square", "compute"]);
    assert_eq!(loc.line.iter().map(|x| x.line).collect::<Vec<_>>(), [9, 21]);
    // Every kernel frame sits in the kernel mapping.
    let kernel = p
        .mapping
        .iter()
        .find(|m| s(m.filename) == "[kernel.kallsyms]")
        .expect("a kernel mapping");
    for l in &p.location {
        let first = name_of(l.line[0].function_id);
        if ["ksys_read", "do_idle", "entry_SYSCALL_64"].contains(&first) {
            assert_eq!(l.mapping_id, kernel.id, "{first}");
        }
    }
    // Values: count, and count × 1/99 s in nanoseconds.
    let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!(total, 31);
    for x in &p.sample {
        assert_eq!(x.value[1], x.value[0] * (1_000_000_000 / 99));
    }
}

fn write_file(profile: &Profile, dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pprof_bytes(profile)).unwrap();
    path
}

#[test]
fn go_tool_pprof_reads_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&fixture::profile(), dir.path(), "profile.pb.gz");

    // Flat counts by function: square 16 (12 + 4 on the I/O thread), do-idle stack 5.
    let top = go_pprof(&["-top", "-sample_index=samples", "-nodecount=100"], &file);
    let flat = |name: &str| -> Option<i64> {
        top.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let shown = f.get(5..)?.join(" ");
            (shown.trim_end_matches(" (inline)") == name).then(|| f[0].parse().ok())?
        })
    };
    assert_eq!(flat("square"), Some(16), "{top}");
    assert_eq!(flat("default_idle"), Some(5), "{top}");
    assert_eq!(flat("ksys_read"), Some(4), "{top}");

    // -traces prints every sample with its labels and marks inlined frames.
    let traces = go_pprof(&["-traces"], &file);
    let has_label = |key: &str, value: &str| {
        traces
            .lines()
            .any(|l| l.split_whitespace().eq([key, value]))
    };
    assert!(has_label("thread:", "worker-io"), "{traces}");
    assert!(has_label("pid:", "4242"), "{traces}");
    assert!(has_label("tid:", "4243"), "{traces}");
    assert!(
        traces
            .lines()
            .any(|l| l.contains("square") && l.contains("(inline)")),
        "{traces}"
    );
    // The default value is CPU time: duration and period show in the header.
    assert!(traces.contains("Type: cpu"), "{traces}");
}

/// The blocks `go tool pprof -traces` prints, one per sample it holds, each between two
/// separator lines.
fn trace_blocks(traces: &str) -> Vec<&str> {
    traces
        .split("-----------+-------------------------------------------------------")
        .skip(1)
        .filter(|block| !block.trim().is_empty())
        .collect()
}

#[test]
fn traces_show_a_stack_once_per_thread_whatever_cpus_it_ran_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&fixture::profile(), dir.path(), "profile.pb.gz");
    let traces = go_pprof(&["-traces", "-sample_index=samples"], &file);
    // The worker thread's hot stack was sampled 7 times on CPU 0 and 5 times on CPU 1.
    let hot: Vec<&str> = trace_blocks(&traces)
        .into_iter()
        .filter(|b| b.contains("thread:  worker\n") && b.contains("square"))
        .collect();
    assert_eq!(hot.len(), 1, "{traces}");
    let leaf = hot[0].lines().find(|l| l.contains("square")).unwrap();
    assert_eq!(leaf.split_whitespace().next(), Some("12"), "{traces}");
    assert!(!traces.contains("cpu:"), "{traces}");
    // Every stack and thread of the profile is one trace.
    let profile = fixture::profile();
    let pairs: std::collections::HashSet<(u32, u32)> = profile
        .samples
        .iter()
        .map(|s| (s.stack, s.thread))
        .collect();
    assert_eq!(trace_blocks(&traces).len(), pairs.len(), "{traces}");
}

#[test]
fn go_tool_pprof_shows_whole_generic_and_closure_names() {
    let names = [
        "std::rt::lang_start::{{closure}}",
        "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop",
        "hashbrown::raw::RawTableInner::probe_seq",
        "core::num::<impl u64>::wrapping_add",
        "std::vector<int, std::allocator<int> >::push_back(int const&)",
    ];
    let mut b = ProfileBuilder::new(Metadata {
        frequency_hz: Some(100),
        event: "cpu-clock".to_string(),
        ..Metadata::default()
    });
    let frames: Vec<u32> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            b.frame(Frame {
                name: name.to_string(),
                module: Some("app".to_string()),
                // wrapping_add inlined into probe_seq, as rustc does.
                inlined: name.ends_with("wrapping_add"),
                line: Some(10 + i as u32),
                ..Frame::default()
            })
        })
        .collect();
    let t = b.thread(Thread::default());
    for depth in 1..=frames.len() {
        let stack = b.stack(&frames[..depth]);
        b.add(t, stack, Some(0), depth as u64);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&b.finish(), dir.path(), "names.pb.gz");

    let top = go_pprof(&["-top", "-sample_index=samples", "-nodecount=100"], &file);
    let shown: Vec<String> = top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(
                f.get(5..)?
                    .join(" ")
                    .trim_end_matches(" (inline)")
                    .to_string(),
            )
        })
        .collect();
    for name in names {
        assert!(
            shown.iter().any(|s| s == name),
            "{name} not shown whole:\n{top}"
        );
    }
    let traces = go_pprof(&["-traces"], &file);
    for name in names {
        assert!(traces.contains(name), "{name} not shown whole:\n{traces}");
    }
}

#[test]
fn a_wall_profile_is_time_with_its_events_as_labels() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&fixture::wall(), dir.path(), "wall.pb.gz");
    let p = decode(&std::fs::read(&file).unwrap());
    let name = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (name(t.r#type), name(t.unit)))
        .collect();
    assert_eq!(types, [("wall", "nanoseconds")]);
    // Microseconds become nanoseconds; pprof adds them up by function.
    let top = go_pprof(&["-top", "-unit=ms"], &file);
    assert!(top.contains("Type: wall"), "{top}");
    let flat = |name: &str| {
        top.lines()
            .find(|l| l.trim_end().ends_with(name))
            .map(str::trim)
    };
    assert!(flat("nap").is_some_and(|l| l.starts_with("800ms")), "{top}");
    // The event label picks either kind.
    let off = go_pprof(&["-top", "-unit=ms", "-tagfocus=event=off-cpu"], &file);
    assert!(off.contains("nap") && !off.contains("burn"), "{off}");
}

#[test]
fn memory_profiles_carry_objects_and_space_as_go_heap_profiles_do() {
    let dir = tempfile::tempdir().unwrap();
    for (held, prefix) in [(false, "alloc"), (true, "inuse")] {
        let file = write_file(
            &fixture::memory(held),
            dir.path(),
            &format!("{prefix}.pb.gz"),
        );
        let p = decode(&std::fs::read(&file).unwrap());
        let name = |i: i64| p.string_table[i as usize].clone();
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| format!("{}/{}", name(t.r#type), name(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                format!("{prefix}_objects/count"),
                format!("{prefix}_space/bytes")
            ]
        );
        assert_eq!(name(p.default_sample_type), format!("{prefix}_space"));
        let values: Vec<&[i64]> = p.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(values, [[3, 3000], [1, 100_000]]);
        // pprof reads both by name, the space by default.
        let space = go_pprof(&["-top", &format!("-sample_index={prefix}_space")], &file);
        assert!(space.contains(&format!("Type: {prefix}_space")), "{space}");
        let line = |top: &str, f: &str| {
            top.lines()
                .find(|l| l.trim_end().ends_with(f))
                .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        };
        assert_eq!(line(&space, "load").as_deref(), Some("97.66kB"), "{space}");
        assert_eq!(
            line(&go_pprof(&["-top"], &file), "load").as_deref(),
            Some("97.66kB")
        );
        let objects = go_pprof(&["-top", &format!("-sample_index={prefix}_objects")], &file);
        assert_eq!(line(&objects, "grow").as_deref(), Some("3"), "{objects}");
    }
}

fn odd_profile() -> Profile {
    let mut b = ProfileBuilder::new(Metadata::default());
    let empty = b.frame(Frame::default());
    let k = b.frame(Frame {
        name: "kernel_only".to_string(),
        kind: FrameKind::Kernel,
        ..Frame::default()
    });
    let inl_root = b.frame(Frame {
        name: "inlined_at_root".to_string(),
        inlined: true,
        ..Frame::default()
    });
    let t = b.thread(Thread::default());
    let s1 = b.stack(&[k]);
    b.add(t, s1, None, 3);
    let s2 = b.stack(&[empty]);
    b.add(t, s2, Some(0), 0);
    let s3 = b.stack(&[]);
    b.add(t, s3, None, 2);
    let s4 = b.stack(&[inl_root, empty]);
    b.add(t, s4, None, 1 << 40);
    b.finish()
}

#[test]
fn odd_profiles_are_readable_by_go_tool_pprof() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&odd_profile(), dir.path(), "odd.pb.gz");
    let p = decode(&std::fs::read(&file).unwrap());
    // No period known: counts only.
    assert_eq!(p.sample_type.len(), 1);
    let top = go_pprof(&["-top", "-nodefraction=0"], &file);
    assert!(top.contains("kernel_only"), "{top}");
    assert!(top.contains("inlined_at_root"), "{top}");

    let empty = write_file(&Profile::default(), dir.path(), "empty.pb.gz");
    go_pprof(&["-top"], &empty);
}
