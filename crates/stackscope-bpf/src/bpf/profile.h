/* Types shared by the BPF program and its loader (mirrored in src/layout.rs). */
#ifndef STACKSCOPE_PROFILE_H
#define STACKSCOPE_PROFILE_H

/* Frames kept per kernel stack, and per user stack in user_stacks: perf's default
 * kernel.perf_event_max_stack. Deeper user stacks go to deep_stacks. */
#define MAX_STACK_FRAMES 127
/* The most frames a user stack may have (the loader's max_frames is at most this): the
 * middle's MAX_FRAMES. */
#define MAX_USER_FRAMES 1024
/* Set in a user stack id kept in deep_stacks rather than user_stacks. */
#define DEEP_STACK_ID (1LL << 62)

/* How a user stack's walk ended (values of user_stack.end). */
enum user_end {
	/* The walk reached the outermost frame. */
	USER_END_COMPLETE = 0,
	/* max_frames frames and the stack went on. */
	USER_END_TRUNCATED = 1,
	/* The walk lost its way: no rule for a pc, an unreadable stack word. */
	USER_END_BROKEN = 2,
	/* The process had no unwind tables yet: the kernel's frame-pointer walk. */
	USER_END_FRAME_POINTER = 3,
};

/* One user stack, leaf first: ips[0] is the sampled pc, the rest return addresses. The maps
 * keep a prefix of it: len, end and as many ips as their value size holds. */
struct user_stack {
	__u32 len;
	__u32 end;
	__u64 ips[MAX_USER_FRAMES];
};

/* What a count is kept for. Stack ids < 0 are errors: -EFAULT means "no stack of that kind
 * in this sample", anything else that the stack could not be stored. */
struct count_key {
	__u32 pid;
	__u32 tid;
	/* Key into user_stacks, or with DEEP_STACK_ID into deep_stacks (a hash of the stack,
	 * >= 0), or an error. */
	__s64 user_stack_id;
	/* Key into stack_traces or an error (bpf_get_stackid's). */
	__s32 kernel_stack_id;
	/* Which event counted the stack: EVENT_INDEX_TIMER or the loader's index of a probe. */
	__u32 event;
	char comm[16];
};

/* count_key.event of the cpu-clock samples. */
#define EVENT_INDEX_TIMER 0

/* A wanted thread off the CPU: when it left (bpf_ktime_get_ns) and where its time goes. */
struct blocked {
	__u64 since;
	struct count_key key;
};

/* Per-CPU counters of samples the maps could not hold. */
enum drop_counter {
	DROP_COUNT_MAP_FULL = 0,
	DROP_USER_STACK_FULL = 1,
	/* Allocations the live map had no room for, and their bytes (record --in-use). */
	DROP_LIVE_FULL = 2,
	DROP_LIVE_FULL_BYTES = 3,
	DROP_COUNTERS = 4,
};

/* How an allocator entry point takes its arguments (the attach cookie of its probes). */
enum alloc_kind {
	/* (size, ...): malloc, valloc, pvalloc, jemalloc's mallocx, mimalloc's *_aligned. */
	ALLOC_SIZE_FIRST = 1,
	/* (n, size): calloc. */
	ALLOC_CALLOC = 2,
	/* (old, size, ...): realloc, rallocx, mi_realloc_aligned. */
	ALLOC_REALLOC = 3,
	/* (old, n, size): reallocarray. */
	ALLOC_REALLOCARRAY = 4,
	/* (&ptr, align, size), the block written to *ptr, 0 returned on success. */
	ALLOC_POSIX_MEMALIGN = 5,
	/* (align, size): aligned_alloc, memalign. */
	ALLOC_SIZE_SECOND = 6,
	/* (ptr, ...): free, jemalloc's sdallocx, mi_free; munmap (a block it unmaps whole). */
	ALLOC_FREE = 7,
	/* mmap (addr, len, prot, flags, fd, off): anonymous mappings only, MAP_FAILED a failure. */
	ALLOC_MMAP = 8,
};

/* A thread inside an allocator call: what the call's return completes. */
struct alloc_call {
	__u64 size;
	/* realloc's old block, freed when the call returns a new one (or frees it: size 0). */
	__u64 old;
	/* posix_memalign's out pointer. */
	__u64 memptr;
	/* The stack pointer at the outermost call's entry: calls below it are nested in it. */
	__u64 sp;
	/* What the call counts if it allocates: bytes and thousandths of an allocation (1000
	 * each when every call is counted; an estimate when sampled by --sample-bytes; 0: not
	 * sampled, counted nowhere). */
	__u64 bytes;
	__u64 milli;
	__u32 kind;
	/* Calls nested in the outermost one (realloc calling malloc), still to return. */
	__u32 depth;
};

/* Bytes and allocations counted under one key (record --alloc). */
struct alloc_total {
	__u64 bytes;
	/* Allocations, in thousandths: a sampled one stands for a fraction or several. */
	__u64 milli;
};

/* A live allocation, by process and address (record --in-use). */
struct live_key {
	__u32 pid;
	__u32 pad;
	__u64 addr;
};

struct live_alloc {
	/* The bytes it stands for: its size, or a sampled block's estimate. */
	__u64 size;
	/* bpf_ktime_get_ns at the allocation. */
	__u64 since;
	/* Allocations it stands for, in thousandths. */
	__u64 milli;
	struct count_key key;
};

/* Ring buffer events: what user space must (re)load unwind tables for. */
enum event_kind {
	/* A sampled process has no unwind tables (rate-limited per process). */
	EVENT_NO_TABLES = 1,
	/* A followed process forked a new process (pid = the child, ppid = the parent). */
	EVENT_FORK = 2,
	/* A followed process called exec: its old tables are stale. */
	EVENT_EXEC = 3,
	/* A followed process's dynamic loader mapped libraries (start-up or dlopen). When `held`
	 * is set the process has been sent SIGSTOP and waits for SIGCONT once its tables are
	 * loaded. */
	EVENT_LOADED = 4,
	/* A followed process exited. */
	EVENT_EXIT = 5,
};

struct event {
	__u32 kind;
	__u32 pid;
	__u32 ppid;
	__u32 held;
};

/* Which samples to keep (config.filter). */
enum filter_mode {
	FILTER_NONE = 0,
	/* Processes in filter_ids (pids in the caller's pid namespace), their threads and the
	 * processes they fork. */
	FILTER_PIDS = 1,
	/* Threads in filter_ids (tids in the caller's pid namespace). */
	FILTER_TIDS = 2,
};

#endif
