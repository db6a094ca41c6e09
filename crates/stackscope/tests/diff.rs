//! `stackscope diff` on what vanished: the line it prints counts the stacks of before that
//! after lacks (which a flamegraph drawn from after cannot show) and names --negate, which
//! draws them; and its help says so before its options.

mod common;

use common::*;
use std::path::Path;

/// Writes before and after as folded stacks: `gone` is sampled before only.
fn inputs(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let before = dir.join("before.folded");
    let after = dir.join("after.folded");
    std::fs::write(
        &before,
        "prog;main;foo 5\nprog;main;bar 3\nprog;main;gone 4\n",
    )
    .unwrap();
    std::fs::write(&after, "prog;main;foo 2\nprog;main;bar 6\n").unwrap();
    (before, after)
}

fn diff(dir: &Path, before: &Path, after: &Path, out: &Path, options: &[&str]) -> Run {
    let mut args = vec![
        os("diff"),
        before.as_os_str(),
        after.as_os_str(),
        os("-o"),
        out.as_os_str(),
    ];
    args.extend(options.iter().map(|o| os(o)));
    let run = stackscope(dir, args);
    run.assert_ok();
    run
}

#[test]
fn a_diff_counts_what_vanished_and_negate_draws_it() {
    let dir = tempdir();
    let (before, after) = inputs(dir.path());

    let svg = dir.path().join("diff.svg");
    let run = diff(dir.path(), &before, &after, &svg, &[]);
    assert!(
        run.stderr.contains(
            "stackscope: 4 of before's 12 samples are in 1 stack after lacks (1 of their \
             functions are nowhere in after)"
        ),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--negate draws"), "{}", run.stderr);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains(">foo ("), "foo is drawn:\n{drawn}");
    assert!(
        !drawn.contains(">gone ("),
        "gone has no width in after:\n{drawn}"
    );

    let run = diff(dir.path(), &before, &after, &svg, &["--negate"]);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains(">gone ("), "--negate draws gone:\n{drawn}");
    // Drawn from before, nothing of after is left out here.
    assert!(
        run.stderr.contains("every stack of after is in before"),
        "{}",
        run.stderr
    );

    // The folded lines swap their counts, as inferno-flamegraph --negate takes them.
    let folded = dir.path().join("diff.folded");
    diff(
        dir.path(),
        &before,
        &after,
        &folded,
        &["--negate", "--no-normalize"],
    );
    let text = std::fs::read_to_string(&folded).unwrap();
    assert!(text.contains("prog;main;gone 0 4"), "{text}");
    assert!(text.contains("prog;main;foo 2 5"), "{text}");
}

#[test]
fn diff_help_says_what_vanished_and_negate_before_its_options() {
    let dir = tempdir();
    let run = stackscope(dir.path(), ["diff", "--help"]);
    run.assert_ok();
    let top = run
        .stdout
        .split("Usage:")
        .next()
        .expect("help text before its usage line");
    assert!(
        top.contains("--negate") && top.contains("vanished"),
        "{}",
        run.stdout
    );
}

/// A profile of bytes still held (`record --in-use`), saved as JSON: `grown` holds `held`
/// bytes, `steady` 1000.
fn held_json(path: &Path, held: u64) {
    use stackscope_profile::format::{write, Format, WriteOptions};
    use stackscope_profile::{CountUnit, Frame, Metadata, ProfileBuilder, Thread, IN_USE_EVENT};
    let mut b = ProfileBuilder::new(Metadata {
        event: IN_USE_EVENT.to_string(),
        count_unit: CountUnit::Bytes,
        ..Metadata::default()
    });
    let t = b.thread(Thread {
        comm: "prog".into(),
        ..Thread::default()
    });
    for (name, bytes) in [("grown", held), ("steady", 1000)] {
        let f = b.frame(Frame {
            name: name.into(),
            ..Frame::default()
        });
        let s = b.stack(&[f]);
        b.add_objects(t, s, None, bytes, 1);
    }
    let mut out = Vec::new();
    write(
        &b.finish(),
        Format::Json,
        &WriteOptions::default(),
        &mut out,
    )
    .unwrap();
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_diff_of_two_memory_profiles_counts_bytes_and_refuses_another_unit() {
    let dir = tempdir();
    let (before, after) = (dir.path().join("b.json"), dir.path().join("a.json"));
    held_json(&before, 1000);
    held_json(&after, 9000);
    let svg = dir.path().join("grew.svg");
    diff(dir.path(), &before, &after, &svg, &["--no-normalize"]);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("2000 bytes before, 10000 after"), "{drawn}");
    assert!(
        drawn.contains(">grown (9,000 bytes"),
        "grown is drawn in bytes:\n{drawn}"
    );

    let (samples, _) = inputs(dir.path());
    let run = stackscope(
        dir.path(),
        [
            os("diff"),
            samples.as_os_str(),
            after.as_os_str(),
            os("-o"),
            svg.as_os_str(),
        ],
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("counts samples") && run.stderr.contains("counts bytes"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}
