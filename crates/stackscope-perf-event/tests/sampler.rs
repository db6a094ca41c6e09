//! The perf_event sampler against real processes: a small C program compiled here is launched,
//! attached to, sampled thread-only and system-wide, and (when run as root) profiled again as
//! an unprivileged user.

#![cfg(target_os = "linux")]

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use stackscope_perf_event::sampler::{Event, Sampler, SamplerConfig, StackMode};
use stackscope_process::maps::Mapping;
use stackscope_process::target::Target;
use stackscope_process::SampleError;
use stackscope_stacks::arch::Regs;
use stackscope_testkit::compile;

const BUSY_C: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

/* Burns `seconds` of this thread's CPU time. */
__attribute__((noinline)) static void spin_for(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

/* Burns `seconds` of CPU time mostly inside the kernel, copying zeroes out of /dev/zero. */
__attribute__((noinline)) static void read_zeroes_for(double seconds) {
    static char buf[1 << 16];
    int fd = open("/dev/zero", O_RDONLY);
    struct timespec start, now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
        for (int i = 0; i < 16; i++) sink += read(fd, buf, sizeof buf);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    close(fd);
}

/* Runs the spin loop with 40 KB of stack in use below it. */
__attribute__((noinline)) static void deep(void) {
    volatile char pad[40000];
    /* Touch every page: the kernel copies stacks without faulting pages in. */
    for (int i = 0; i < (int)sizeof pad; i += 64) pad[i] = 1;
    spin_for(0.3);
    pad[1] = pad[0];
}

static void *worker(void *arg) {
    (void)arg;
    for (;;) spin_for(1.0);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "forever") == 0) {
        for (;;) spin_for(1.0);
    }
    if (strcmp(mode, "threads") == 0) {
        pthread_t t;
        pthread_create(&t, 0, worker, 0);
        for (;;) spin_for(1.0);
    }
    if (strcmp(mode, "deep") == 0) {
        deep();
        return 0;
    }
    if (strcmp(mode, "syscalls") == 0) {
        read_zeroes_for(0.3);
        return 0;
    }
    if (strcmp(mode, "fork") == 0) {
        /* The child outlives its parent. */
        if (fork() == 0) {
            spin_for(0.3);
            return 0;
        }
        return 0;
    }
    spin_for(0.3);
    return 3;
}
"#;

/// Compiles the busy program into a fresh directory that any user may read.
fn build_busy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = compile(
        "gcc",
        dir.path(),
        ("busy.c", BUSY_C),
        &["-O1", "-g", "-pthread"],
        &[],
        "busy",
    );
    (dir, exe)
}

fn config(stack_mode: StackMode) -> SamplerConfig {
    SamplerConfig {
        cpu: None,
        frequency: Some(999),
        period: None,
        user: true,
        kernel: true,
        stack_mode,
        include_idle: false,
        buffer_pages: 0,
    }
}

const DWARF: StackMode = StackMode::Dwarf { stack_bytes: 8192 };

#[derive(Debug, Clone)]
struct Sample {
    pid: u32,
    tid: u32,
    cpu: u32,
    time: u64,
    period: u64,
    /// Index of the `poll` call that delivered it.
    batch: usize,
    in_user: bool,
    regs: Option<Regs>,
    stack_len: usize,
    kernel_len: usize,
    user_chain: Vec<u64>,
}

#[derive(Debug, Default)]
struct Seen {
    samples: Vec<Sample>,
    mmaps: Vec<(u32, Mapping)>,
    comms: Vec<(u32, u32, String, bool)>,
    /// (pid, ppid, tid)
    forks: Vec<(u32, u32, u32)>,
    /// Position in the event stream of the first sample and of every Comm/Mmap.
    first_sample_at: Option<usize>,
    comm_or_mmap_at: Vec<(u32, usize)>,
    events: usize,
    batch: usize,
    lost: u64,
}

impl Seen {
    fn record(&mut self, event: Event<'_>) {
        let at = self.events;
        self.events += 1;
        match event {
            Event::Sample(s) => {
                self.first_sample_at.get_or_insert(at);
                self.samples.push(Sample {
                    pid: s.pid,
                    tid: s.tid,
                    cpu: s.cpu,
                    time: s.time,
                    period: s.period,
                    batch: self.batch,
                    in_user: s.in_user,
                    regs: s.user_regs,
                    stack_len: s.user_stack.len(),
                    kernel_len: s.kernel_stack.len(),
                    user_chain: s.user_callchain.to_vec(),
                });
            }
            Event::Mmap { pid, mapping, .. } => {
                self.comm_or_mmap_at.push((pid, at));
                self.mmaps.push((pid, mapping));
            }
            Event::Comm {
                pid,
                tid,
                comm,
                exec,
            } => {
                self.comm_or_mmap_at.push((pid, at));
                self.comms.push((pid, tid, comm.to_string(), exec));
            }
            Event::Fork { pid, ppid, tid, .. } => self.forks.push((pid, ppid, tid)),
            Event::Lost { count } => self.lost += count,
            Event::Exit { .. } => {}
        }
    }

    fn samples_of(&self, pid: u32) -> impl Iterator<Item = &Sample> {
        self.samples.iter().filter(move |s| s.pid == pid)
    }

    fn mapped(&self, pid: u32, pred: impl Fn(&str) -> bool) -> Option<&Mapping> {
        self.mmaps
            .iter()
            .find(|(p, m)| *p == pid && pred(&m.path))
            .map(|(_, m)| m)
    }
}

/// Polls until `done` says so (checked after every batch), then stops and drains. Gives up
/// after 30 s so a broken sampler fails instead of hanging.
fn run(sampler: &mut Sampler, mut done: impl FnMut(&mut Sampler, &Seen) -> bool) -> Seen {
    let mut seen = Seen::default();
    let mut finished = false;
    for _ in 0..300 {
        sampler
            .poll(Duration::from_millis(100), &mut |e| seen.record(e))
            .unwrap();
        seen.batch += 1;
        if done(sampler, &seen) {
            finished = true;
            break;
        }
    }
    sampler.stop();
    sampler
        .poll(Duration::ZERO, &mut |e| seen.record(e))
        .unwrap();
    assert!(
        finished,
        "gave up waiting; saw {} samples",
        seen.samples.len()
    );
    seen
}

fn launch(exe: &Path, args: &[&str], mode: StackMode) -> Sampler {
    let mut argv = vec![OsString::from(exe)];
    argv.extend(args.iter().map(OsString::from));
    let mut sampler = Sampler::open(&Target::Command(argv), &config(mode)).unwrap();
    sampler.start().unwrap();
    sampler
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_busy(exe: &Path, mode: &str) -> Running {
    Running(Command::new(exe).arg(mode).spawn().unwrap())
}

#[test]
fn launched_command_is_sampled_with_its_mappings_and_exit() {
    let (_dir, exe) = build_busy();
    let mut sampler = launch(&exe, &[], DWARF);
    let pid = sampler.child_pid().unwrap();
    let seen = run(&mut sampler, |s, _| s.target_finished());

    assert_eq!(sampler.exit_status().and_then(|s| s.code()), Some(3));
    let samples: Vec<&Sample> = seen.samples_of(pid).collect();
    assert!(samples.len() >= 50, "only {} samples", samples.len());
    assert!(seen.samples.iter().all(|s| s.pid == pid));

    let exe_path = exe.to_str().unwrap();
    let binary = seen
        .mapped(pid, |p| p == exe_path)
        .unwrap_or_else(|| panic!("no mmap of {exe_path}: {:?}", seen.mmaps));
    assert!(
        seen.mapped(pid, |p| p.contains("/libc.so") || p.contains("/libc-"))
            .is_some(),
        "no libc mmap: {:?}",
        seen.mmaps
    );
    // The kernel reports the GNU build-id of mapped files (Linux 5.12+); it must be the
    // binary's own.
    let data = std::fs::read(&exe).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let expected = object::Object::build_id(&elf)
        .unwrap()
        .expect("gcc adds a build-id");
    assert_eq!(binary.build_id.as_deref(), Some(expected));
    assert!(
        seen.comms
            .iter()
            .any(|(p, t, c, exec)| (*p, *t, c.as_str(), *exec) == (pid, pid, "busy", true)),
        "no exec comm: {:?}",
        seen.comms
    );

    // DWARF mode: user registers and stack bytes, and the loop runs in the binary itself.
    let user: Vec<&&Sample> = samples.iter().filter(|s| s.in_user).collect();
    assert!(!user.is_empty());
    assert!(user.iter().all(|s| s.regs.is_some() && s.stack_len > 0));
    assert!(samples.iter().all(|s| s.user_chain.is_empty()));
    let in_binary = user
        .iter()
        .filter(|s| binary.contains(s.regs.unwrap().pc))
        .count();
    assert!(
        in_binary * 2 > user.len(),
        "{in_binary} of {} user samples in the binary",
        user.len()
    );
}

#[test]
fn frame_pointer_mode_gives_user_callchains_without_stack_copies() {
    let (_dir, exe) = build_busy();
    let mut cfg = config(StackMode::FramePointer);
    cfg.frequency = None;
    cfg.period = Some(1_000_000);
    let mut sampler = Sampler::open(&Target::Command(vec![exe.clone().into()]), &cfg).unwrap();
    sampler.start().unwrap();
    let seen = run(&mut sampler, |s, _| s.target_finished());
    let user: Vec<&Sample> = seen.samples.iter().filter(|s| s.in_user).collect();
    assert!(user.len() >= 50, "only {} user samples", user.len());
    assert!(user
        .iter()
        .all(|s| !s.user_chain.is_empty() && s.regs.is_none() && s.stack_len == 0));
    assert!(user.iter().all(|s| s.kernel_len == 0));
}

#[test]
fn launched_command_is_followed_into_children_that_outlive_it() {
    let (_dir, exe) = build_busy();
    let mut sampler = launch(&exe, &["fork"], DWARF);
    let pid = sampler.child_pid().unwrap();
    let seen = run(&mut sampler, |s, _| s.target_finished());
    assert_eq!(sampler.exit_status().and_then(|s| s.code()), Some(0));
    let (grandchild, _, _) = *seen
        .forks
        .iter()
        .find(|(_, ppid, _)| *ppid == pid)
        .expect("fork record of the child");
    assert_ne!(grandchild, pid);
    assert!(
        seen.samples_of(grandchild).count() >= 50,
        "the grandchild was not sampled until it exited"
    );
    // target_finished waited for it: it is gone now.
    assert!(!Path::new(&format!("/proc/{grandchild}/exe")).exists());
}

#[test]
fn exec_failures_are_errors_naming_the_command() {
    let err = Sampler::open(
        &Target::Command(vec!["stackscope-no-such-command".into()]),
        &config(DWARF),
    )
    .err()
    .expect("unknown command is an error");
    assert_eq!(
        err.to_string(),
        "command not found: stackscope-no-such-command (check the name and PATH)"
    );

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    // A path that does not exist is refused before anything is opened or launched.
    let err = Sampler::open(
        &Target::Command(vec![missing.clone().into()]),
        &config(DWARF),
    )
    .err()
    .expect("a missing path is an error");
    assert!(
        matches!(&err, SampleError::CommandNotFound(c) if *c == missing.display().to_string()),
        "{err}"
    );

    let not_exec = dir.path().join("data.txt");
    std::fs::write(&not_exec, "just text\n").unwrap();
    let mut sampler = Sampler::open(
        &Target::Command(vec![not_exec.clone().into()]),
        &config(DWARF),
    )
    .unwrap();
    let err = sampler.start().unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "permission denied executing {}",
            not_exec.display()
        )),
        "{err}"
    );
    assert!(sampler.target_finished(), "failed child is reaped");
}

#[test]
fn attaching_to_a_running_process_synthesizes_its_state_first() {
    let (_dir, exe) = build_busy();
    let mut busy = spawn_busy(&exe, "forever");
    let pid = busy.0.id();
    let mut sampler = Sampler::open(&Target::Pids(vec![pid]), &config(DWARF)).unwrap();
    sampler.start().unwrap();
    let seen = run(&mut sampler, |_, seen| seen.samples_of(pid).count() >= 30);

    let exe_path = exe.to_str().unwrap();
    assert!(
        seen.mapped(pid, |p| p == exe_path).is_some(),
        "{:?}",
        seen.mmaps
    );
    assert!(seen.mapped(pid, |p| p.contains("libc")).is_some());
    assert!(seen
        .comms
        .iter()
        .any(|(p, t, c, exec)| (*p, *t, c.as_str(), *exec) == (pid, pid, "busy", false)));
    let first_sample = seen.first_sample_at.unwrap();
    assert!(seen
        .comm_or_mmap_at
        .iter()
        .filter(|(p, _)| *p == pid)
        .all(|(_, at)| *at < first_sample));
    assert!(seen.samples.iter().all(|s| s.pid == pid));

    assert!(!sampler.target_finished());
    busy.0.kill().unwrap();
    busy.0.wait().unwrap();
    assert!(sampler.target_finished());
}

#[test]
fn attaching_to_a_missing_pid_fails() {
    // Above the largest pid_max the kernel allows (2^22), so it never exists.
    let pid = 4_194_305 + 7;
    let err = Sampler::open(&Target::Pids(vec![pid]), &config(DWARF))
        .err()
        .expect("missing pid is an error");
    assert!(matches!(err, SampleError::NoSuchProcess(p) if p == pid));
    assert!(err
        .to_string()
        .starts_with(&format!("no process with pid {pid}")));
    let err = Sampler::open(&Target::Tids(vec![pid]), &config(DWARF))
        .err()
        .expect("missing tid is an error");
    assert!(matches!(err, SampleError::NoSuchThread(p) if p == pid));
}

#[test]
fn thread_target_samples_only_that_thread() {
    let (_dir, exe) = build_busy();
    let busy = spawn_busy(&exe, "threads");
    let pid = busy.0.id();
    // The worker thread appears shortly after start; it is the task that is not the main one.
    let mut worker = None;
    for _ in 0..200 {
        let tasks: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        worker = tasks.into_iter().find(|&t| t != pid);
        if worker.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let worker = worker.expect("worker thread started");
    let mut sampler = Sampler::open(&Target::Tids(vec![worker]), &config(DWARF)).unwrap();
    sampler.start().unwrap();
    let seen = run(&mut sampler, |_, seen| seen.samples.len() >= 30);
    assert!(
        seen.samples.iter().all(|s| (s.pid, s.tid) == (pid, worker)),
        "samples from other threads: {:?}",
        seen.samples
            .iter()
            .map(|s| (s.pid, s.tid))
            .filter(|&t| t != (pid, worker))
            .collect::<Vec<_>>()
    );
    assert!(seen
        .comms
        .iter()
        .any(|(p, t, _, _)| (*p, *t) == (pid, worker)));
    assert!(seen.comms.iter().all(|(_, t, _, _)| *t == worker));
}

#[test]
fn system_wide_on_one_cpu_sees_only_that_cpu() {
    let (_dir, exe) = build_busy();
    let mut cmd = Command::new(&exe);
    cmd.arg("forever");
    // SAFETY: sched_setaffinity is async-signal-safe; pins the busy process to CPU 0.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let busy = Running(cmd.spawn().unwrap());
    let pid = busy.0.id();
    let mut cfg = config(DWARF);
    cfg.cpu = Some(0);
    let mut sampler = Sampler::open(&Target::System, &cfg).unwrap();
    sampler.start().unwrap();
    let seen = run(&mut sampler, |_, seen| seen.samples_of(pid).count() >= 30);
    assert!(seen.samples.iter().all(|s| s.cpu == 0));
    assert!(seen.samples.iter().all(|s| s.pid != 0), "idle samples kept");
    assert!(seen
        .comms
        .iter()
        .any(|(p, _, c, _)| *p == std::process::id() && !c.is_empty()));
    assert!(seen.mapped(pid, |p| p == exe.to_str().unwrap()).is_some());
    assert!(!sampler.target_finished());
    drop(busy);
}

#[test]
fn invalid_cpu_and_settings_are_errors() {
    let mut cfg = config(DWARF);
    cfg.cpu = Some(4096);
    let err = Sampler::open(&Target::System, &cfg).err().unwrap();
    assert!(
        err.to_string().starts_with("CPU 4096 is not online"),
        "{err}"
    );
    let mut cfg = config(DWARF);
    cfg.period = Some(1000);
    let err = Sampler::open(&Target::System, &cfg).err().unwrap();
    assert!(matches!(err, SampleError::InvalidConfig(_)), "{err}");
    let mut cfg = config(DWARF);
    cfg.frequency = Some(u64::MAX / 2);
    let err = Sampler::open(&Target::System, &cfg).err().unwrap();
    assert!(
        err.to_string()
            .contains("kernel.perf_event_max_sample_rate"),
        "{err}"
    );
}

const UNPRIVILEGED_BUSY: &str = "STACKSCOPE_TEST_UNPRIVILEGED_BUSY";

fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// As root, reruns `unprivileged_checks` as user `nobody` through setpriv; as any other user,
/// runs the checks directly.
#[test]
fn unprivileged_user_gets_user_only_sampling_and_clear_errors() {
    let (_dir, exe) = build_busy();
    if euid() != 0 {
        check_unprivileged(&exe);
        return;
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "unprivileged_checks",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env(UNPRIVILEGED_BUSY, &exe)
        .output()
        .expect("setpriv runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "unprivileged run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run as an unprivileged user by unprivileged_user_gets_user_only_sampling_and_clear_errors"]
fn unprivileged_checks() {
    let exe = std::env::var_os(UNPRIVILEGED_BUSY).expect("busy program path in the environment");
    assert_ne!(euid(), 0, "must run unprivileged");
    check_unprivileged(Path::new(&exe));
}

fn check_unprivileged(exe: &Path) {
    let level = paranoid();
    let mut sampler = launch(exe, &[], DWARF);
    let pid = sampler.child_pid().unwrap();
    assert_eq!(sampler.kernel_excluded(), level >= 2);
    let seen = run(&mut sampler, |s, _| s.target_finished());
    assert!(seen.samples_of(pid).count() >= 50);
    if level >= 2 {
        assert!(seen.samples.iter().all(|s| s.in_user && s.kernel_len == 0));
    }

    if level > 0 {
        let err = Sampler::open(&Target::System, &config(DWARF))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("kernel.perf_event_paranoid")
                && msg.contains("CAP_PERFMON")
                && !msg.contains('\n'),
            "{msg}"
        );
        // pid 1 belongs to root.
        let err = Sampler::open(&Target::Pids(vec![1]), &config(DWARF))
            .err()
            .unwrap();
        assert!(matches!(err, SampleError::PermissionDenied { .. }), "{err}");
        assert!(err.to_string().contains("pid 1"), "{err}");
    }
}

/// A ring of a few pages wraps around every few samples: every record must still decode to a
/// sane sample, and each batch must come out in time order.
#[test]
fn small_ring_buffers_wrap_without_corrupting_records() {
    let (_dir, exe) = build_busy();
    let mut cfg = config(StackMode::Dwarf { stack_bytes: 3000 });
    cfg.buffer_pages = 3; // rounded up to 4
    let mut sampler = Sampler::open(&Target::Command(vec![exe.clone().into()]), &cfg).unwrap();
    assert_eq!(sampler.buffer_pages(), 4);
    sampler.start().unwrap();
    let pid = sampler.child_pid().unwrap();
    let seen = run(&mut sampler, |s, _| s.target_finished());
    assert!(
        seen.samples.len() >= 50,
        "{} samples, {} lost",
        seen.samples.len(),
        seen.lost
    );
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    let binary = seen.mapped(pid, |p| p == exe.to_str().unwrap()).unwrap();
    for s in &seen.samples {
        assert_eq!((s.pid, s.tid), (pid, pid));
        assert!(s.cpu < cpus && s.period > 0 && s.time > 0, "{s:?}");
        // 3000 rounded up to a multiple of 8.
        assert!(s.stack_len <= 3000usize.next_multiple_of(8), "{s:?}");
        if s.in_user {
            let regs = s.regs.expect("user registers");
            assert!(regs.sp != 0 && s.stack_len > 0, "{s:?}");
        }
    }
    assert!(seen
        .samples
        .iter()
        .filter(|s| s.in_user)
        .any(|s| binary.contains(s.regs.unwrap().pc)));
    for pair in seen.samples.windows(2) {
        if pair[0].batch == pair[1].batch {
            assert!(pair[0].time <= pair[1].time, "{pair:?}");
        }
    }
}

#[test]
fn kernel_samples_carry_kernel_stacks_and_user_registers() {
    let (_dir, exe) = build_busy();
    let mut sampler = launch(&exe, &["syscalls"], DWARF);
    assert!(!sampler.kernel_excluded(), "run as root for this test");
    let seen = run(&mut sampler, |s, _| s.target_finished());
    let kernel: Vec<&Sample> = seen.samples.iter().filter(|s| !s.in_user).collect();
    assert!(
        kernel.len() * 2 > seen.samples.len(),
        "{} of {} samples in the kernel",
        kernel.len(),
        seen.samples.len()
    );
    // In the kernel on behalf of the process: kernel frames, plus the user registers and
    // stack at the system call, which is what user unwinding starts from.
    assert!(kernel.iter().all(|s| s.kernel_len > 0));
    assert!(kernel.iter().all(|s| s.regs.is_some() && s.stack_len > 0));
}

#[test]
fn attaching_to_a_process_follows_all_its_threads() {
    let (_dir, exe) = build_busy();
    let busy = spawn_busy(&exe, "threads");
    let pid = busy.0.id();
    let mut sampler = Sampler::open(&Target::Pids(vec![pid]), &config(DWARF)).unwrap();
    sampler.start().unwrap();
    let seen = run(&mut sampler, |_, seen| {
        let tids: std::collections::HashSet<u32> = seen.samples_of(pid).map(|s| s.tid).collect();
        tids.len() >= 2 && seen.samples.len() >= 30
    });
    assert!(seen.samples.iter().all(|s| s.pid == pid));
    // Every sampled thread was announced: by a synthesized comm if it existed at start, by a
    // fork record if it started later.
    let known: std::collections::HashSet<u32> = seen
        .comms
        .iter()
        .filter(|(p, ..)| *p == pid)
        .map(|(_, t, ..)| *t)
        .chain(
            seen.forks
                .iter()
                .filter(|(p, ..)| *p == pid)
                .map(|(.., t)| *t),
        )
        .collect();
    assert!(
        seen.samples.iter().all(|s| known.contains(&s.tid)),
        "{known:?} {:?}",
        seen.comms
    );
}

#[test]
fn dropping_an_unstarted_sampler_reaps_the_held_child() {
    let (_dir, exe) = build_busy();
    let sampler = Sampler::open(&Target::Command(vec![exe.into()]), &config(DWARF)).unwrap();
    let pid = sampler.child_pid().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(sampler);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "child {pid} left behind"
    );
}

#[test]
fn oversized_stack_copies_are_clamped_and_zero_means_registers_only() {
    let (_dir, exe) = build_busy();
    for (asked, most) in [(100_000u32, 65528usize), (0, 0)] {
        let cfg = config(StackMode::Dwarf { stack_bytes: asked });
        let argv = vec![exe.clone().into(), "deep".into()];
        let mut sampler = Sampler::open(&Target::Command(argv), &cfg).unwrap();
        sampler.start().unwrap();
        let seen = run(&mut sampler, |s, _| s.target_finished());
        let user: Vec<&Sample> = seen.samples.iter().filter(|s| s.in_user).collect();
        assert!(
            user.len() >= 50,
            "asked {asked}: {} user samples",
            user.len()
        );
        assert!(user.iter().all(|s| s.regs.is_some() && s.stack_len <= most));
        if most > 0 {
            assert!(
                user.iter().any(|s| s.stack_len > 40000),
                "asked {asked}: max {:?}",
                user.iter().map(|s| s.stack_len).max()
            );
        }
    }
}
