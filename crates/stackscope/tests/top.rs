//! `stackscope top` on split.c, whose func_a and func_b share the work about 30/70 and measure
//! the CPU time they really take: the plain-text snapshots parsed, and the full-screen view
//! driven in tmux (keys sent, the screen captured) for the hottest row and its self share,
//! sorting, the filter, expanding a row, pause, `w`, and the terminal given back after `q`,
//! Ctrl-C and the target's exit; the eBPF backend's counts drained each refresh, shown alike.

#![cfg(target_os = "linux")]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// One row of a table as `top` prints or draws it.
#[derive(Debug, Clone)]
struct Row {
    own_share: f64,
    total_share: f64,
    own: u64,
    name: String,
}

/// One table: the samples its shares are of, and its rows.
#[derive(Debug, Clone)]
struct Snapshot {
    total: u64,
    rows: Vec<Row>,
}

impl Snapshot {
    fn own_share_of(&self, name: &str) -> f64 {
        let own = self
            .rows
            .iter()
            .find(|r| r.name == name)
            .map_or(0, |r| r.own);
        own as f64 / self.total as f64
    }
}

/// A row line (`SELF%  TOTAL%  SAMPLES  [trend]  MODULE  FUNCTION`), else `None`.
fn row(line: &str) -> Option<Row> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let percent = |w: &str| w.strip_suffix('%')?.parse::<f64>().ok();
    if words.len() < 5 {
        return None;
    }
    Some(Row {
        own_share: percent(words[0])?,
        total_share: percent(words[1])?,
        own: words[2].parse().ok()?,
        name: words.last()?.to_string(),
    })
}

/// The samples a header line (`... top ...: N samples in ...`) counts.
fn header_total(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once(": ")?;
    rest.split(' ').next()?.parse().ok()
}

/// The snapshots of `--batch` output: a `# stackscope top` header, the column heads, rows.
fn snapshots(text: &str) -> Vec<Snapshot> {
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("# stackscope top at ") {
            let total = header_total(line).unwrap_or_else(|| panic!("header {line:?}"));
            found.push(Snapshot {
                total,
                rows: Vec::new(),
            });
        } else if let (Some(row), Some(snapshot)) = (row(line), found.last_mut()) {
            snapshot.rows.push(row);
        }
    }
    found
}

#[test]
fn batch_snapshots_give_the_split_workloads_hottest_function_and_its_self_share() {
    batch_split_shares(&["--backend", "perf"]);
}

#[test]
fn the_ebpf_backends_counts_drained_each_refresh_give_the_split_workloads_self_shares() {
    batch_split_shares(&["--backend", "bpf"]);
}

/// `top --batch` with `backend` on the split workload: the counts only grow, the hottest row
/// is func_b and the self shares are the workload's own, within the sample count's tolerance.
fn batch_split_shares(backend: &[&str]) {
    let _serial = serial();
    let dir = tempdir();
    let ((last, text), truth) = until_testable(|| {
        let split = Measured::new(dir.path(), "split_nofp", "3000");
        let mut args = vec!["top"];
        args.extend(backend);
        args.extend([
            "--batch",
            "1000",
            "--refresh",
            "0.5",
            "--cumulative",
            "--rows",
            "10",
            "--",
        ]);
        args.extend(split.command().iter().map(|a| a.to_str().unwrap()));
        let run = stackscope(dir.path(), &args);
        run.assert_ok();
        let all = snapshots(&run.stdout);
        assert!(all.len() >= 2, "fewer than 2 snapshots:\n{}", run.stdout);
        // The counts only grow: every snapshot is of everything since the start.
        assert!(
            all.windows(2).all(|w| w[0].total <= w[1].total),
            "{}",
            run.stdout
        );
        let last = all.last().unwrap().clone();
        ((last, run.stdout), split.truth())
    });
    assert_eq!(last.rows[0].name, "func_b", "the hottest row:\n{text}");
    assert!(last.total >= 500, "{} samples:\n{text}", last.total);
    // A row's self share is its samples out of the header's.
    let b = &last.rows[0];
    assert!((b.own_share - 100.0 * b.own as f64 / last.total as f64).abs() < 0.06);
    assert!(b.total_share >= b.own_share);
    truth.assert_matches(last.total, |name| last.own_share_of(name), || text.clone());
    assert!(
        truth
            .swapped()
            .mismatch(last.total, |name| last.own_share_of(name))
            .is_some(),
        "a swapped truth {truth:?} passes:\n{text}"
    );
    // Nothing is written without -o.
    let written: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".truth"))
        .collect();
    assert!(written.is_empty(), "top wrote {written:?} without -o");
}

#[test]
fn batch_prints_as_many_snapshots_as_asked_and_without_a_terminal_until_the_duration() {
    let _serial = serial();
    let dir = tempdir();
    let spin = start_workload("spin", &["20"], None);
    let pid = spin.pid().to_string();
    let run = stackscope(
        dir.path(),
        ["top", "-b", "2", "--refresh", "0.3", "-p", &pid],
    );
    run.assert_ok();
    let two = snapshots(&run.stdout);
    assert_eq!(two.len(), 2, "{}", run.stdout);
    assert_eq!(two[1].rows[0].name, "spin_work", "{}", run.stdout);
    // Standard output is a pipe here: snapshots, not the full-screen view.
    let run = stackscope(
        dir.path(),
        ["top", "--refresh", "0.3", "-d", "1.4", "-p", &pid],
    );
    run.assert_ok();
    let some = snapshots(&run.stdout);
    assert!((3..=6).contains(&some.len()), "{}", run.stdout);
    assert!(
        !run.stdout.contains('\x1b'),
        "escape sequences in piped output"
    );
}

/// A tmux server of the test's own, with one session running a shell command in a window
/// of a fixed size; killed when dropped.
struct Tmux {
    socket: String,
}

/// The shell prints this and the terminal's modes once `top` is gone.
const EXITED: &str = "TOP EXITED";

impl Tmux {
    fn start(dir: &Path, top_args: &str) -> Tmux {
        let ok = Command::new("tmux").arg("-V").output();
        assert!(
            ok.is_ok_and(|o| o.status.success()),
            "tmux is needed to drive the full-screen view: install the apt package tmux \
             (scripts/install-deps.sh test installs it)"
        );
        // A server of its own for each view: the last test's may still be shutting down.
        static VIEWS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let view = VIEWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("stackscope-top-{}-{view}", std::process::id());
        let shell = format!(
            "cd {} && {} top {top_args}; echo \"{EXITED} $?\"; stty -a | tr '\\n' ' '; echo; sleep 600",
            dir.display(),
            stackscope_bin()
        );
        let status = Command::new("tmux")
            .args(["-L", &socket, "new-session", "-d", "-x", "200", "-y", "50"])
            .arg(shell)
            .status()
            .expect("tmux runs");
        assert!(status.success(), "tmux new-session failed");
        Tmux { socket }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// The screen once `found` holds for it, waiting at most `within`.
    fn wait(&self, what: &str, within: Duration, found: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let screen = self.screen();
            if found(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}; the screen:\n{screen}\n{}",
                self.state()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What a failed wait reports beside the screen: whether the pane shows the alternate
    /// screen, and the state of each thread of the pane's processes (is `top` drawing, or
    /// stuck, and where).
    fn state(&self) -> String {
        let alternate = self.tmux(&["display", "-p", "#{alternate_on}"]);
        let mut said = format!("alternate screen: {}", alternate.trim());
        let shell = self.tmux(&["display", "-p", "#{pane_pid}"]);
        let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
        let mut pids: Vec<String> = vec![shell.trim().to_string()];
        while let Some(pid) = pids.pop() {
            for task in std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
            {
                let task = task.unwrap().path();
                let status = read(task.join("status").display().to_string());
                let field = |name: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .unwrap_or("")
                        .trim()
                        .to_string()
                };
                said += &format!(
                    "\n{pid}/{}: {} {} in {}",
                    task.file_name().unwrap().to_string_lossy(),
                    field("Name:"),
                    field("State:"),
                    read(task.join("wchan").display().to_string())
                );
                pids.extend(
                    read(task.join("children").display().to_string())
                        .split_whitespace()
                        .map(String::from),
                );
            }
        }
        said
    }

    /// Waits for `top` to end, and asserts the terminal is as it was: the normal screen, not
    /// the alternate one, in canonical mode with echo; returns top's exit code.
    fn assert_restored(&self) -> i32 {
        let screen = self.wait("top did not end", Duration::from_secs(10), |s| {
            s.contains(EXITED) && s.contains("icanon")
        });
        assert_eq!(self.tmux(&["display", "-p", "#{alternate_on}"]).trim(), "0");
        let modes = screen.lines().find(|l| l.contains("icanon")).unwrap();
        for mode in [" icanon", " echo ", " isig", " icrnl"] {
            assert!(modes.contains(mode), "{mode:?} is off after top: {modes}");
        }
        let code = screen
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{EXITED} ")));
        code.and_then(|c| c.trim().parse().ok()).unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.tmux(&["kill-server"]);
    }
}

/// The table on a captured screen: the header's total and the rows under the column heads.
fn screen_table(screen: &str) -> Snapshot {
    let total = screen
        .lines()
        .find(|l| l.starts_with("stackscope top, "))
        .and_then(header_total)
        .unwrap_or(0);
    let rows = screen
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Self%"))
        .skip(1)
        .filter_map(row)
        .collect();
    Snapshot { total, rows }
}

/// The rows' part of a screen, for comparing two captures.
fn rows_part(screen: &str) -> String {
    screen
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Self%"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_view_shows_the_hottest_function_first_and_its_keys_sort_filter_expand_pause_and_write() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "40000");
    let args = format!(
        "--refresh 0.5 --cumulative -o out.json -- {} {} {}",
        split.prog.display(),
        split.rounds,
        split.truth.display()
    );
    let tmux = Tmux::start(dir.path(), &args);
    let refresh = Duration::from_millis(500);
    // The first refresh with samples, then the hottest row within 3 refreshes.
    tmux.wait("no samples shown", Duration::from_secs(10), |s| {
        screen_table(s).total > 0
    });
    let screen = tmux.wait("func_b is not the top row", refresh * 3, |s| {
        screen_table(s)
            .rows
            .first()
            .is_some_and(|r| r.name == "func_b")
    });
    eprintln!("{screen}");

    // Paused, the table stays as it was; its self shares against the workload's own measure.
    tmux.keys(&["p"]);
    let paused = tmux.wait("not paused", Duration::from_secs(3), |s| {
        s.contains("PAUSED")
    });
    let truth = split.wait_truth();
    std::thread::sleep(refresh * 3);
    let still = tmux.screen();
    assert_eq!(
        rows_part(&paused),
        rows_part(&still),
        "the table moved while paused"
    );
    let table = screen_table(&paused);
    if truth.testable() {
        truth.assert_matches(
            table.total,
            |name| table.own_share_of(name),
            || paused.clone(),
        );
    }
    tmux.keys(&["p"]);
    tmux.wait("still paused", Duration::from_secs(3), |s| {
        !s.contains("PAUSED") && screen_table(s).total > table.total
    });

    // Sorted by total, the stack's root comes first, and every total share is below it.
    tmux.keys(&["s"]);
    let screen = tmux.wait("not sorted by total", Duration::from_secs(3), |s| {
        s.contains("sort total")
    });
    let rows = screen_table(&screen).rows;
    assert!(
        ENTRY_POINTS.contains(&rows[0].name.as_str()),
        "first by total: {screen}"
    );
    assert!(
        rows.windows(2)
            .all(|w| w[0].total_share >= w[1].total_share),
        "{screen}"
    );
    tmux.keys(&["s"]);

    // A filter leaves only the functions that match it.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "func_a"]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait("not filtered", Duration::from_secs(3), |s| {
        s.contains("filter \"func_a\"")
    });
    let rows = screen_table(&screen).rows;
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r.name == "func_a"),
        "{screen}"
    );
    tmux.keys(&["Escape"]);

    // Expanding the top row (func_b) shows who calls it.
    tmux.wait("filter still on", Duration::from_secs(3), |s| {
        !s.contains("filter \"")
            && screen_table(s)
                .rows
                .first()
                .is_some_and(|r| r.name == "func_b")
    });
    tmux.keys(&["Enter"]);
    tmux.wait("no callers shown", Duration::from_secs(3), |s| {
        s.contains("called from  main")
    });

    // `w` writes the profile so far through record's writers.
    tmux.keys(&["w"]);
    tmux.wait("not written", Duration::from_secs(5), |s| {
        s.contains("wrote out.json")
    });
    let profile = read_json(&dir.path().join("out.json"));
    assert!(
        share_of(&profile, "func_b") > 0.3,
        "{}",
        top_stacks(&profile, 5)
    );

    tmux.keys(&["q"]);
    // The launched program is ended as record ends it at a stop (SIGINT: 130).
    assert_eq!(tmux.assert_restored(), 130);
}

/// `top FLAGS -- split_nofp` in tmux (a run far longer than the test), once its table shows
/// samples; with top's arguments.
fn showing_split(dir: &Path, flags: &str) -> (Tmux, String) {
    let split = Measured::new(dir, "split_nofp", "40000");
    let args = format!(
        "{flags} -- {} {} {}",
        split.prog.display(),
        split.rounds,
        split.truth.display()
    );
    let tmux = Tmux::start(dir, &args);
    tmux.wait("no samples shown", Duration::from_secs(10), |s| {
        screen_table(s).total > 0
    });
    (tmux, args)
}

#[test]
fn the_terminal_is_restored_after_ctrl_c_and_after_the_target_exits() {
    let _serial = serial();
    let dir = tempdir();
    let (tmux, _) = showing_split(dir.path(), "--refresh 0.5 -o end.json");
    tmux.keys(&["C-c"]);
    tmux.assert_restored();
    // -o writes at the end, through record's summary.
    let profile = read_json(&dir.path().join("end.json"));
    assert!(
        share_of(&profile, "func_b") > 0.3,
        "{}",
        top_stacks(&profile, 5)
    );
    drop(tmux);

    let split = Measured::new(dir.path(), "split_nofp", "600");
    let args = format!(
        "--refresh 0.5 -- {} {} {}",
        split.prog.display(),
        split.rounds,
        split.truth.display()
    );
    let tmux = Tmux::start(dir.path(), &args);
    // The workload exits by itself after about 0.3 s of CPU; top ends with its exit code.
    assert_eq!(tmux.assert_restored(), 0);
}

#[test]
fn a_terminal_that_hangs_up_ends_top_and_the_profile_so_far_is_written() {
    let _serial = serial();
    let dir = tempdir();
    let (tmux, args) = showing_split(dir.path(), "--refresh 0.5 -o hup.json");
    // Killing the server closes the terminal under top, as closing a terminal window does.
    drop(tmux);
    let running = || {
        Command::new("pgrep")
            .args(["-f", &format!("top {args}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while running() {
        assert!(
            Instant::now() < deadline,
            "top still runs 20 s after its terminal hung up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let profile = read_json(&dir.path().join("hup.json"));
    assert!(
        share_of(&profile, "func_b") > 0.3,
        "{}",
        top_stacks(&profile, 5)
    );
}

#[test]
fn the_view_over_the_ebpf_backend_shows_the_hottest_function_first_and_writes_its_profile() {
    let _serial = serial();
    let dir = tempdir();
    let (tmux, _) = showing_split(dir.path(), "--backend bpf --refresh 0.5 -o bpf.json");
    let screen = tmux.wait(
        "func_b is not the top row",
        Duration::from_millis(1500),
        |s| {
            screen_table(s)
                .rows
                .first()
                .is_some_and(|r| r.name == "func_b")
        },
    );
    // Each refresh shows what was drained since: the counts grow.
    let before = screen_table(&screen).total;
    tmux.wait("the counts did not grow", Duration::from_secs(3), |s| {
        screen_table(s).total > before
    });
    tmux.keys(&["q"]);
    assert_eq!(tmux.assert_restored(), 130);
    let profile = read_json(&dir.path().join("bpf.json"));
    assert_eq!(profile.meta.source, "ebpf");
    assert!(
        share_of(&profile, "func_b") > 0.3,
        "{}",
        top_stacks(&profile, 5)
    );
}

#[test]
fn what_the_ebpf_backend_counts_until_the_end_is_refused_in_one_line() {
    let dir = tempdir();
    for flags in [
        &["--off-cpu", "-a"][..],
        &["--event", "tracepoint:syscalls:sys_enter_getpid", "-a"],
    ] {
        let mut args = vec!["top", "-b", "1"];
        args.extend(flags);
        let run = stackscope(dir.path(), &args);
        assert!(!run.status.success(), "{flags:?} ran");
        let said = run.stderr.trim();
        assert!(
            said.lines().count() == 1 && said.contains("use stackscope record"),
            "{flags:?}: {said}"
        );
    }
}

/// The functions every whole stack starts in.
const ENTRY_POINTS: &[&str] = &[
    "main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "_start",
];
