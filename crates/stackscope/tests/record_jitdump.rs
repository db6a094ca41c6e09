//! JIT code named from a jitdump: Node's `--perf-prof` writes `jit-PID.dump` in its working
//! directory and maps it, and `record` names the JavaScript functions from it, with their
//! source lines, as `--perf-basic-prof`'s perf map names them.

#![cfg(target_os = "linux")]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use stackscope_profile::Profile;

/// A hot JavaScript function on lines 2 to 8, called for about 1.5 s of CPU time.
const SCRIPT: &str = "console.log(`pid ${process.pid}`);
function leafJs(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s += Math.sqrt(i) * i % 7;
  }
  return s;
}
const end = Date.now() + 1500;
let x = 0;
while (Date.now() < end) x += leafJs(100000);
if (x < 0) console.log(x);
";
const LEAF_LINES: std::ops::RangeInclusive<u32> = 2..=8;

/// Panics saying what to install when `node` cannot be run.
fn require_node() {
    let ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "node is needed: install the apt package nodejs (scripts/install-deps.sh installs it)"
    );
}

/// Profiles `node FLAG app.js` in `dir` with `options`; the profile and the node's pid.
fn record_node(dir: &Path, flag: &str, options: &[&str]) -> (Profile, u32) {
    let out = dir.join(format!("{}.json", flag.trim_start_matches('-')));
    let command = [os("node"), os(flag), os("app.js")];
    let run = record(dir, &out, options, &command);
    let pid = run.printed_pid("pid ");
    let _map = PerfMap(pid.map(|p| format!("/tmp/perf-{p}.map").into()));
    run.assert_ok();
    let pid = pid.unwrap_or_else(|| panic!("node printed no pid:\n{}", run.stdout));
    (read_json(&out), pid)
}

/// The names of JIT frames of `leafJs`, by samples, most sampled first.
fn leaf_names(profile: &Profile) -> Vec<(String, u64)> {
    let mut counts: Vec<(String, u64)> = Vec::new();
    for sample in &profile.samples {
        let leaf = profile
            .stack_frames(sample.stack)
            .rfind(|f| f.module.as_deref() == Some("[jit]") && f.name.contains("leafJs"));
        if let Some(frame) = leaf {
            match counts.iter_mut().find(|(name, _)| *name == frame.name) {
                Some((_, n)) => *n += sample.count,
                None => counts.push((frame.name.clone(), sample.count)),
            }
        }
    }
    counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    counts
}

#[test]
fn node_perf_prof_names_javascript_from_its_jitdump_as_its_perf_map_does() {
    require_node();
    let _serial = serial();
    let dir = tempdir();
    let script = dir.path().join("app.js");
    std::fs::write(&script, SCRIPT).unwrap();

    let (basic, _) = record_node(dir.path(), "--perf-basic-prof", &[]);
    let by_map = leaf_names(&basic);
    let Some((map_name, _)) = by_map.first() else {
        panic!("no leafJs from the perf map\n{}", top_stacks(&basic, 8));
    };

    for backend in ["bpf", "perf"] {
        let (profile, pid) = record_node(dir.path(), "--perf-prof", &["--backend", backend]);
        let dump = dir.path().join(format!("jit-{pid}.dump"));
        assert!(dump.exists(), "node wrote no {}", dump.display());
        // Found where node mapped it, not looked up in /tmp.
        assert!(!Path::new(&format!("/tmp/jit-{pid}.dump")).exists());
        let _ = std::fs::remove_file(&dump);

        let by_dump = leaf_names(&profile);
        let named: u64 = by_dump.iter().map(|(_, n)| n).sum();
        let total = profile.total_samples();
        assert_min_samples(&profile, 300);
        assert!(
            named as f64 >= 0.5 * total as f64,
            "{backend}: only {named} of {total} samples in leafJs\n{}",
            top_stacks(&profile, 8)
        );
        assert!(
            by_dump.iter().any(|(name, _)| name == map_name),
            "{backend}: the jitdump names leafJs {by_dump:?}, the perf map {by_map:?}"
        );

        // Where the dump has debug info for the code, the frame carries the script's line.
        // Node 20 writes stray bytes for the file name in some runs, which name no line, so
        // lines are checked where given rather than required.
        let script_path = script.to_string_lossy();
        for frame in profile.frames.iter().filter(|f| f.name.contains("leafJs")) {
            if let Some(line) = frame.line {
                assert_eq!(frame.file.as_deref(), Some(&*script_path), "{frame:?}");
                assert!(LEAF_LINES.contains(&line), "{backend}: {frame:?}");
            }
        }
    }
}
