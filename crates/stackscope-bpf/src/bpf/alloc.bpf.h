/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Memory by stack (record --alloc, --in-use): uprobes on the allocator's entry points and
 * uretprobes on its allocating ones. The entry saves the call's size per thread; the return
 * takes the caller's stacks and either adds the bytes and one allocation to the stack's total
 * (--alloc), or keeps the block's address, size, time and stacks in the live map, removed again
 * at its free (--in-use), so what is left at the end is what is still held. A realloc frees its
 * old block and allocates a new one; an anonymous mmap is an allocation, a munmap a free. Calls nested in an allocator call (glibc's realloc calls
 * malloc, memalign tail-calls it) count once, as the outermost call.
 *
 * Included by profile.bpf.c after the counting helpers it uses; registers by kernel.h's REGS_*.
 */

/* Set by the loader: keep live blocks (--in-use) rather than totals (--alloc); the count
 * key's event of allocations. */
const volatile bool count_live = false;
const volatile __u32 alloc_event = 0;

/* Threads inside an allocator call, by global tid. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct alloc_call);
	__uint(max_entries, 16384);
} alloc_calls SEC(".maps");

/* Bytes and allocations by key (--alloc); the loader sizes it as the count map. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct count_key);
	__type(value, struct alloc_total);
	__uint(max_entries, 1);
} alloc_totals SEC(".maps");

/* Live blocks (--in-use), allocated as stored: sized by --max-live, it takes room for the
 * blocks live at once only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct live_key);
	__type(value, struct live_alloc);
	__uint(max_entries, 1);
} live_allocs SEC(".maps");

/* Adds `bytes` in one allocation to `key`'s total. */
static __always_inline void add_alloc_total(struct count_key *key, __u64 bytes)
{
	struct alloc_total one = { .bytes = bytes, .calls = 1 };
	struct alloc_total *total;
	long err;

	total = bpf_map_lookup_elem(&alloc_totals, key);
	if (!total) {
		err = bpf_map_update_elem(&alloc_totals, key, &one, BPF_NOEXIST);
		if (!err)
			return;
		if (err != -EEXIST) {
			count_drop(DROP_COUNT_MAP_FULL);
			return;
		}
		/* Another CPU added the key meanwhile. */
		total = bpf_map_lookup_elem(&alloc_totals, key);
		if (!total)
			return;
	}
	__sync_fetch_and_add(&total->bytes, bytes);
	__sync_fetch_and_add(&total->calls, 1);
}

/* Counts the block `addr` of `bytes` the current thread's allocator call returned, at the
 * caller's stacks (the registers are those just after the return). */
static __always_inline void count_block(struct pt_regs *ctx, __u64 addr, __u64 bytes)
{
	struct live_key where = { .pid = bpf_get_current_pid_tgid() >> 32, .addr = addr };
	struct live_alloc live = {};

	if (!current_key(ctx, ctx, alloc_event, 0, &live.key))
		return;
	if (!count_live) {
		add_alloc_total(&live.key, bytes);
		return;
	}
	live.size = bytes;
	live.since = bpf_ktime_get_ns();
	/* A full map keeps the blocks it holds: the newest goes uncounted, and is said. */
	if (bpf_map_update_elem(&live_allocs, &where, &live, BPF_ANY)) {
		count_drops(DROP_LIVE_FULL, 1);
		count_drops(DROP_LIVE_FULL_BYTES, bytes);
	}
}

static __always_inline void forget_block(__u64 addr)
{
	struct live_key where = { .pid = bpf_get_current_pid_tgid() >> 32, .addr = addr };

	bpf_map_delete_elem(&live_allocs, &where);
}

/* An allocator entry point: the attach cookie says how it takes its arguments. */
SEC("uprobe")
int on_alloc(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 kind = bpf_get_attach_cookie(ctx);
	struct alloc_call call = { .kind = kind, .sp = REGS_SP(ctx) };
	struct alloc_call *outer;

	if (kind == ALLOC_FREE) {
		if (count_live && REGS_ARG(ctx, 0))
			forget_block(REGS_ARG(ctx, 0));
		return 0;
	}
	outer = bpf_map_lookup_elem(&alloc_calls, &tid);
	/* Below the outer call's entry: nested in it. At or above it, the outer call is over
	 * without its return seen (a longjmp out of it): this call replaces it. */
	if (outer && call.sp < outer->sp) {
		outer->depth += 1;
		return 0;
	}
	switch (kind) {
	case ALLOC_SIZE_FIRST:
		call.size = REGS_ARG(ctx, 0);
		break;
	case ALLOC_CALLOC:
		call.size = REGS_ARG(ctx, 0) * REGS_ARG(ctx, 1);
		break;
	case ALLOC_REALLOC:
		call.old = REGS_ARG(ctx, 0);
		call.size = REGS_ARG(ctx, 1);
		break;
	case ALLOC_REALLOCARRAY:
		call.old = REGS_ARG(ctx, 0);
		call.size = REGS_ARG(ctx, 1) * REGS_ARG(ctx, 2);
		break;
	case ALLOC_POSIX_MEMALIGN:
		call.memptr = REGS_ARG(ctx, 0);
		call.size = REGS_ARG(ctx, 2);
		break;
	case ALLOC_SIZE_SECOND:
		call.size = REGS_ARG(ctx, 1);
		break;
	case ALLOC_MMAP:
		/* A file's mapping is no allocation (MAP_ANONYMOUS is 0x20). */
		if (!(REGS_ARG(ctx, 3) & 0x20))
			return 0;
		call.size = REGS_ARG(ctx, 1);
		break;
	default:
		return 0;
	}
	bpf_map_update_elem(&alloc_calls, &tid, &call, BPF_ANY);
	return 0;
}

/* The return of an allocating entry point: the outermost call's completes it. */
SEC("uretprobe")
int on_alloc_return(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct alloc_call *outer = bpf_map_lookup_elem(&alloc_calls, &tid);
	struct alloc_call call;
	__u64 addr = REGS_RET(ctx);

	if (!outer)
		return 0;
	if (outer->depth > 0) {
		outer->depth -= 1;
		return 0;
	}
	call = *outer;
	bpf_map_delete_elem(&alloc_calls, &tid);
	if (call.kind == ALLOC_POSIX_MEMALIGN) {
		if (addr != 0 || bpf_probe_read_user(&addr, sizeof(addr), (void *)call.memptr))
			return 0;
	}
	/* mmap fails with MAP_FAILED, not NULL. */
	if (call.kind == ALLOC_MMAP && addr == (__u64)-1)
		return 0;
	/* realloc frees its old block when it returns a new one, or when it frees it (size 0),
	 * never when it fails. */
	if (count_live && call.old && (addr || call.size == 0))
		forget_block(call.old);
	if (addr)
		count_block(ctx, addr, call.size);
	return 0;
}
