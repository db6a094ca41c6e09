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
