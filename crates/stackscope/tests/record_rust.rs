//! `stackscope record` on an optimised Rust program without frame pointers: 61 frames of
//! recursion, leaves splitting about 30/70 that measure the CPU time they take (the sampled
//! split is checked against that), and an `#[inline(always)]` helper that must show up as an
//! inlined, demangled frame.

#![cfg(target_os = "linux")]

mod common;

use common::*;

#[test]
fn deep_rust_stacks_with_inlined_demangled_frames() {
    let _serial = serial();
    let dir = tempdir();
    let deep = Measured::new(dir.path(), "rust_deep", "4000");
    let (_, profile) = record_json(dir.path(), &[], &deep.command());

    assert_min_samples(&profile, 500);
    assert_split_profile(&profile, &deep.truth());
    assert_share_at_least(&profile, "rust_deep::main", 0.99);

    // The recursion is 60 calls below the first descend: 61 frames, none lost or invented.
    let full_depth = share(&profile, |frames| {
        frames
            .iter()
            .filter(|f| f.name == "rust_deep::descend")
            .count()
            == 61
    });
    assert!(
        full_depth >= 0.99,
        "only {:.1}% of samples hold all 61 descend frames\n{}",
        full_depth * 100.0,
        top_stacks(&profile, 3)
    );

    // The helper is inlined into both leaves: a frame of its own, marked inlined, just
    // leafward of its leaf.
    assert_inlined_helper_under_leaves(&profile, 0.95);
    let helper = frame_named(&profile, "rust_deep::deep_helper_mix");
    assert_eq!(helper.module.as_deref(), Some("rust_deep"), "{helper:?}");

    // Names are demangled, without the legacy hash suffix.
    let mangled: Vec<&str> = profile
        .frames
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| looks_mangled(n))
        .collect();
    assert!(mangled.is_empty(), "mangled names: {mangled:?}");
}

fn looks_mangled(name: &str) -> bool {
    let legacy_hash = name
        .split("::h")
        .skip(1)
        .any(|rest| rest.len() >= 16 && rest[..16].chars().all(|c| c.is_ascii_hexdigit()));
    name.starts_with("_ZN") || name.starts_with("_R") || legacy_hash
}
