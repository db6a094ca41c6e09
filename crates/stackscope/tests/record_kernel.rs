//! User and kernel stacks on syscalls.c, which spends ~95% of its time inside read() of
//! /dev/zero (perf 6.1: kernel frames in 96% of samples, ksys_read in 93%, main in 100%):
//! both halves joined, `-U`, `-K`, and the folded delimiter and kernel annotation.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::{FrameKind, Profile};

#[test]
fn user_and_kernel_frames_join_into_one_stack() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("syscalls");
    let (_, profile) = record_json(dir.path(), &[], &[prog.as_os_str()]);

    assert_min_samples(&profile, 300);
    assert_share_at_least(&profile, "main", 0.99);
    assert_share_at_least(&profile, "kernel_work", 0.99);
    assert_share_at_least(&profile, "ksys_read", 0.80);
    let kernel = share(&profile, |f| f.iter().any(|x| x.kind == FrameKind::Kernel));
    assert!(
        kernel >= 0.85,
        "kernel frames in only {kernel:.3} of samples"
    );

    // Root first: user frames, then kernel frames, never a user frame below a kernel one.
    for stack in &profile.stacks {
        let kinds: Vec<FrameKind> = stack
            .frames
            .iter()
            .map(|&f| profile.frame(f).kind)
            .filter(|k| *k != FrameKind::Marker)
            .collect();
        let first_kernel = kinds.iter().position(|k| *k == FrameKind::Kernel);
        if let Some(i) = first_kernel {
            assert!(
                kinds[i..].iter().all(|k| *k == FrameKind::Kernel),
                "user frame leafward of a kernel frame: {:?}",
                stack
                    .frames
                    .iter()
                    .map(|&f| &profile.frame(f).name)
                    .collect::<Vec<_>>()
            );
        }
    }
    let ksys_read = frame_named(&profile, "ksys_read");
    assert_eq!(
        ksys_read.module.as_deref(),
        Some("[kernel.kallsyms]"),
        "{ksys_read:?}"
    );
}

/// Names of the profile's frames of `kind`.
fn names_of_kind(profile: &Profile, kind: FrameKind) -> Vec<&str> {
    profile
        .frames
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| f.name.as_str())
        .collect()
}

#[test]
fn user_stacks_only_has_no_kernel_frames() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("syscalls");
    let (_, profile) = record_json(dir.path(), &["-U"], &[prog.as_os_str()]);

    assert_min_samples(&profile, 300);
    let kernel = names_of_kind(&profile, FrameKind::Kernel);
    assert!(kernel.is_empty(), "kernel frames with -U: {kernel:?}");
    assert_share_at_least(&profile, "kernel_work", 0.99);
    assert_share_at_least(&profile, "main", 0.99);
}

#[test]
fn kernel_stacks_only_has_no_user_frames() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("syscalls");
    let (_, profile) = record_json(dir.path(), &["-K"], &[prog.as_os_str()]);

    assert_min_samples(&profile, 300);
    let user = names_of_kind(&profile, FrameKind::User);
    assert!(user.is_empty(), "user frames with -K: {user:?}");
    assert_share_at_least(&profile, "ksys_read", 0.80);
}

#[test]
fn folded_delimiter_and_kernel_annotation() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("syscalls");
    let text = record_text(
        dir.path(),
        "profile.folded",
        // The perf source starts at exec: the eBPF one also counts the launch's own samples
        // inside execve, whose user side is the old image's.
        &["--backend", "perf", "--delimited", "--annotate-kernel"],
        &[prog.as_os_str()],
    );
    let lines = parse_folded(&text);

    let delimited = folded_share(&lines, |f| f.iter().any(|x| x == "-"));
    assert!(
        delimited >= 0.85,
        "only {delimited:.3} of samples have a `-` delimiter:\n{text}"
    );
    for (frames, _) in &lines {
        let Some(i) = frames.iter().position(|x| x == "-") else {
            continue;
        };
        // The user side reaches `main`, or `_start` for a sample in `exit` after `main`
        // returned.
        assert!(
            frames[1..i].iter().all(|x| !x.ends_with("_[k]"))
                && frames[1..i].iter().any(|x| x == "main" || x == "_start"),
            "user side of a delimited line is wrong: {frames:?}"
        );
        assert!(
            i + 1 < frames.len() && frames[i + 1..].iter().all(|x| x.ends_with("_[k]")),
            "kernel side of a delimited line is not all `_[k]`: {frames:?}"
        );
    }
    let ksys = folded_share(&lines, |f| f.iter().any(|x| x == "ksys_read_[k]"));
    assert!(ksys >= 0.80, "ksys_read_[k] in only {ksys:.3} of samples");
}
