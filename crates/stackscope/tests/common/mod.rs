//! Shared by the whole-program tests: builds the workload programs in `tests/workloads/`
//! (once per test binary), runs the real `stackscope` binary on them with a deadline, runs
//! programs as another user (nobody), and reads and measures the profiles it writes.
#![allow(dead_code)]

use stackscope_profile::{Frame, FrameKind, Profile};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// No single stackscope run in these tests should take longer; a hang fails the test
/// instead of stalling the suite.
pub const DEADLINE: Duration = Duration::from_secs(90);

pub fn stackscope_bin() -> &'static str {
    env!("CARGO_BIN_EXE_stackscope")
}

pub fn workloads_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads")
}

/// How each workload is built: output name, compiler, arguments before `-o OUT`.
fn recipe(name: &str) -> (&'static str, Vec<&'static str>) {
    const CFLAGS: [&str; 2] = ["-O2", "-g"];
    let c = |src: &'static str, extra: &[&'static str]| {
        let mut args: Vec<&'static str> = CFLAGS.to_vec();
        args.extend_from_slice(extra);
        args.push(src);
        ("gcc", args)
    };
    // A Rust release build without frame pointers. debuginfo=1 (not line-tables-only): only
    // then do inlined subroutines carry their full path (`rust_deep::deep_helper_mix`) in DWARF.
    let rust = |src: &'static str| {
        let flags = [
            "-C",
            "opt-level=3",
            "-C",
            "debuginfo=1",
            "-C",
            "force-frame-pointers=no",
        ];
        ("rustc", flags.into_iter().chain([src]).collect())
    };
    match name {
        "split_fp" => c("split.c", &["-fno-omit-frame-pointer"]),
        "split_nofp" => c("split.c", &["-fomit-frame-pointer"]),
        // As a release build without debug info: named from its symbol table only.
        "split_nodebug" => ("gcc", vec!["-O2", "-fomit-frame-pointer", "split.c"]),
        "threads" => c("threads.c", &["-pthread"]),
        "libhot.so" => c("hot_lib.c", &["-shared", "-fPIC", "-fomit-frame-pointer"]),
        "dlopen_main" => {
            let (cc, mut args) = c("dlopen_main.c", &[]);
            args.push("-ldl");
            (cc, args)
        }
        "forker" => c("forker.c", &[]),
        "crasher" => c("crasher.c", &[]),
        "spin" => c("spin.c", &[]),
        "blocking" => c("blocking.c", &[]),
        "churn" => c("churn.c", &[]),
        "syscalls" => c("syscalls.c", &[]),
        "jit" => c("jit.c", &[]),
        "manystacks" => c("manystacks.c", &["-fomit-frame-pointer"]),
        "secret" => c("secret.c", &["-fomit-frame-pointer"]),
        "allocs" => c("allocs.c", &["-fomit-frame-pointer"]),
        "rust_deep" => rust("rust_deep.rs"),
        "rust_allocs" => rust("rust_allocs.rs"),
        // A package of its own (it takes tikv-jemallocator from the registry): see
        // build_package.
        "jemalloc_allocs" => ("cargo", vec![]),
        other => panic!("no workload named {other}"),
    }
}

/// Path of a built workload; builds it on first use in this test binary.
pub fn workload(name: &str) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("workloads");
    std::fs::create_dir_all(&dir).expect("create workload build dir");
    let out = dir.join(name);
    // Build under a private name and rename, so test binaries running at the same time
    // never execute a half-written file.
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    match recipe(name) {
        ("cargo", _) => build_package(name, &tmp),
        (compiler, args) => stackscope_testkit::run(
            Command::new(compiler)
                .current_dir(workloads_src())
                .args(&args)
                .arg("-o")
                .arg(&tmp),
        ),
    }
    std::fs::rename(&tmp, &out).expect("rename built workload");
    built.insert(name.to_string(), out.clone());
    out
}

/// Builds the workload that is the cargo package `tests/workloads/NAME` (binary NAME) into
/// `out`, in release, in one target directory kept between runs: only the first build
/// compiles its dependencies (jemalloc's C code takes minutes), later ones take a second.
fn build_package(name: &str, out: &Path) {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("workloads/cargo");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    stackscope_testkit::run(
        Command::new(cargo)
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(workloads_src().join(name).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target),
    );
    let built = target.join("release").join(name);
    std::fs::copy(&built, out).unwrap_or_else(|e| panic!("cannot copy {}: {e}", built.display()));
}

/// A finished stackscope run.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
    /// The process's peak resident memory, in KiB (its own, as `wait4` reports it).
    pub peak_kib: u64,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics with the full output unless stackscope exited 0.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "stackscope failed: {:?}\nstderr:\n{}",
            self.status,
            self.stderr
        );
        self
    }

    /// Panics with stderr unless stackscope exited with `code`, `why` saying where the code
    /// comes from.
    pub fn assert_exit(&self, code: i32, why: &str) {
        assert_eq!(
            self.code(),
            Some(code),
            "exit code ({why}); stderr:\n{}",
            self.stderr
        );
    }

    /// The pid the command printed on a stdout line `ROLE PID` (`role` with its trailing
    /// space); stackscope passes the command's stdout through.
    pub fn printed_pid(&self, role: &str) -> Option<u32> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(role)?.trim().parse().ok())
    }

    /// The non-empty lines stackscope wrote to stderr.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Asserts exit code 1 and a single `stackscope: error: ...` line on stderr containing
    /// each of `words`.
    pub fn assert_one_line_error(&self, words: &[&str]) {
        assert_eq!(self.code(), Some(1), "exit code; stderr:\n{}", self.stderr);
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "expected the error line alone on stderr (nothing announced before failing), got:\n{}",
            self.stderr
        );
        assert!(
            lines[0].starts_with("stackscope: error: "),
            "error line lacks the `stackscope: error: ` prefix: {}",
            lines[0]
        );
        for word in words {
            assert!(
                lines[0].contains(word),
                "error line does not mention {word:?}: {}",
                lines[0]
            );
        }
        assert!(
            !self.stderr.contains("panicked"),
            "stackscope panicked:\n{}",
            self.stderr
        );
    }
}

/// Runs stackscope with `args` in `cwd`, killing it after [`DEADLINE`].
pub fn stackscope<I, S>(cwd: &Path, args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(cwd).args(args);
    run_with_deadline(cmd)
}

/// The arguments `record -o OUT OPTIONS... [-- COMMAND...]`.
pub fn record_args<'a>(
    out: &'a Path,
    options: &[&'a str],
    command: &[&'a OsStr],
) -> Vec<&'a OsStr> {
    let mut args: Vec<&OsStr> = vec![OsStr::new("record"), OsStr::new("-o"), out.as_os_str()];
    args.extend(options.iter().map(|o| OsStr::new(*o)));
    if !command.is_empty() {
        args.push(OsStr::new("--"));
        args.extend_from_slice(command);
    }
    args
}

/// `stackscope record -o OUT OPTIONS... [-- COMMAND...]` in `dir`, not started yet.
pub fn record_command(dir: &Path, out: &Path, options: &[&str], command: &[&OsStr]) -> Command {
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir)
        .args(record_args(out, options, command));
    cmd
}

/// Runs `stackscope record -o OUT OPTIONS... [-- COMMAND...]` in `dir` to its end, however it
/// exits.
pub fn record(dir: &Path, out: &Path, options: &[&str], command: &[&OsStr]) -> Run {
    run_with_deadline(record_command(dir, out, options, command))
}

/// Records into `dir/name` (a format other than JSON), asserts that stackscope exited 0 and
/// returns the text it wrote.
pub fn record_text(dir: &Path, name: &str, options: &[&str], command: &[&OsStr]) -> String {
    let out = dir.join(name);
    record(dir, &out, options, command).assert_ok();
    std::fs::read_to_string(&out)
        .unwrap_or_else(|e| panic!("{} was not written: {e}", out.display()))
}

/// Starts `cmd` (stackscope) with stdout and stderr piped, for [`wait_output`].
pub fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stackscope")
}

pub fn run_with_deadline(mut cmd: Command) -> Run {
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    wait_output(child, start)
}

/// Waits for `child` (stdout/stderr piped) with [`DEADLINE`]; kills it and panics past it.
pub fn wait_output(mut child: Child, start: Instant) -> Run {
    use std::io::Read;
    let mut out_pipe = child.stdout.take().expect("stdout piped");
    let mut err_pipe = child.stderr.take().expect("stderr piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out_pipe.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err_pipe.read_to_end(&mut s);
        s
    });
    let (status, peak_kib) = loop {
        if let Some(ended) = reap(&mut child, false) {
            break ended;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = reap(&mut child, true);
            panic!("stackscope did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = start.elapsed();
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
    Run {
        status,
        stdout,
        stderr,
        wall,
        peak_kib,
    }
}

/// The exit status and peak resident memory (KiB) of `child` once it has ended; waits for the
/// end when `block`. `wait4` gives the child's own peak, which `Child::wait` does not.
#[cfg(unix)]
fn reap(child: &mut Child, block: bool) -> Option<(ExitStatus, u64)> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if block { 0 } else { libc::WNOHANG };
    // SAFETY: waits for our own child with valid pointers to locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, flags, &mut usage) };
    assert!(pid >= 0, "wait4: {}", std::io::Error::last_os_error());
    (pid != 0).then(|| {
        let peak = u64::try_from(usage.ru_maxrss).unwrap_or(0);
        (ExitStatus::from_raw(status), peak)
    })
}

/// Off Unix no peak is known: 0.
#[cfg(not(unix))]
fn reap(child: &mut Child, block: bool) -> Option<(ExitStatus, u64)> {
    let status = if block {
        child.wait().ok()
    } else {
        child.try_wait().ok().flatten()
    };
    status.map(|status| (status, 0))
}

/// Reads a stackscope JSON profile, checking the envelope the contract fixes.
pub fn read_json(path: &Path) -> Profile {
    let bytes = std::fs::read(path)
        .unwrap_or_else(|e| panic!("profile {} was not written: {e}", path.display()));
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    assert_eq!(value["format"], "stackscope", "JSON envelope `format`");
    assert_eq!(value["version"], 1, "JSON envelope `version`");
    assert!(
        value["profile"].is_object(),
        "JSON envelope has no `profile`"
    );
    stackscope_profile::format::read(&bytes)
        .unwrap_or_else(|e| panic!("{} does not read back: {e}", path.display()))
}

/// Records `command` into `dir/profile.json` with extra stackscope `options`; asserts that
/// stackscope exited 0.
pub fn record_json(dir: &Path, options: &[&str], command: &[&OsStr]) -> (Run, Profile) {
    let out = dir.join("profile.json");
    let run = record(dir, &out, options, command);
    run.assert_ok();
    let profile = read_json(&out);
    (run, profile)
}

/// A workload's account of itself, a line of `NAME NUMBER` pairs (`site_a 1000 site_b 2500`),
/// as (name, number) pairs.
pub fn account_pairs(line: &str) -> Vec<(String, u64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .chunks(2)
        .map(|w| {
            let number = w.get(1).and_then(|n| n.parse().ok());
            let number = number.unwrap_or_else(|| panic!("not `NAME NUMBER` pairs: {line:?}"));
            (w[0].to_string(), number)
        })
        .collect()
}

/// The number an account gives `what`.
pub fn said(account: &[(String, u64)], what: &str) -> u64 {
    account
        .iter()
        .find(|(w, _)| w == what)
        .unwrap_or_else(|| panic!("no {what} in {account:?}"))
        .1
}

/// The user frames of a stack, root first.
pub fn user_names<'a>(frames: &[&'a Frame]) -> Vec<&'a str> {
    frames
        .iter()
        .filter(|f| f.kind == FrameKind::User)
        .map(|f| f.name.as_str())
        .collect()
}

/// The sum of the counts (samples, hits, microseconds) of the stacks `pred` picks.
pub fn counts_where(profile: &Profile, pred: impl Fn(&[&Frame]) -> bool) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| pred(&profile.stack_frames(s.stack).collect::<Vec<_>>()))
        .map(|s| s.count)
        .sum()
}

/// Share of samples (by count) whose stack satisfies `pred`.
pub fn share(profile: &Profile, pred: impl Fn(&[&Frame]) -> bool) -> f64 {
    let total = profile.total_samples();
    if total == 0 {
        return 0.0;
    }
    let hit: u64 = profile
        .samples
        .iter()
        .filter(|s| pred(&profile.stack_frames(s.stack).collect::<Vec<_>>()))
        .map(|s| s.count)
        .sum();
    hit as f64 / total as f64
}

pub fn has_frame(frames: &[&Frame], name: &str) -> bool {
    frames.iter().any(|f| f.name == name)
}

/// Share of samples with a frame named exactly `name`.
pub fn share_of(profile: &Profile, name: &str) -> f64 {
    share(profile, |frames| has_frame(frames, name))
}

/// The most frequent stacks as folded lines, to explain a failed assertion.
pub fn top_stacks(profile: &Profile, n: usize) -> String {
    let mut counts: HashMap<String, u64> = HashMap::new();
    for s in &profile.samples {
        let thread = profile.thread(s.thread);
        let mut line = format!("[{}/{} {}]", thread.pid, thread.tid, thread.comm);
        for f in profile.stack_frames(s.stack) {
            line.push(';');
            line.push_str(&f.name);
            if f.inlined {
                line.push_str("(inl)");
            }
            if f.kind == FrameKind::Kernel {
                line.push_str("_[k]");
            }
        }
        *counts.entry(line).or_default() += s.count;
    }
    let mut lines: Vec<_> = counts.into_iter().collect();
    lines.sort_by_key(|l| std::cmp::Reverse(l.1));
    let mut text = format!(
        "{} samples, {} unique stacks, unwind {:?}, hints {:?}; top stacks:\n",
        profile.total_samples(),
        profile.stacks.len(),
        profile.meta.unwind,
        profile.meta.hints
    );
    for (line, count) in lines.into_iter().take(n) {
        let _ = writeln!(text, "  {count:6} {line}");
    }
    text
}

/// Asserts that the share of samples containing frame `name` is within `tolerance` of
/// `expected`.
pub fn assert_share(profile: &Profile, name: &str, expected: f64, tolerance: f64) {
    let got = share_of(profile, name);
    assert!(
        (got - expected).abs() <= tolerance,
        "share of samples in `{name}`: got {:.1}%, expected {:.1}% ± {:.1} points\n{}",
        got * 100.0,
        expected * 100.0,
        tolerance * 100.0,
        top_stacks(profile, 8)
    );
}

/// Asserts that at least `min` of the samples contain frame `name`.
pub fn assert_share_at_least(profile: &Profile, name: &str, min: f64) {
    let got = share_of(profile, name);
    assert!(
        got >= min,
        "share of samples in `{name}`: got {:.2}%, expected at least {:.2}%\n{}",
        got * 100.0,
        min * 100.0,
        top_stacks(profile, 8)
    );
}

pub fn assert_min_samples(profile: &Profile, min: u64) {
    assert!(
        profile.total_samples() >= min,
        "expected at least {min} samples\n{}",
        top_stacks(profile, 8)
    );
}

/// Asserts that the profile holds user stacks and that at least 99% of them unwound all the
/// way to their root.
pub fn assert_user_stacks_complete(profile: &Profile) {
    let unwind = &profile.meta.unwind;
    assert!(
        unwind.user_stacks > 0 && unwind.complete as f64 >= 0.99 * unwind.user_stacks as f64,
        "fewer than 99% of user stacks unwound completely: {unwind:?}"
    );
}

/// The profile's frame named exactly `name`; panics with the top stacks when there is none.
pub fn frame_named<'a>(profile: &'a Profile, name: &str) -> &'a Frame {
    profile
        .frames
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no frame named `{name}`\n{}", top_stacks(profile, 8)))
}

/// The frame named `name`, asserted to come from module `module` and to name a source file
/// ending in `file`: symbolization found the function's own debug info.
pub fn frame_with_source<'a>(
    profile: &'a Profile,
    name: &str,
    module: &str,
    file: &str,
) -> &'a Frame {
    let frame = frame_named(profile, name);
    assert_eq!(frame.module.as_deref(), Some(module), "{frame:?}");
    assert!(
        frame.file.as_deref().is_some_and(|f| f.ends_with(file)),
        "{name} has no source file ending in {file}: {frame:?}"
    );
    frame
}

/// Asserts that in at least `min` of the samples rust_deep's `#[inline(always)]` helper is a
/// frame of its own, marked inlined, just leafward of one of the leaves it is inlined into.
pub fn assert_inlined_helper_under_leaves(profile: &Profile, min: f64) {
    let inlined = share(profile, |frames| {
        frames.windows(2).any(|w| {
            w[0].name.starts_with("rust_deep::leaf_")
                && w[1].name == "rust_deep::deep_helper_mix"
                && w[1].inlined
        })
    });
    assert!(
        inlined >= min,
        "rust_deep::deep_helper_mix is an inlined frame under a leaf in only {:.1}% of samples\n{}",
        inlined * 100.0,
        top_stacks(profile, 5)
    );
}

/// One folded line: frames (including the leading `comm`) and count.
pub fn parse_folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
            let count: u64 = count
                .parse()
                .unwrap_or_else(|_| panic!("folded line with a bad count: {line:?}"));
            (stack.split(';').map(str::to_string).collect(), count)
        })
        .collect()
}

/// Share of folded samples whose frames satisfy `pred`.
pub fn folded_share(lines: &[(Vec<String>, u64)], pred: impl Fn(&[String]) -> bool) -> f64 {
    let total: u64 = lines.iter().map(|l| l.1).sum();
    let hit: u64 = lines.iter().filter(|l| pred(&l.0)).map(|l| l.1).sum();
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

/// Held for the whole of each test: the tests of one binary run one at a time, so sample
/// counts, attach windows and CPU 0's load do not depend on what the other tests are doing
/// on a small machine.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `found` every 20 ms until it answers, for at most 10 s; past that panics with
/// `what` (what never appeared).
pub fn wait_until<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes `/tmp/perf-PID.map` (whatever it is) when dropped: the JIT workload leaves it for
/// the profiler.
pub struct PerfMap(pub Option<PathBuf>);

impl Drop for PerfMap {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A temporary directory for one test's files.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("stackscope-test")
        .tempdir()
        .expect("create temp dir")
}

/// `program` to be run as user nobody: another user of the machine, who plants files or runs
/// programs where root's stackscope meets them.
pub fn as_nobody(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(program);
    cmd
}

/// Lets other users ([`as_nobody`]) reach `dir` and read what is in it (mode 755), as a
/// temporary directory (700) does not.
#[cfg(unix)]
pub fn open_to_others(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A workload process started directly (not by stackscope), killed when dropped.
pub struct Background(pub Child);

impl Background {
    pub fn spawn(cmd: &mut Command) -> Self {
        Background(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn workload"),
        )
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `stackscope profile ARGS...` in `dir`, run to its end.
pub fn profile(dir: &Path, args: &[&str]) -> Run {
    let mut all = vec!["profile"];
    all.extend_from_slice(args);
    stackscope(dir, &all)
}

/// Runs `perf record OPTIONS -o DIR/perf.data -- COMMAND` and returns the file's path.
///
/// Without perf's build-id cache (`-N`): perf aborts when another recording on the machine
/// writes the cache at the same moment. [`perf_record_caching`] keeps it.
pub fn perf_record(dir: &Path, options: &[&str], command: &[&OsStr]) -> PathBuf {
    let mut options = options.to_vec();
    if !options.contains(&"-N") {
        options.insert(0, "-N");
    }
    perf_record_caching(dir, &options, command)
}

/// [`perf_record`], with perf copying the binaries it saw into its build-id cache.
pub fn perf_record_caching(dir: &Path, options: &[&str], command: &[&OsStr]) -> PathBuf {
    let data = dir.join("perf.data");
    let mut cmd = Command::new("perf");
    cmd.current_dir(dir)
        .arg("record")
        .args(options)
        .arg("-o")
        .arg(&data)
        .arg("--")
        .args(command);
    let run = run_with_deadline(cmd);
    assert!(
        run.status.success(),
        "perf record failed: {:?}\n{}",
        run.status,
        run.stderr
    );
    data
}

/// `stackscope report INPUT -o OUTPUT` in `dir`, run to its end.
pub fn report(dir: &Path, input: &Path, output: &Path) -> Run {
    stackscope(
        dir,
        [
            os("report"),
            input.as_os_str(),
            os("-o"),
            output.as_os_str(),
        ],
    )
}

/// Starts the built workload `name` with `args`, on CPU `cpu` only when given (taskset), and
/// waits until it runs its own code with its libraries mapped, so a profiler attaching to it
/// sees the process it will sample.
pub fn start_workload(name: &str, args: &[&str], cpu: Option<u32>) -> Background {
    let prog = workload(name);
    let mut cmd = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(&prog);
            c
        }
        None => Command::new(&prog),
    };
    cmd.args(args);
    let child = Background::spawn(&mut cmd);
    let pid = child.pid();
    wait_until(
        &format!("{name} (pid {pid}) never mapped its libraries"),
        || {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
            (maps.contains(name) && maps.contains("libc")).then_some(())
        },
    );
    child
}

/// Share of folded samples with a frame named exactly `name`.
pub fn folded_share_of(lines: &[(Vec<String>, u64)], name: &str) -> f64 {
    folded_share(lines, |frames| frames[1..].iter().any(|f| f == name))
}

/// The most frequent folded lines, to explain a failed assertion.
pub fn top_folded(lines: &[(Vec<String>, u64)], n: usize) -> String {
    let mut sorted: Vec<&(Vec<String>, u64)> = lines.iter().collect();
    sorted.sort_by_key(|l| std::cmp::Reverse(l.1));
    let total: u64 = lines.iter().map(|l| l.1).sum();
    let mut text = format!("{total} samples in {} lines; top:\n", lines.len());
    for (frames, count) in sorted.into_iter().take(n) {
        let _ = writeln!(text, "  {count:6} {}", frames.join(";"));
    }
    text
}

pub use stackscope_testkit::truth::Truth;

/// A split workload (`split_nofp`, `split_fp`, `rust_deep`, `threads`) run as
/// `PROG ROUNDS TRUTH_FILE`: it writes the CPU time it measured in each hot function to
/// TRUTH_FILE, in `dir`.
pub struct Measured {
    pub prog: PathBuf,
    pub rounds: String,
    pub truth: PathBuf,
}

impl Measured {
    /// The built workload `name`; `rounds` as the workloads take it: 4000 is about 2 s of CPU.
    pub fn new(dir: &Path, name: &str, rounds: &str) -> Measured {
        Measured::of(workload(name), dir, rounds)
    }

    /// A split workload built elsewhere (`prog`).
    pub fn of(prog: PathBuf, dir: &Path, rounds: &str) -> Measured {
        let name = prog.file_name().expect("a program file").to_string_lossy();
        let truth = dir.join(format!("{name}.truth"));
        Measured {
            prog,
            rounds: rounds.to_string(),
            truth,
        }
    }

    /// The arguments after the program.
    pub fn args(&self) -> [&str; 2] {
        [&self.rounds, self.truth.to_str().expect("UTF-8 temp path")]
    }

    /// The whole command line.
    pub fn command(&self) -> Vec<&OsStr> {
        let mut command = vec![self.prog.as_os_str()];
        command.extend(self.args().map(OsStr::new));
        command
    }

    /// The whole command line as a profile's `meta.command` holds it.
    pub fn command_line(&self) -> Vec<String> {
        let mut line = vec![self.prog.display().to_string()];
        line.extend(self.args().map(str::to_string));
        line
    }

    /// What the workload wrote last.
    pub fn truth(&self) -> Truth {
        Truth::read(&self.truth)
    }

    /// What the workload wrote last, once it has written anything (it does as main starts).
    pub fn wait_truth(&self) -> Truth {
        wait_until(
            &format!("{} wrote no {}", self.prog.display(), self.truth.display()),
            || Truth::try_read(&self.truth),
        )
    }
}

/// How many times a test runs a split workload whose truth came out too loose to test against
/// ([`Truth::testable`]): on a loaded machine more of the measured time falls outside both hot
/// functions, which says nothing of the profiler.
pub const SPLIT_TRIES: u32 = 3;

/// Runs `attempt` (one run of a split workload, giving what the test needs and the workload's
/// truth) until the truth is testable, at most [`SPLIT_TRIES`] times, and returns the last.
/// A truth still too loose after that is the machine's load, not a failure: the caller checks
/// the split only when [`Truth::testable`].
pub fn until_testable<T>(mut attempt: impl FnMut() -> (T, Truth)) -> (T, Truth) {
    let mut tries = 1;
    loop {
        let (value, truth) = attempt();
        if truth.testable() || tries >= SPLIT_TRIES {
            if !truth.testable() {
                eprintln!(
                    "split not checked: {:.1}% of the measured time outside both functions in each of {tries} runs",
                    truth.outside() * 100.0
                );
            }
            return (value, truth);
        }
        eprintln!(
            "run {tries}: {:.1}% of the measured time outside both functions, too loose to test against: running the workload again",
            truth.outside() * 100.0
        );
        tries += 1;
    }
}

/// Asserts that each hot function's share of the profile's samples is the share of CPU time
/// the workload measured in it (see [`Truth::mismatch`] for the tolerance).
pub fn assert_split_profile(profile: &Profile, truth: &Truth) {
    truth.assert_matches(
        profile.total_samples(),
        |name| share_of(profile, name),
        || top_stacks(profile, 8),
    );
}

/// [`assert_split_profile`] on folded lines.
pub fn assert_split_folded(lines: &[(Vec<String>, u64)], truth: &Truth) {
    truth.assert_matches(
        lines.iter().map(|l| l.1).sum(),
        |name| folded_share_of(lines, name),
        || top_folded(lines, 8),
    );
}

/// The looks at a vCPU (or program) that had not run since the round before, which
/// `stackscope gdb`'s summary says were left out.
pub fn gdb_stale_looks(run: &Run) -> u64 {
    const LEFT_OUT: &str = " looks at a vCPU that had not run since the round before were left out";
    run.stderr
        .lines()
        .find_map(|line| {
            line.split("; ")
                .find_map(|part| part.strip_suffix(LEFT_OUT))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of looks left out:\n{}", run.stderr))
}

/// `command` as the program of a child of sh: sh forks a child that execs it and waits for it
/// (the `; true` keeps sh from exec'ing it itself), so it runs in a process the target started.
pub fn in_a_child_of_sh<'a>(command: &[&'a OsStr]) -> Vec<&'a OsStr> {
    let mut run = vec![os("sh"), os("-c"), os(r#""$0" "$@"; true"#)];
    run.extend_from_slice(command);
    run
}
