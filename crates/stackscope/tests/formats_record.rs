//! A real recording of split.c (func_a about 30% / func_b about 70% of the work, each share
//! measured by the program itself) written in the viewer formats and read by their consumers: `go tool pprof` on `record -o prof.pb.gz`, and
//! `report profile.json` into speedscope, Firefox Profiler and OSDK JSON, the last read back
//! by `report` itself.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use serde_json::Value;
use stackscope_testkit::peers::go_pprof;
use std::path::Path;

/// The `-top` rows: (row index, cum share in percent, function name).
fn top_rows(top: &str) -> Vec<(usize, f64, String)> {
    top.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .enumerate()
        .filter_map(|(i, l)| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let cum = f.get(4)?.strip_suffix('%')?.parse().ok()?;
            Some((i, cum, f.get(5..)?.join(" ")))
        })
        .collect()
}

/// Asserts that the shares `go tool pprof` shows of `file`, counted in samples, are the
/// measured split.
fn assert_pprof_split(file: &Path, truth: &Truth) {
    let counted = go_pprof(&["-sample_index=samples", "-top", "-nodecount=50"], file);
    let total: u64 = counted
        .lines()
        .find_map(|l| l.strip_suffix(" total")?.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no sample total in pprof -top:\n{counted}"));
    let rows = top_rows(&counted);
    truth.assert_matches(
        total,
        |name| {
            rows.iter()
                .find(|r| r.2 == name)
                .map_or(0.0, |r| r.1 / 100.0)
        },
        || counted.clone(),
    );
}

#[test]
fn go_tool_pprof_shows_the_split_of_a_recording() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let out = dir.path().join("prof.pb.gz");
    record(dir.path(), &out, &["-F", "999"], &split.command()).assert_ok();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..2], [0x1f, 0x8b], "not gzip");

    let top = go_pprof(&["-top", "-nodecount=50"], &out);
    let rows = top_rows(&top);
    let find = |name: &str| {
        rows.iter()
            .find(|r| r.2 == name)
            .unwrap_or_else(|| panic!("{name} not in pprof -top:\n{top}"))
            .clone()
    };
    let (a_row, _, _) = find("func_a");
    let (b_row, _, _) = find("func_b");
    assert!(b_row < a_row, "func_b is not above func_a:\n{top}");
    assert!(find("main").1 >= 99.0, "main not in every stack:\n{top}");
    // CPU time is the default value, with the sampling period.
    assert!(top.contains("Type: cpu"), "{top}");

    assert_pprof_split(&out, &split.truth());

    // Every sample is labelled with its thread.
    let traces = go_pprof(&["-traces"], &out);
    assert!(
        traces
            .lines()
            .any(|l| l.split_whitespace().eq(["thread:", "split_nofp"])),
        "{traces}"
    );
}

/// Share of the total weight of speedscope samples whose stack holds frame `name`.
fn speedscope_share(file: &Value, name: &str) -> f64 {
    let frames = file["shared"]["frames"].as_array().unwrap();
    let (mut hit, mut total) = (0u64, 0u64);
    for p in file["profiles"].as_array().unwrap() {
        let weights = p["weights"].as_array().unwrap();
        for (stack, w) in p["samples"].as_array().unwrap().iter().zip(weights) {
            let w = w.as_u64().unwrap();
            total += w;
            if stack
                .as_array()
                .unwrap()
                .iter()
                .any(|i| frames[i.as_u64().unwrap() as usize]["name"] == name)
            {
                hit += w;
            }
        }
    }
    hit as f64 / total as f64
}

fn read_json_file(path: &Path) -> Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn report_writes_speedscope_firefox_and_osdk_json() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let (_, profile) = record_json(dir.path(), &["-F", "999"], &split.command());
    assert_min_samples(&profile, 500);
    let run = |args: &[&str]| {
        let mut all = vec!["report"];
        all.extend_from_slice(args);
        stackscope(dir.path(), all).assert_ok();
    };

    // speedscope: the format from the double extension, shares as recorded.
    run(&["profile.json", "-o", "prof.speedscope.json"]);
    let ss = read_json_file(&dir.path().join("prof.speedscope.json"));
    assert_eq!(
        ss["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let b = speedscope_share(&ss, "func_b");
    assert!(
        (b - share_of(&profile, "func_b")).abs() < 1e-9,
        "speedscope func_b share {b}"
    );
    split.truth().assert_matches(
        profile.total_samples(),
        |name| speedscope_share(&ss, name),
        || top_stacks(&profile, 8),
    );

    // Firefox Profiler: one thread, weights summing to the sample count.
    run(&["profile.json", "-o", "prof.firefox.json"]);
    let fx = read_json_file(&dir.path().join("prof.firefox.json"));
    let threads = fx["threads"].as_array().unwrap();
    assert_eq!(threads.len(), profile.threads.len());
    assert_eq!(threads[0]["name"], "split_nofp");
    let weights: i64 = threads[0]["samples"]["weight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_i64().unwrap())
        .sum();
    assert_eq!(weights as u64, profile.total_samples());

    // OSDK JSON by name, read back by report (content detection) into folded stacks.
    run(&["profile.json", "--format", "osdk", "-o", "prof.osdk-out"]);
    let osdk = read_json_file(&dir.path().join("prof.osdk-out"));
    let rounds = osdk["stack_traces"].as_array().unwrap();
    assert!(!rounds.is_empty());
    run(&["prof.osdk-out", "-o", "back.folded"]);
    let folded = parse_folded(&std::fs::read_to_string(dir.path().join("back.folded")).unwrap());
    let total: u64 = folded.iter().map(|l| l.1).sum();
    assert_eq!(total, profile.total_samples());
    assert!(
        folded.iter().all(|l| l.0[0].starts_with("cpu")),
        "{folded:?}"
    );
    let b = folded_share(&folded, |frames| frames.iter().any(|f| f == "func_b"));
    assert!(
        (b - share_of(&profile, "func_b")).abs() < 1e-9,
        "OSDK func_b share {b}"
    );
}

/// The frames of each `-traces` sample, leaf first, `(inline)` kept on inlined ones.
fn traces_stacks(traces: &str) -> Vec<Vec<String>> {
    traces
        .split("-----------+")
        .skip(1)
        .map(|block| {
            block
                .lines()
                .skip(1)
                // Label lines are `key:  value`; frame lines are indented past the value column.
                .filter(|l| !l.trim_end().ends_with(':') && !l.contains(":  "))
                .filter_map(|l| {
                    let l = l.trim();
                    // The first frame line starts with the sample's value.
                    let frame = match l.split_once("   ") {
                        Some((value, rest)) if value.chars().next()?.is_ascii_digit() => rest,
                        _ => l,
                    };
                    (!frame.is_empty()).then(|| frame.trim().to_string())
                })
                .collect()
        })
        .filter(|s: &Vec<String>| !s.is_empty())
        .collect()
}

#[test]
fn go_tool_pprof_shows_inlined_rust_frames_as_lines_of_their_caller() {
    let _serial = serial();
    let dir = tempdir();
    let deep = Measured::new(dir.path(), "rust_deep", "4000");
    let out = dir.path().join("deep.pb.gz");
    record(dir.path(), &out, &[], &deep.command()).assert_ok();

    let traces = go_pprof(&["-traces"], &out);
    let stacks = traces_stacks(&traces);
    // pprof marks every line of a location but its last (the caller it was inlined into).
    // Samples in a leaf (not those taken in the loader or between calls) are in one of its
    // inlined helpers: the loop, or the clock read that measures it.
    let in_leaf: Vec<&Vec<String>> = stacks
        .iter()
        .filter(|s| s.iter().any(|f| f.starts_with("rust_deep::leaf_")))
        .collect();
    assert!(in_leaf.len() >= 2, "{traces}");
    let inlined = in_leaf
        .iter()
        .filter(|s| {
            s.windows(2).any(|w| {
                [
                    "rust_deep::deep_helper_mix (inline)",
                    "rust_deep::thread_cpu_ns (inline)",
                ]
                .contains(&w[0].as_str())
                    && w[1].starts_with("rust_deep::leaf_")
                    && !w[1].ends_with("(inline)")
            })
        })
        .count();
    assert!(
        inlined as f64 >= 0.9 * in_leaf.len() as f64,
        "the inlined helper under a leaf in only {inlined} of {} pprof traces in a leaf:\n{traces}",
        in_leaf.len()
    );
    assert_pprof_split(&out, &deep.truth());
}
