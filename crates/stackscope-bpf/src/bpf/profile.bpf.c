// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * stackscope's sampling program. Runs on the software cpu-clock perf event of every sampled CPU:
 * keeps the sample if its process or thread is wanted, takes the kernel stack into a stack-trace
 * map, unwinds the user stack here in the kernel (from the unwind tables user space loaded;
 * frame pointers while a process has none), and counts the (pid, tid, user stack, kernel stack,
 * comm) key. Only return addresses ever leave the kernel, never stack memory.
 *
 * The same counting runs at probes, and at the scheduler's switch for off-CPU time: a thread's
 * stacks are taken as it leaves the CPU, and the time until it comes back is added to them.
 *
 * Small tracepoint and uprobe programs follow the sampled processes: forks of followed processes
 * join the filter, and exec, library loads (at start-up and dlopen) and exits are reported
 * through a ring buffer so user space loads or drops their unwind tables.
 */
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "profile.h"

#if __has_include("unwind.bpf.h")
#include "unwind.bpf.h"
#define HAVE_UNWIND_TABLES 1
#else
#define HAVE_UNWIND_TABLES 0
#endif

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* The few kernel fields read here, relocated against the running kernel's BTF (CO-RE). */
struct mm_struct;
struct task_struct {
	int pid;
	int tgid;
	struct mm_struct *mm;
} __attribute__((preserve_access_index));

#define SIGSTOP 19

/* Task states (include/linux/sched.h) a thread leaves the CPU in that are not waiting of its
 * own: stopped by a signal, stopped by a tracer (stackscope holds a launched command so while
 * it loads tables), dying. */
#define TASK_STOPPED_BIT 0x0004
#define TASK_TRACED_BIT 0x0008
#define TASK_DEAD_BIT 0x0080

/* Set by the loader before the program is loaded. */
const volatile __u32 filter = FILTER_NONE;
const volatile bool include_idle = false;
const volatile bool want_user = true;
const volatile bool want_kernel = true;
/* The caller's pid namespace (dev and inode of /proc/self/ns/pid); 0 = do not translate. */
const volatile __u64 ns_dev = 0;
const volatile __u64 ns_ino = 0;
/* Stop a followed process at each library load until user space loaded its tables. */
const volatile bool hold_loads = false;
/* Frames kept per user stack, at most MAX_USER_FRAMES. */
const volatile __u32 max_frames = MAX_STACK_FRAMES;
/* The count key's event of off-CPU time (the switch programs run only when it is counted),
 * and the shortest block counted, in nanoseconds. */
const volatile __u32 off_cpu_event = 0;
const volatile __u64 min_block_ns = 0;

/* Set while the program runs: timer samples taken before this time (bpf_ktime_get_ns) are
 * not counted. While another source samples a launched command, it is the moment that source
 * hands over at, so every sample is counted by exactly one of them; 0 counts them all. */
volatile __u64 timer_from_ns = 0;

/* Sizes below are placeholders: the loader sets them from the command line. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, MAX_STACK_FRAMES * sizeof(__u64));
	__uint(max_entries, 16384);
} stack_traces SEC(".maps");

/* User stacks of up to MAX_STACK_FRAMES frames, as bcc keeps its stacks. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(key_size, sizeof(__s64));
	__uint(value_size, 8 + MAX_STACK_FRAMES * 8);
	__uint(max_entries, 16384);
} user_stacks SEC(".maps");

/* Deeper user stacks: values of max_frames frames (the loader sizes them), allocated as stored,
 * so the room they take grows with the deep stacks seen, not with the map's size. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(key_size, sizeof(__s64));
	__uint(value_size, sizeof(struct user_stack));
	__uint(max_entries, 16384);
} deep_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct count_key);
	__type(value, __u64);
	__uint(max_entries, 40960);
} counts SEC(".maps");

/* Pids (FILTER_PIDS) or tids (FILTER_TIDS) to sample, in the caller's pid namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} filter_ids SEC(".maps");

/* Processes whose exec, library loads and exit user space wants to hear of (caller's
 * namespace). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} filter_procs SEC(".maps");

/* Processes forked by followed processes, by global tgid (what the fork tracepoint sees). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 65536);
} followed SEC(".maps");

/* Wanted threads off the CPU, by global tid: since when, and the key their time goes to. An
 * entry goes when its thread comes back (a thread killed while it waits comes back to die), so
 * what is left at the end is the threads still off the CPU. A plain hash: an LRU one cost a
 * tenth more a switch. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct blocked);
	__uint(max_entries, 40960);
} blocked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct user_stack);
	__uint(max_entries, 1);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, DROP_COUNTERS);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* When each process last asked for its tables, so a process asks once a second at most. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4096);
} requested SEC(".maps");

/* Adds `n` to the drop counter `which`. */
static __always_inline void count_drops(__u32 which, __u64 n)
{
	__u64 *count = bpf_map_lookup_elem(&drops, &which);

	if (count)
		*count += n;
}

static __always_inline void count_drop(__u32 which)
{
	count_drops(which, 1);
}

static __always_inline void emit(__u32 kind, __u32 pid, __u32 ppid, __u32 held)
{
	struct event ev = { .kind = kind, .pid = pid, .ppid = ppid, .held = held };

	bpf_ringbuf_output(&events, &ev, sizeof(ev), 0);
}

/* The current task's pid and tid in the caller's namespace. False when the task is not in it. */
static __always_inline bool current_ids(__u32 *pid, __u32 *tid)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct bpf_pidns_info ns = {};

	*pid = id >> 32;
	*tid = (__u32)id;
	if (!ns_ino || *tid == 0)
		return true;
	if (bpf_get_ns_current_pid_tgid(ns_dev, ns_ino, &ns, sizeof(ns)))
		return false;
	*pid = ns.tgid;
	*tid = ns.pid;
	return true;
}

static __always_inline bool has_tables(__u32 pid)
{
#if HAVE_UNWIND_TABLES
	return bpf_map_lookup_elem(&unwind_procs, &pid) != NULL;
#else
	return false;
#endif
}

/* Whether user space wants to hear of this process's exec, library loads and exit. */
static __always_inline bool followed_process(__u32 pid, __u32 tgid)
{
	/* Across the system: processes with tables, and those that asked for them (a library
	 * mapped while user space reads their maps must not be missed). */
	if (filter == FILTER_NONE)
		return has_tables(pid) || bpf_map_lookup_elem(&requested, &pid);
	return bpf_map_lookup_elem(&filter_procs, &pid) || bpf_map_lookup_elem(&followed, &tgid);
}

static __always_inline void request_tables(__u32 pid)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 *last = bpf_map_lookup_elem(&requested, &pid);

	if (last && now - *last < 1000000000ULL)
		return;
	bpf_map_update_elem(&requested, &pid, &now, BPF_ANY);
	emit(EVENT_NO_TABLES, pid, 0, 0);
}

/* Word-wise FNV-1a: stacks differ in whole addresses, and a 62-bit key makes a collision
 * between two stacks of one run unlikely enough to ignore. A global function with a plain
 * bounded loop: checked once, and loadable by kernels without bpf_for (before 6.4). */
__noinline __s64 stack_hash(struct user_stack *st, __u32 len)
{
	__u64 h;
	int i;

	if (!st)
		return 0;
	h = 0xcbf29ce484222325ULL ^ st->end;
#pragma clang loop unroll(disable)
	for (i = 0; i < MAX_USER_FRAMES; i++) {
		if (i >= len)
			break;
		h ^= st->ips[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 29;
	/* Non-negative, and clear of DEEP_STACK_ID. */
	return (__s64)(h & (DEEP_STACK_ID - 1));
}

/* The user registers to unwind from: the hook's own when it stopped the task in user mode (a
 * cpu-clock sample taken there, a uprobe), else those saved at the task's kernel entry, read
 * field by field (the whole saved struct would not fit the program's stack on aarch64). */
static __always_inline void user_regs(struct pt_regs *regs, struct task_struct *task,
				      struct unwind_regs *out)
{
	struct pt_regs *saved;

	if (regs && REGS_USER(regs)) {
		out->ip = REGS_IP(regs);
		out->sp = REGS_SP(regs);
		out->bp = REGS_FP(regs);
#ifdef REGS_LR
		out->lr = REGS_LR(regs);
#endif
		return;
	}
	saved = (struct pt_regs *)bpf_task_pt_regs(task);
	bpf_probe_read_kernel(&out->ip, sizeof(out->ip), &REGS_IP(saved));
	bpf_probe_read_kernel(&out->sp, sizeof(out->sp), &REGS_SP(saved));
	bpf_probe_read_kernel(&out->bp, sizeof(out->bp), &REGS_FP(saved));
#ifdef REGS_LR
	bpf_probe_read_kernel(&out->lr, sizeof(out->lr), &REGS_LR(saved));
#endif
}

/* Unwinds the current task's user stack and stores it; returns its id or an error. `ctx` is
 * the program's context (for the kernel's frame-pointer walk), `regs` as for current_key. */
static __always_inline __s64 user_stack(void *ctx, struct pt_regs *regs, __u32 pid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 zero = 0;
	struct user_stack *st;
	__u32 end = USER_END_FRAME_POINTER;
	long n = 0;
	__s64 id;
	long err;

	if (!task->mm)
		return -EFAULT; /* a kernel thread */
	st = bpf_map_lookup_elem(&scratch, &zero);
	if (!st)
		return -EFAULT;
#if HAVE_UNWIND_TABLES
	{
		struct unwind_regs uregs = {};
		__u32 status = UNWIND_BROKEN;

		user_regs(regs, task, &uregs);
		n = unwind_user(&uregs, pid, st->ips, max_frames, &status);
		if (status == UNWIND_COMPLETE)
			end = USER_END_COMPLETE;
		else if (status == UNWIND_TRUNCATED)
			end = USER_END_TRUNCATED;
		else if (status == UNWIND_BROKEN)
			end = USER_END_BROKEN;
		else
			n = 0;
	}
#endif
	if (n <= 0) {
		/* No tables (yet): the kernel's frame-pointer walk, as bcc does. */
		if (HAVE_UNWIND_TABLES)
			request_tables(pid);
		n = bpf_get_stack(ctx, st->ips, MAX_STACK_FRAMES * sizeof(__u64), BPF_F_USER_STACK);
		if (n <= 0)
			return -EFAULT;
		n /= sizeof(__u64);
		end = USER_END_FRAME_POINTER;
	}
	if (n > max_frames)
		n = max_frames;
	st->len = n;
	st->end = end;
	id = stack_hash(st, n);
	if (n > MAX_STACK_FRAMES) {
		id |= DEEP_STACK_ID;
		err = bpf_map_update_elem(&deep_stacks, &id, st, BPF_NOEXIST);
	} else {
		err = bpf_map_update_elem(&user_stacks, &id, st, BPF_NOEXIST);
	}
	if (err && err != -EEXIST) {
		count_drop(DROP_USER_STACK_FULL);
		return -E2BIG;
	}
	return id;
}

/* Whether the current task's stacks are wanted; sets its ids in the caller's namespace. */
static __always_inline bool wanted_current(__u32 *pid, __u32 *tid)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!current_ids(pid, tid))
		return false;
	if (*tid == 0 && !include_idle)
		return false;
	if (filter == FILTER_PIDS)
		return bpf_map_lookup_elem(&filter_ids, pid) || bpf_map_lookup_elem(&followed, &tgid);
	if (filter == FILTER_TIDS)
		return bpf_map_lookup_elem(&filter_ids, tid) != NULL;
	return true;
}

/* Fills `key` with the current task's stacks under `event`, whatever hook runs it: the kernel
 * stack is taken from `ctx` (its innermost `kernel_skip` frames left out), the user stack
 * unwound from `regs` when they are user registers (NULL or kernel registers: those saved at
 * the task's kernel entry). False for tasks the filter leaves out. */
static __always_inline bool current_key(void *ctx, struct pt_regs *regs, __u32 event,
					__u32 kernel_skip, struct count_key *key)
{
	__u32 pid, tid;

	if (!wanted_current(&pid, &tid))
		return false;
	key->pid = pid;
	key->tid = tid;
	key->event = event;
	bpf_get_current_comm(&key->comm, sizeof(key->comm));
	key->kernel_stack_id = want_kernel ? bpf_get_stackid(ctx, &stack_traces,
							      kernel_skip & BPF_F_SKIP_FIELD_MASK)
					   : -EFAULT;
	key->user_stack_id = want_user && tid != 0 ? user_stack(ctx, regs, pid) : -EFAULT;
	return true;
}

/* Adds `weight` (a sample, a hit, nanoseconds off the CPU) to the count of `key`. */
static __always_inline void add_count(struct count_key *key, __u64 weight)
{
	__u64 *count;
	long err;

	count = bpf_map_lookup_elem(&counts, key);
	if (count) {
		__sync_fetch_and_add(count, weight);
		return;
	}
	err = bpf_map_update_elem(&counts, key, &weight, BPF_NOEXIST);
	if (err == -EEXIST) {
		/* Another CPU added the key meanwhile. */
		count = bpf_map_lookup_elem(&counts, key);
		if (count)
			__sync_fetch_and_add(count, weight);
	} else if (err) {
		count_drop(DROP_COUNT_MAP_FULL);
	}
}

/* Adds `weight` to the current task's stack under `event` (EVENT_INDEX_TIMER for the
 * cpu-clock samples); `ctx` and `regs` as for current_key. */
static __always_inline void count_current(void *ctx, struct pt_regs *regs, __u32 event,
					  __u64 weight)
{
	struct count_key key = {};

	if (current_key(ctx, regs, event, 0, &key))
		add_count(&key, weight);
}

SEC("perf_event")
int on_sample(struct bpf_perf_event_data *ctx)
{
	if (timer_from_ns && bpf_ktime_get_ns() < timer_from_ns)
		return 0;
	count_current(ctx, &ctx->regs, EVENT_INDEX_TIMER, 1);
	return 0;
}

/* The probes. Uprobes, uretprobes, USDT probes, kprobes and kretprobes all run this one
 * program; the loader gives each attachment its event index as the attach cookie. A uprobe
 * stops the task in user mode, so its registers are the user's; a uretprobe's are those just
 * after the return (its stack is the caller's); a kprobe's are the kernel's, so the user stack
 * is unwound from the registers saved at kernel entry. A USDT probe is a uprobe at the
 * probe's address (with its semaphore counted up while attached). */
SEC("kprobe")
int on_probe(struct pt_regs *ctx)
{
	count_current(ctx, ctx, bpf_get_attach_cookie(ctx), 1);
	return 0;
}

SEC("tracepoint")
int on_tracepoint(void *ctx)
{
	count_current(ctx, NULL, bpf_get_attach_cookie(ctx), 1);
	return 0;
}

/* Frames of the tracepoint's own call atop a stack taken at the switch: this program and
 * bpf_trace_run4, under __schedule. */
#define SWITCH_SKIP 2

/* Off-CPU time. The switch runs in the thread leaving the CPU: its stacks are taken then (its
 * user stack unwound from the registers saved at its kernel entry, as only the current task's
 * memory can be read), and the time until the thread is switched back in is added to them. */
static __always_inline void switch_threads(void *ctx, struct task_struct *next,
					   unsigned int prev_state)
{
	__u32 prev_tid = (__u32)bpf_get_current_pid_tgid();
	__u32 next_tid = BPF_CORE_READ(next, pid);
	__u64 now = bpf_ktime_get_ns();
	struct blocked *back;

	if (prev_tid && !(prev_state & (TASK_STOPPED_BIT | TASK_TRACED_BIT | TASK_DEAD_BIT))) {
		struct blocked out = { .since = now };

		if (current_key(ctx, NULL, off_cpu_event, SWITCH_SKIP, &out.key) &&
		    bpf_map_update_elem(&blocked, &prev_tid, &out, BPF_ANY))
			count_drop(DROP_COUNT_MAP_FULL);
	}
	back = bpf_map_lookup_elem(&blocked, &next_tid);
	if (!back)
		return;
	if (now - back->since >= min_block_ns)
		add_count(&back->key, now - back->since);
	bpf_map_delete_elem(&blocked, &next_tid);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	switch_threads(ctx, next, prev_state);
	return 0;
}

/* The same where the kernel's BTF lacks the tracepoint's type: the raw tracepoint passes the
 * same arguments, untyped (hence BPF_CORE_READ above). */
SEC("raw_tp/sched_switch")
int BPF_PROG(on_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	switch_threads(ctx, next, prev_state);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	__u32 pid, tid;
	__u8 yes = 1;

	if (filter != FILTER_PIDS || child->pid != ctgid)
		return 0; /* nothing to follow, or a new thread */
	/* The fork tracepoint runs in the parent. */
	if (!current_ids(&pid, &tid) || !followed_process(pid, ptgid))
		return 0;
	bpf_map_update_elem(&followed, &ctgid, &yes, BPF_ANY);
	emit(EVENT_FORK, ctgid, pid, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task)
{
	__u32 pid, tid;

	if (!current_ids(&pid, &tid) || !followed_process(pid, task->tgid))
		return 0;
	emit(EVENT_EXEC, pid, 0, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	__u32 pid, tid;

	if (task->pid != task->tgid)
		return 0; /* a thread, not the process */
	if (!current_ids(&pid, &tid) || !followed_process(pid, task->tgid))
		return 0;
	emit(EVENT_EXIT, pid, 0, 0);
	return 0;
}

/* The dynamic loader calls _dl_debug_state() (the debuggers' r_brk hook) once the libraries
 * of a program at start-up, or of a dlopen, are mapped and before any of their code runs.
 * A uprobe there costs nothing between loads, unlike tracing mmap through the syscall
 * tracepoints (they switch on syscall tracing, and its cost, for every task) or kprobes
 * (which kernels may lack). */
SEC("uprobe")
int on_loader_event(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u32 pid, tid;
	__u32 held = 0;

	if (!current_ids(&pid, &tid) || !followed_process(pid, tgid))
		return 0;
	/* The stop lands before the process runs its next user instruction; user space sends
	 * SIGCONT once the new libraries' tables are in. */
	if (hold_loads && bpf_send_signal(SIGSTOP) == 0)
		held = 1;
	emit(EVENT_LOADED, pid, 0, held);
	return 0;
}

#include "alloc.bpf.h"
