//! The speedscope writer: golden output of the fixture profile, and validation of what we
//! write against speedscope's own file-format schema (from its npm package, fetched by
//! scripts/install-deps.sh) with Python's jsonschema.

mod fixture;

use serde_json::Value;
use stackscope_profile::format::{write, Format, WriteOptions};
use stackscope_profile::{Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread};
use std::path::PathBuf;
use std::process::Command;

fn render(profile: &Profile) -> String {
    let mut out = Vec::new();
    write(
        profile,
        Format::Speedscope,
        &WriteOptions::default(),
        &mut out,
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

/// Where scripts/install-deps.sh keeps the schema; `SPEEDSCOPE_SCHEMA` overrides it.
fn schema_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SPEEDSCOPE_SCHEMA") {
        return p.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    cache.join("stackscope/speedscope-file-format-schema.json")
}

/// Validates `json` against speedscope's schema; panics with the validator's message.
fn validate(json: &str) {
    let schema = schema_path();
    assert!(
        schema.is_file(),
        "speedscope's schema is missing at {}: run scripts/install-deps.sh",
        schema.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("profile.speedscope.json");
    std::fs::write(&file, json).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.validate(json.load(open(sys.argv[2])), schema)\n\
             print('valid')",
        ])
        .arg(&schema)
        .arg(&file)
        .output()
        .expect("run python3 (scripts/install-deps.sh installs jsonschema)");
    assert!(
        out.status.success() && out.stdout.starts_with(b"valid"),
        "speedscope schema rejects our output: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn speedscope_golden() {
    fixture::check_golden("profile.speedscope.json", &render(&fixture::profile()));
}

#[test]
fn one_sampled_profile_per_thread_with_weights_in_nanoseconds() {
    let p = fixture::profile();
    let v: Value = serde_json::from_str(&render(&p)).unwrap();
    let profiles = v["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 3);
    let frames = v["shared"]["frames"].as_array().unwrap();
    let period = 1_000_000_000 / 99;
    for (thread, prof) in p.threads.iter().zip(profiles) {
        assert_eq!(prof["type"], "sampled");
        assert_eq!(prof["unit"], "nanoseconds");
        assert!(prof["name"].as_str().unwrap().starts_with(&thread.comm));
        let samples = prof["samples"].as_array().unwrap();
        let weights = prof["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        let total: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
        assert_eq!(prof["endValue"].as_u64(), Some(total));
        let count: u64 = p
            .samples
            .iter()
            .filter(|s| p.thread(s.thread) == thread)
            .map(|s| s.count)
            .sum();
        assert_eq!(total, count * period, "{}", thread.comm);
    }
    // The worker's hot stack, root first: _start ... square.
    let names = |stack: &Value| -> Vec<String> {
        stack
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                frames[i.as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        names(&profiles[0]["samples"][0]),
        ["_start", "__libc_start_main", "main", "compute", "square"]
    );
    let square = frames.iter().find(|f| f["name"] == "square").unwrap();
    assert_eq!(square["file"], "worker.c");
    assert_eq!(square["line"], 9);
    // The busiest thread is shown first.
    assert_eq!(v["activeProfileIndex"], 0);
    validate(&render(&p));
}

#[test]
fn odd_profiles_are_valid() {
    validate(&render(&Profile::default()));

    let mut b = ProfileBuilder::new(Metadata::default());
    let t = b.thread(Thread::default());
    let idle = b.thread(Thread {
        comm: "never-sampled".to_string(),
        ..Thread::default()
    });
    let _ = idle;
    let empty = b.frame(Frame::default());
    let k = b.frame(Frame {
        name: "kernel_only".to_string(),
        kind: FrameKind::Kernel,
        ..Frame::default()
    });
    let s = b.stack(&[k, empty]);
    b.add(t, s, None, 0);
    let none = b.stack(&[]);
    b.add(t, none, None, 2);
    let text = render(&b.finish());
    let v: Value = serde_json::from_str(&text).unwrap();
    // No period: unit-less counts; the thread with no samples is left out.
    assert_eq!(v["profiles"].as_array().unwrap().len(), 1);
    assert_eq!(v["profiles"][0]["unit"], "none");
    assert_eq!(v["profiles"][0]["weights"], serde_json::json!([0, 2]));
    assert!(text.contains("\"[unknown]\""));
    validate(&text);
}
