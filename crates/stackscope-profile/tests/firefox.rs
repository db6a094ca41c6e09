//! The Firefox Profiler writer: what we write is read back as the processed profile format
//! the profiler loads (meta, threads with their string, frame, func, stack and sample
//! tables), with one thread per profiled thread, our counts as sample weights, and the
//! function names.

mod fixture;

use serde_json::Value;
use stackscope_profile::format::{write, Format, WriteOptions};
use stackscope_profile::{Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread};
use std::collections::BTreeMap;

fn render(profile: &Profile) -> Value {
    let mut out = Vec::new();
    write(profile, Format::Firefox, &WriteOptions::default(), &mut out).unwrap();
    serde_json::from_slice(&out).expect("Firefox profile is JSON")
}

fn as_vec(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array: {v}"))
}

/// The string table of a thread (per thread in older versions of the format, shared in newer).
fn strings<'a>(profile: &'a Value, thread: &'a Value) -> &'a Vec<Value> {
    thread
        .get("stringArray")
        .or_else(|| profile["shared"].get("stringArray"))
        .map(as_vec)
        .expect("a string table")
}

/// Per thread name: total weight and the weight of each stack, as folded text root first.
fn decode(profile: &Value) -> BTreeMap<String, (i64, BTreeMap<String, i64>)> {
    let mut out = BTreeMap::new();
    for thread in as_vec(&profile["threads"]) {
        let strings = strings(profile, thread);
        let s = |i: &Value| strings[i.as_u64().unwrap() as usize].as_str().unwrap();
        let samples = &thread["samples"];
        let stacks = as_vec(&samples["stack"]);
        let weights: Vec<i64> = match samples.get("weight") {
            Some(Value::Array(w)) => w.iter().map(|x| x.as_i64().unwrap()).collect(),
            _ => vec![1; stacks.len()],
        };
        assert_eq!(samples["length"].as_u64(), Some(stacks.len() as u64));
        let stack_table = &thread["stackTable"];
        let frame_table = &thread["frameTable"];
        let func_table = &thread["funcTable"];
        let name_of_stack = |mut i: Option<u64>| {
            let mut names = Vec::new();
            while let Some(st) = i {
                let frame = stack_table["frame"][st as usize].as_u64().unwrap();
                let func = frame_table["func"][frame as usize].as_u64().unwrap();
                names.push(s(&func_table["name"][func as usize]).to_string());
                i = stack_table["prefix"][st as usize].as_u64();
            }
            names.reverse();
            names.join(";")
        };
        let mut by_stack: BTreeMap<String, i64> = BTreeMap::new();
        for (stack, weight) in stacks.iter().zip(&weights) {
            *by_stack.entry(name_of_stack(stack.as_u64())).or_default() += weight;
        }
        let name = thread["name"].as_str().unwrap().to_string();
        let total = weights.iter().sum();
        out.insert(name, (total, by_stack));
    }
    out
}

#[test]
fn threads_weights_and_names() {
    let p = fixture::profile();
    let fx = render(&p);
    // 1/99 s, in milliseconds.
    let interval = fx["meta"]["interval"].as_f64().unwrap();
    assert!((interval - 10.10101).abs() < 1e-6, "{interval}");
    let categories: Vec<&str> = as_vec(&fx["meta"]["categories"])
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(categories.contains(&"User") && categories.contains(&"Kernel"));
    let threads = decode(&fx);
    assert_eq!(threads.len(), 3, "{threads:?}");
    assert_eq!(threads["worker"].0, 7 + 5 + 4 + 1 + 2);
    assert_eq!(threads["worker-io"].0, 2 + 1 + 4);
    assert_eq!(threads["swapper/0"].0, 5);
    assert_eq!(
        threads["worker"].1["_start;__libc_start_main;main;compute;square"],
        12
    );
    assert_eq!(
        threads["worker"].1
            ["_start;__libc_start_main;main;read;entry_SYSCALL_64;__x64_sys_read;ksys_read"],
        4
    );
    assert_eq!(
        threads["swapper/0"].1["secondary_startup_64;cpu_startup_entry;do_idle;default_idle"],
        5
    );
    // Thread ids and processes: two threads of pid 4242 in one process, the idle task apart.
    let pids: Vec<&str> = as_vec(&fx["threads"])
        .iter()
        .map(|t| t["pid"].as_str().unwrap())
        .collect();
    assert_eq!(pids.iter().filter(|&&p| p == "4242").count(), 2, "{pids:?}");

    // Kernel frames carry the Kernel category.
    let kernel = categories.iter().position(|&c| c == "Kernel").unwrap() as u64;
    let thread = as_vec(&fx["threads"])
        .iter()
        .find(|t| t["name"] == "swapper/0")
        .unwrap();
    let cats = as_vec(&thread["frameTable"]["category"]);
    assert!(!cats.is_empty() && cats.iter().all(|c| c.as_u64() == Some(kernel)));
}

#[test]
fn odd_profiles() {
    let fx = render(&Profile::default());
    assert!(as_vec(&fx["threads"]).is_empty());

    let mut b = ProfileBuilder::new(Metadata::default());
    let t = b.thread(Thread::default());
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
    // More than an i32 weight holds.
    b.add(t, s, Some(1), 3 << 31);
    let threads = decode(&render(&b.finish()));
    // A thread without a name is shown as a frame without one is.
    let (total, stacks) = &threads["[unknown]"];
    assert_eq!(*total, 2 + (3 << 31));
    assert_eq!(stacks["kernel_only;[unknown]"], 3 << 31);
    assert_eq!(stacks[""], 2);
}
