//! `stackscope record` on split.c, whose func_a and func_b share the work about 30/70 and
//! measure the CPU time they really take (iteration counts do not fix how a busy machine's CPU
//! splits its time): the sampled split against the measured one, whole stacks, every output
//! format and the report round trip.

#![cfg(target_os = "linux")]

mod common;

use common::*;

#[test]
fn dwarf_unwinding_without_frame_pointers_gives_the_split_and_whole_stacks() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let (_, profile) = record_json(
        dir.path(),
        &["--backend", "perf", "-F", "999"],
        &split.command(),
    );

    assert_min_samples(&profile, 500);
    let truth = split.truth();
    assert_split_profile(&profile, &truth);
    // The same comparison with the functions' truths swapped fails: it can tell.
    assert!(
        truth
            .swapped()
            .mismatch(profile.total_samples(), |name| share_of(&profile, name))
            .is_some(),
        "a swapped truth {truth:?} passes\n{}",
        top_stacks(&profile, 8)
    );
    assert_share_at_least(&profile, "main", 0.99);

    let meta = &profile.meta;
    assert_eq!(meta.frequency_hz, Some(999), "meta.frequency_hz");
    assert_eq!(meta.source, "perf_event", "meta.source");
    assert_eq!(meta.command, split.command_line(), "meta.command");
    assert_user_stacks_complete(&profile);
    assert!(
        profile.threads.iter().all(|t| t.comm == "split_nofp"),
        "threads: {:?}",
        profile.threads
    );

    // Symbolization carries module, file and line of the hot function.
    let func_b = frame_with_source(&profile, "func_b", "split_nofp", "split.c");
    assert!(
        func_b.line.is_some(),
        "func_b has no source line: {func_b:?}"
    );
}

#[test]
fn frame_pointer_unwinding_reaches_main_on_the_frame_pointer_build() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_fp", "4000");
    let (_, profile) = record_json(dir.path(), &["--unwind", "fp"], &split.command());

    assert_min_samples(&profile, 500);
    assert_share_at_least(&profile, "main", 0.99);
    assert_split_profile(&profile, &split.truth());
}

#[test]
fn folded_output_by_format_flag() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let text = record_text(
        dir.path(),
        "profile.out",
        &["--format", "folded"],
        &split.command(),
    );
    let lines = parse_folded(&text);
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        total >= 500,
        "only {total} samples in folded output:\n{text}"
    );
    assert!(
        lines.iter().all(|l| l.0[0] == "split_nofp"),
        "each folded line starts with the comm:\n{text}"
    );
    assert_split_folded(&lines, &split.truth());
    let main = folded_share(&lines, |f| f.iter().any(|x| x == "main"));
    assert!(
        main >= 0.99,
        "main share {main:.3} in folded output:\n{text}"
    );
}

#[test]
fn bcc_text_output_by_txt_extension() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let text = record_text(dir.path(), "profile.txt", &[], &split.command());

    // bcc profile's text: per stack, frames leaf first (4-space indent), then
    // `    -                comm (pid)`, then `        COUNT`, then a blank line. Each block
    // becomes a folded line (comm, then the frames) to measure.
    let mut stacks: Vec<(Vec<String>, u64)> = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let lines: Vec<&str> = block.lines().collect();
        let count: u64 = lines
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("bcc block without a count line:\n{block}"));
        let who = lines[lines.len() - 2].trim();
        assert!(
            who.starts_with('-') && who.contains("split_nofp ("),
            "bcc block without its `- comm (pid)` line:\n{block}"
        );
        let mut frames = vec!["split_nofp".to_string()];
        frames.extend(
            lines[..lines.len() - 2]
                .iter()
                .map(|l| l.trim().to_string()),
        );
        stacks.push((frames, count));
    }
    let total: u64 = stacks.iter().map(|l| l.1).sum();
    assert!(total >= 500, "only {total} samples in bcc output:\n{text}");
    assert_split_folded(&stacks, &split.truth());
    let main = folded_share_of(&stacks, "main");
    assert!(main >= 0.99, "main in {main:.3} of bcc samples");
}

/// Sums the samples and percentages inferno puts in the `<title>` of each rectangle named
/// `name`: `name (1,234 samples, 61.70%)`.
fn svg_titles(svg: &str, name: &str) -> (u64, f64) {
    let open = format!("<title>{name} (");
    svg.match_indices(&open)
        .map(|(i, _)| {
            let rest = &svg[i + open.len()..];
            let inner = &rest[..rest.find(")</title>").expect("closed title")];
            let (samples, pct) = inner
                .split_once(" samples, ")
                .unwrap_or_else(|| panic!("no samples and percentage in title {inner:?}"));
            let samples = samples.replace(',', "").parse::<u64>();
            let pct = pct.trim_end_matches('%').parse::<f64>();
            match (samples, pct) {
                (Ok(samples), Ok(pct)) => (samples, pct),
                _ => panic!("no samples and percentage in title {inner:?}"),
            }
        })
        .fold((0, 0.0), |(n, p), (ni, pi)| (n + ni, p + pi))
}

fn svg_percent(svg: &str, name: &str) -> f64 {
    svg_titles(svg, name).1
}

#[test]
fn svg_flamegraph_is_the_default_output() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let mut args = vec![os("record"), os("--")];
    args.extend(split.command());
    let run = stackscope(dir.path(), args);
    run.assert_ok();
    let svg = std::fs::read_to_string(dir.path().join("flame.svg"))
        .expect("flame.svg written in the working directory by default");
    assert!(svg.contains("<svg"), "not an SVG");
    assert!(svg.trim_end().ends_with("</svg>"), "SVG is cut short");
    let total = svg_titles(&svg, "all").0;
    split.truth().assert_matches(
        total,
        |name| svg_percent(&svg, name) / 100.0,
        || format!("flamegraph of {total} samples"),
    );
    let main = svg_percent(&svg, "main");
    assert!(main >= 99.0, "main is {main:.2}% of the flamegraph");
}

fn sorted_lines(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} not written: {e}", path.display()));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

#[test]
fn report_round_trips_json_and_folded() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let prog = workload("split_nofp");
    let split = Measured::new(d, "split_nofp", "4000");
    let (_, profile) = record_json(d, &[], &split.command());
    assert_min_samples(&profile, 500);

    // JSON -> folded must equal JSON -> JSON -> folded, and JSON -> JSON must be lossless.
    let json = d.join("profile.json");
    report(d, &json, &d.join("a.folded")).assert_ok();
    report(d, &json, &d.join("b.json")).assert_ok();
    report(d, &d.join("b.json"), &d.join("c.folded")).assert_ok();
    assert_eq!(
        sorted_lines(&d.join("a.folded")),
        sorted_lines(&d.join("c.folded"))
    );
    assert_eq!(
        read_json(&d.join("b.json")),
        profile,
        "JSON -> JSON changed the profile"
    );

    let folded = parse_folded(&std::fs::read_to_string(d.join("a.folded")).unwrap());
    assert_split_folded(&folded, &split.truth());

    // Folded as recorded -> report -> folded is unchanged.
    let recorded = d.join("rec.folded");
    record(d, &recorded, &[], &[prog.as_os_str()]).assert_ok();
    report(d, &recorded, &d.join("again.folded")).assert_ok();
    assert_eq!(
        sorted_lines(&recorded),
        sorted_lines(&d.join("again.folded"))
    );

    // And it renders, titled with the recorded command as `record` titles it, not the file.
    report(d, &json, &d.join("from_json.svg")).assert_ok();
    let svg = std::fs::read_to_string(d.join("from_json.svg")).unwrap();
    assert!(svg.contains("func_b"), "report SVG lacks func_b");
    let title = format!(">stackscope: {}<", split.command_line().join(" "));
    assert!(svg.contains(&title), "no title {title:?} in the SVG");
    // Folded stacks record no command: the file names the flamegraph.
    report(d, &recorded, &d.join("from_folded.svg")).assert_ok();
    let svg = std::fs::read_to_string(d.join("from_folded.svg")).unwrap();
    let title = format!(">stackscope: {}<", recorded.display());
    assert!(svg.contains(&title), "no title {title:?} in the SVG");
}
