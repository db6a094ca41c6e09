//! The Asterinas OSDK's profile JSON: reading it (one thread per vCPU, as `stackscope gdb`
//! makes them), writing it (one round per sample), golden files and round trips.

mod fixture;

use fixture::{check_golden, golden_path};
use stackscope_profile::format::{read, write, Format, ReadError, WriteOptions};
use stackscope_profile::Profile;

fn render(profile: &Profile) -> String {
    let mut out = Vec::new();
    write(profile, Format::Osdk, &WriteOptions::default(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn rounds() -> Profile {
    read(&std::fs::read(golden_path("osdk-rounds.json")).unwrap()).unwrap()
}

/// (comm, folded stack root first, count) of every sample, sorted.
fn folded(p: &Profile) -> Vec<(String, String, Option<u32>, u64)> {
    let mut out: Vec<_> = p
        .samples
        .iter()
        .map(|s| {
            let names: Vec<&str> = p.stack_frames(s.stack).map(|f| f.name.as_str()).collect();
            (
                p.thread(s.thread).comm.clone(),
                names.join(";"),
                s.cpu,
                s.count,
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn reads_one_thread_per_cpu() {
    let p = rounds();
    assert_eq!(p.meta.source, "osdk");
    let threads: Vec<_> = p
        .threads
        .iter()
        .map(|t| (t.pid, t.tid, t.comm.as_str(), t.process_name.as_str()))
        .collect();
    assert_eq!(threads, [(1, 0, "cpu0", "guest"), (1, 1, "cpu1", "guest")]);
    let s = |comm: &str, stack: &str, cpu: u32, n: u64| {
        (comm.to_string(), stack.to_string(), Some(cpu), n)
    };
    assert_eq!(
        folded(&p),
        [
            s("cpu0", "_start;kmain;work_loop;spin_a", 0, 3),
            s("cpu0", "_start;kmain;work_loop;spin_b", 0, 1),
            s("cpu1", "", 1, 1),
            s("cpu1", "_start;kmain;work_loop;spin_b", 1, 2),
        ]
    );
}

#[test]
fn a_cpu_named_twice_in_one_round_keeps_both_stacks() {
    let p = read(br#"{"stack_traces":[{"0":["a","main"],"1":["c","main"],"0":["b","main"]}]}"#)
        .unwrap();
    let s = |comm: &str, stack: &str, cpu: u32| (comm.to_string(), stack.to_string(), Some(cpu), 1);
    assert_eq!(
        folded(&p),
        [
            s("cpu0", "main;a", 0),
            s("cpu0", "main;b", 0),
            s("cpu1", "main;c", 1)
        ]
    );
}

#[test]
fn osdk_golden() {
    check_golden("profile.osdk.json", &render(&fixture::profile()));
    check_golden("osdk-rounds.out.json", &render(&rounds()));
}

#[test]
fn round_trips() {
    // Profile -> OSDK -> Profile keeps every CPU's stacks and counts.
    let p = rounds();
    let text = render(&p);
    let back = read(text.as_bytes()).unwrap();
    assert_eq!(folded(&back), folded(&p));
    assert_eq!(back.threads, p.threads);
    // Written again, the rounds come out the same.
    assert_eq!(render(&back), text);
    // A sample of count n takes n rounds: the fixture's 31 samples, 17 on the busiest CPU.
    let fixture_text = render(&fixture::profile());
    let again = read(fixture_text.as_bytes()).unwrap();
    assert_eq!(again.total_samples(), 31);
    let v: serde_json::Value = serde_json::from_str(&fixture_text).unwrap();
    let rounds = v["stack_traces"].as_array().unwrap();
    let per_cpu = |cpu: &str| rounds.iter().filter(|r| r.get(cpu).is_some()).count();
    // CPU 0: 7 + 2 + 1 + 5 + 1 (the sample with no CPU); CPU 1: 5 + 4 + 2 + 4.
    assert_eq!((per_cpu("0"), per_cpu("1")), (16, 15));
    assert_eq!(rounds.len(), 16);
    // Leaf first.
    assert_eq!(
        rounds[0]["0"],
        serde_json::json!(["square", "compute", "main", "__libc_start_main", "_start"])
    );
}

#[test]
fn empty_and_bad_input() {
    let p = read(br#" { "stack_traces" : [] }"#).unwrap();
    assert!(p.samples.is_empty());
    assert_eq!(render(&Profile::default()), "{\"stack_traces\":[\n]}\n");
    assert!(read(render(&Profile::default()).as_bytes()).is_ok());

    let err = |text: &str| -> String {
        let e: ReadError = read(text.as_bytes()).unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with("OSDK profile JSON, "), "{msg}");
        msg
    };
    let m = err(r#"{"stack_traces":[{"0":["a"]},{"x1":["b"]}]}"#);
    assert!(m.contains("stack_traces[1]") && m.contains("\"x1\""), "{m}");
    let m = err(r#"{"stack_traces":[{"0":"a"}]}"#);
    assert!(m.contains("line 1"), "{m}");
    err(r#"{"stack_traces":[{"0":["a"]"#);
    err(r#"{"stack_traces":{}}"#);
}
