//! The stack table through its one counting entry, as every source uses it: equal stacks add
//! up and different ones stay apart, tables folded one after another give what one table
//! gives, the fold names a real program's frames and keeps its threads, and the background
//! fold holds no more tables than it says.
#![cfg(target_os = "linux")]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use stackscope_profile::{FrameKind, Metadata, Profile, Thread};
use stackscope_stacks::table::{BackgroundFold, Folded, RawFrame, Sampled, StackTable};
use stackscope_stacks::walk::WalkEnd;
use stackscope_stacks::Mapping;
use stackscope_symbols::elf::ElfFile;
use stackscope_symbols::Symbolizer;

/// A program whose call chain `main` → `middle` → `leaf` the tests count stacks of.
const PROGRAM: &str = r#"
__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int middle(int x) { return leaf(x) + leaf(x + 1); }
__attribute__((noinline)) int other(int x) { return middle(x) - 2; }
int main(int argc, char **argv) { (void)argv; return other(argc) + middle(argc); }
"#;

/// Where the program is mapped in the pretend process.
const BASE: u64 = 0x5555_0000_0000;

/// The program built, mapped at [`BASE`] as a process maps it.
struct Program {
    _dir: tempfile::TempDir,
    path: PathBuf,
    elf: ElfFile,
    mapping: Mapping,
}

impl Program {
    fn build() -> Program {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = stackscope_testkit::compile(
            "cc",
            dir.path(),
            ("prog.c", PROGRAM),
            &["-O1", "-g"],
            &[],
            "prog",
        );
        let elf = ElfFile::open(&path).expect("the program is ELF");
        let len = std::fs::metadata(&path).expect("the program's size").len();
        let mapping = Mapping {
            start: BASE,
            end: BASE + len,
            offset: 0,
            path: path.to_str().expect("UTF-8 temp path").into(),
            build_id: elf.build_id().map(Arc::from),
        };
        Program {
            _dir: dir,
            path,
            elf,
            mapping,
        }
    }

    /// An address inside function `name`, as the process would have it.
    fn address_in(&self, name: &str) -> u64 {
        let vaddr = stackscope_testkit::shipped::function_address(&self.path, name);
        let offset = self
            .elf
            .segments()
            .iter()
            .find_map(|s| s.offset_of(vaddr))
            .expect("the function is in a loaded segment");
        BASE + offset + 1
    }

    /// The raw frames of a stack of the functions `names`, leaf first, in process `pid`.
    fn stack(&self, table: &mut StackTable, pid: u32, names: &[&str]) -> Vec<RawFrame> {
        names
            .iter()
            .map(|name| {
                let addr = self.address_in(name);
                table.user_frame(pid, addr, Some(&self.mapping))
            })
            .collect()
    }
}

fn sampled(pid: u32, tid: u32, cpu: u32) -> Sampled<'static> {
    Sampled {
        pid,
        tid,
        cpu,
        names: None,
    }
}

/// Names for threads counted without them, made up from their ids.
fn thread_by_ids(pid: u32, tid: u32) -> Thread {
    Thread {
        pid,
        tid,
        comm: format!("t{tid}"),
        process_name: format!("p{pid}"),
    }
}

fn meta() -> Metadata {
    Metadata {
        source: "test".into(),
        ..Metadata::default()
    }
}

/// Each sample as (who, frame names root first, cpu, count), sorted: what a profile says,
/// whatever order its ids came in.
fn content(p: &Profile) -> Vec<(String, Vec<String>, Option<u32>, u64)> {
    let mut counts: Vec<_> = p
        .samples
        .iter()
        .map(|s| {
            let t = p.thread(s.thread);
            let who = format!("{} {} {} {}", t.pid, t.tid, t.comm, t.process_name);
            let frames = p.stack_frames(s.stack).map(|f| f.name.clone()).collect();
            (who, frames, s.cpu, s.count)
        })
        .collect();
    counts.sort();
    counts
}

fn names(frames: &[&str]) -> Vec<String> {
    frames.iter().map(|f| f.to_string()).collect()
}

#[test]
fn equal_stacks_add_up_and_different_ones_stay_apart() {
    let program = Program::build();
    let mut table = StackTable::default();
    let deep = program.stack(&mut table, 7, &["leaf", "middle", "other", "main"]);
    let short = program.stack(&mut table, 7, &["leaf", "middle", "main"]);
    // One stack, counted one sample at a time and several at once.
    for _ in 0..3 {
        table.count(sampled(7, 7, 0), &deep, WalkEnd::Complete, 1);
    }
    table.count(sampled(7, 7, 0), &deep, WalkEnd::Complete, 4);
    // The same frames on another thread, on another CPU, and another stack: each its own.
    table.count(sampled(7, 8, 0), &deep, WalkEnd::Complete, 2);
    table.count(sampled(7, 7, 1), &deep, WalkEnd::Complete, 5);
    table.count(sampled(7, 7, 0), &short, WalkEnd::Complete, 6);

    let (profile, tally) = table.into_profile(&mut Symbolizer::new(), meta(), &thread_by_ids);
    let deep_names = names(&["main", "other", "middle", "leaf"]);
    assert_eq!(
        content(&profile),
        [
            (
                "7 7 t7 p7".into(),
                names(&["main", "middle", "leaf"]),
                Some(0),
                6
            ),
            ("7 7 t7 p7".into(), deep_names.clone(), Some(0), 3 + 4),
            ("7 7 t7 p7".into(), deep_names.clone(), Some(1), 5),
            ("7 8 t8 p7".into(), deep_names, Some(0), 2),
        ]
    );
    assert_eq!(tally.stats.user_stacks, 3 + 4 + 2 + 5 + 6);
    assert_eq!(tally.stats.complete, tally.stats.user_stacks);
}

#[test]
fn the_fold_names_a_programs_frames_and_keeps_the_names_a_source_counted_with() {
    let program = Program::build();
    let mut table = StackTable::default();
    let stack = program.stack(&mut table, 9, &["leaf", "middle", "main"]);
    let named = Sampled {
        names: Some(("worker", "server")),
        ..sampled(9, 10, 2)
    };
    table.count(named, &stack, WalkEnd::Complete, 3);
    // A process that exec'd is another program under another name: a thread of its own.
    let renamed = Sampled {
        names: Some(("worker", "server-2")),
        ..named
    };
    table.count(renamed, &stack, WalkEnd::Complete, 1);
    table.count(sampled(9, 11, 2), &stack, WalkEnd::Complete, 2);

    let (profile, _) = table.into_profile(&mut Symbolizer::new(), meta(), &thread_by_ids);
    let chain = names(&["main", "middle", "leaf"]);
    assert_eq!(
        content(&profile),
        [
            ("9 10 worker server".into(), chain.clone(), Some(2), 3),
            ("9 10 worker server-2".into(), chain.clone(), Some(2), 1),
            ("9 11 t11 p9".into(), chain, Some(2), 2),
        ]
    );
    let file_name = program.path.file_name().and_then(|n| n.to_str());
    for frame in &profile.frames {
        assert_eq!(frame.kind, FrameKind::User, "{frame:?}");
        assert_eq!(frame.module.as_deref(), file_name, "{frame:?}");
        // Built with debug info: each address is named down to its line.
        assert!(frame.line.is_some(), "{frame:?}");
    }
    let build_id = program.elf.build_id().expect("cc writes a build-id");
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        profile.meta.build_ids.get(file_name.expect("a file name")),
        Some(&hex)
    );
}

#[test]
fn stacks_that_share_their_callers_share_the_tables_memory_of_them() {
    let program = Program::build();
    let mut table = StackTable::default();
    let deep = program.stack(&mut table, 1, &["leaf", "middle", "other", "main"]);
    let caller = program.stack(&mut table, 1, &["middle", "other", "main"]);
    table.count(sampled(1, 1, 0), &deep, WalkEnd::Complete, 1);
    assert_eq!(table.nodes(), 4);
    // Its callers' stack, counted again, or the same stack: no frame is new.
    table.count(sampled(1, 1, 0), &caller, WalkEnd::Complete, 1);
    table.count(sampled(1, 2, 3), &deep, WalkEnd::Truncated, 9);
    assert_eq!(table.nodes(), 4);
    // Another leaf over the same callers is one frame more.
    let other_leaf = program.stack(&mut table, 1, &["main", "middle", "other", "main"]);
    table.count(sampled(1, 1, 0), &other_leaf, WalkEnd::Complete, 1);
    assert_eq!(table.nodes(), 5);
}

#[test]
fn folding_tables_as_they_fill_gives_the_profile_one_table_gives() {
    // Kernel addresses, all inside one function of at least 4 KiB.
    let f = stackscope_testkit::big_kernel_function();
    let k = [f, f + 64];
    let stacks: Vec<(u32, Vec<RawFrame>, WalkEnd)> = vec![
        (
            1,
            vec![RawFrame::Kernel(k[0]), RawFrame::Unmapped(0x1000)],
            WalkEnd::Complete,
        ),
        (
            1,
            vec![RawFrame::Kernel(k[0] + 4), RawFrame::Unmapped(0x1000)],
            WalkEnd::Complete,
        ),
        (
            2,
            vec![RawFrame::Kernel(k[1]), RawFrame::Truncated],
            WalkEnd::Truncated,
        ),
        (
            2,
            vec![RawFrame::Marker("[stack unreadable]")],
            WalkEnd::Unreadable,
        ),
        (
            3,
            vec![RawFrame::Unmapped(0x2000)],
            WalkEnd::Stopped {
                module: Some("/lib/x.so".into()),
                why: None,
            },
        ),
    ];
    let add = |table: &mut StackTable, round: u32| {
        for (i, (pid, frames, end)) in stacks.iter().enumerate() {
            let named = Sampled {
                names: Some(("c", "p")),
                ..sampled(*pid, *pid, round % 2)
            };
            for _ in 0..=i as u32 + round {
                table.count(named, frames, end.clone(), 1);
            }
            table.count(sampled(*pid, *pid + 1, 0), frames, end.clone(), 1);
        }
    };

    let mut symbolizer = Symbolizer::new();
    let mut whole = StackTable::default();
    let mut folded = Folded::default();
    for round in 0..3 {
        add(&mut whole, round);
        let mut part = StackTable::default();
        add(&mut part, round);
        part.fold_into(&mut symbolizer, &mut folded, &thread_by_ids);
    }
    let (one, one_tally) = whole.into_profile(&mut symbolizer, meta(), &thread_by_ids);
    let (parts, parts_tally) = folded.finish(meta());
    // Ids follow the order things were first met; what they stand for must not differ.
    assert_eq!(content(&one), content(&parts));
    assert_eq!(one.meta, parts.meta);
    assert_eq!(one_tally.stats, parts_tally.stats);
    assert_eq!(one_tally.broken_in, parts_tally.broken_in);
    // Per round r, stack i is sampled i + r + 1 times with names and once without.
    assert_eq!(one.total_samples(), 3 * 15 + 5 * 3 + 3 * 5);
    // Samples at two addresses of one kernel function are one stack.
    let kernel_names: HashSet<&str> = one
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Kernel)
        .map(|f| f.name.as_str())
        .collect();
    assert!(kernel_names.len() <= 2, "{kernel_names:?}");
    assert_eq!(one.meta.unwind.truncated, parts.meta.unwind.truncated);
}

#[test]
fn the_background_fold_holds_one_table_waiting_beside_the_one_it_folds() {
    let program = Program::build();
    // The fold asks for the names of threads counted without them: there it waits, while a
    // table is being folded, until the test lets it go on.
    let (started, folding) = mpsc::channel::<()>();
    let (go_on, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let fold = BackgroundFold::start(move |pid, tid| {
        let _ = started.send(());
        let _ = gate.lock().expect("the gate").recv();
        thread_by_ids(pid, tid)
    })
    .expect("a thread to fold on");
    let table_of = |tid: u32| {
        let mut table = StackTable::default();
        let stack = program.stack(&mut table, 5, &["leaf", "middle", "main"]);
        table.count(
            sampled(5, tid, 0),
            &stack,
            WalkEnd::Complete,
            u64::from(tid),
        );
        table
    };

    fold.fold(table_of(1));
    folding
        .recv_timeout(Duration::from_secs(60))
        .expect("the first table is being folded");
    // One table may wait while the first is folded: handing it over does not wait.
    fold.fold(table_of(2));
    // A third waits until the fold takes the second.
    let handed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            fold.fold(table_of(3));
            handed.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !handed.load(Ordering::SeqCst),
            "a third table was taken while one was folded and another waited"
        );
        for _ in 0..3 {
            go_on.send(()).expect("the fold waits at the gate");
        }
    });
    assert!(handed.load(Ordering::SeqCst));

    let (profile, _) = fold.finish().finish(meta());
    let chain = names(&["main", "middle", "leaf"]);
    assert_eq!(
        content(&profile),
        [
            ("5 1 t1 p5".into(), chain.clone(), Some(0), 1),
            ("5 2 t2 p5".into(), chain.clone(), Some(0), 2),
            ("5 3 t3 p5".into(), chain, Some(0), 3),
        ]
    );
}
