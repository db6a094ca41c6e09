//! `stackscope record` on split.c, whose func_a and func_b share the work 30/70 (perf 6.1
//! measures 30.7/69.2 with DWARF unwinding, main in every stack; 30.2/69.8 with frame
//! pointers on the frame-pointer build, main in every stack): the split, whole stacks, every
//! output format and the report round trip.

mod common;

use common::*;

#[test]
fn dwarf_unwinding_without_frame_pointers_gives_the_split_and_whole_stacks() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("split_nofp");
    let (_, profile) = record_json(dir.path(), &["-F", "999"], &[prog.as_os_str()]);

    assert_min_samples(&profile, 500);
    assert_share(&profile, "func_a", 0.30, 0.03);
    assert_share(&profile, "func_b", 0.70, 0.03);
    assert_share_at_least(&profile, "main", 0.99);

    let meta = &profile.meta;
    assert_eq!(meta.frequency_hz, Some(999), "meta.frequency_hz");
    assert_eq!(meta.source, "perf_event", "meta.source");
    assert_eq!(
        meta.command,
        vec![prog.display().to_string()],
        "meta.command"
    );
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
    let prog = workload("split_fp");
    let (_, profile) = record_json(dir.path(), &["--unwind", "fp"], &[prog.as_os_str()]);

    assert_min_samples(&profile, 500);
    assert_share_at_least(&profile, "main", 0.99);
    assert_share(&profile, "func_b", 0.70, 0.03);
}

#[test]
fn folded_output_by_format_flag() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("split_nofp");
    let text = record_text(
        dir.path(),
        "profile.out",
        &["--format", "folded"],
        &[prog.as_os_str()],
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
    let func_b = folded_share(&lines, |f| f.iter().any(|x| x == "func_b"));
    assert!(
        (func_b - 0.70).abs() <= 0.03,
        "func_b share {func_b:.3} in folded output:\n{text}"
    );
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
    let prog = workload("split_nofp");
    let text = record_text(dir.path(), "profile.txt", &[], &[prog.as_os_str()]);

    // bcc profile's text: per stack, frames leaf first (4-space indent), then
    // `    -                comm (pid)`, then `        COUNT`, then a blank line.
    let (mut total, mut func_b, mut main) = (0u64, 0u64, 0u64);
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
        let frames: Vec<&str> = lines[..lines.len() - 2].iter().map(|l| l.trim()).collect();
        total += count;
        if frames.contains(&"func_b") {
            func_b += count;
        }
        if frames.contains(&"main") {
            main += count;
        }
    }
    assert!(total >= 500, "only {total} samples in bcc output:\n{text}");
    let share_b = func_b as f64 / total as f64;
    assert!(
        (share_b - 0.70).abs() <= 0.03,
        "func_b share {share_b:.3} in bcc output"
    );
    assert!(
        main as f64 >= 0.99 * total as f64,
        "main in {main} of {total} bcc samples"
    );
}

/// Sums the percentages inferno puts in the `<title>` of each rectangle named `name`.
fn svg_percent(svg: &str, name: &str) -> f64 {
    let open = format!("<title>{name} (");
    svg.match_indices(&open)
        .map(|(i, _)| {
            let rest = &svg[i + open.len()..];
            let inner = &rest[..rest.find(")</title>").expect("closed title")];
            let pct = inner.rsplit(", ").next().unwrap().trim_end_matches('%');
            pct.parse::<f64>()
                .unwrap_or_else(|_| panic!("no percentage in title {inner:?}"))
        })
        .sum()
}

#[test]
fn svg_flamegraph_is_the_default_output() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("split_nofp");
    let run = stackscope(dir.path(), [os("record"), os("--"), prog.as_os_str()]);
    run.assert_ok();
    let svg = std::fs::read_to_string(dir.path().join("flame.svg"))
        .expect("flame.svg written in the working directory by default");
    assert!(svg.contains("<svg"), "not an SVG");
    assert!(svg.trim_end().ends_with("</svg>"), "SVG is cut short");
    let func_b = svg_percent(&svg, "func_b");
    assert!(
        (func_b - 70.0).abs() <= 3.0,
        "func_b is {func_b:.2}% of the flamegraph"
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
    let (_, profile) = record_json(d, &[], &[prog.as_os_str()]);
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
    let func_b = folded_share(&folded, |f| f.iter().any(|x| x == "func_b"));
    assert!(
        (func_b - 0.70).abs() <= 0.03,
        "func_b share {func_b:.3} after report"
    );

    // Folded as recorded -> report -> folded is unchanged.
    let recorded = d.join("rec.folded");
    record(d, &recorded, &[], &[prog.as_os_str()]).assert_ok();
    report(d, &recorded, &d.join("again.folded")).assert_ok();
    assert_eq!(
        sorted_lines(&recorded),
        sorted_lines(&d.join("again.folded"))
    );

    // And it renders.
    report(d, &json, &d.join("from_json.svg")).assert_ok();
    let svg = std::fs::read_to_string(d.join("from_json.svg")).unwrap();
    assert!(svg.contains("func_b"), "report SVG lacks func_b");
}
