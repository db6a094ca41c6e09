/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Memory by stack (record --alloc, --in-use): uprobes on the allocator's entry points and
 * uretprobes on its allocating ones. The entry saves the call's size per thread; the return
 * takes the caller's stacks and either adds the bytes and one allocation to the stack's total
 * (--alloc), or keeps the block's address, size, time and stacks in the live map, removed again
 * at its free (--in-use), so what is left at the end is what is still held; with
 * --sample-bytes only sampled calls are, each weighed as the bytes it stands for. A realloc frees its
 * old block and allocates a new one; an anonymous mmap is an allocation, a munmap a free. Calls nested in an allocator call (glibc's realloc calls
 * malloc, memalign tail-calls it) count once, as the outermost call.
 *
 * Included by profile.bpf.c after the counting helpers it uses; registers by kernel.h's REGS_*.
 */

/* Set by the loader: keep live blocks (--in-use) rather than totals (--alloc); the count
 * key's event of allocations; --sample-bytes (0: every call counted). */
const volatile bool count_live = false;
const volatile __u32 alloc_event = 0;
const volatile __u64 sample_bytes = 0;

/* --sample-bytes: sample points fall on the bytes allocated as a Poisson process, one per
 * sample_bytes on average (as Go's and jemalloc's heap profilers sample); an allocation holding
 * k of them stands for k * sample_bytes bytes, and k * sample_bytes / size allocations, both
 * unbiased whatever the sizes. This is, per CPU, the bytes left to the next point. Points
 * hold no memory of the past, so a CPU's stream is as good as a thread's. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __s64);
	__uint(max_entries, 1);
} sample_countdown SEC(".maps");

/* An allocation this many times sample_bytes or larger is counted exactly: it would hold
 * about that many points, and the loop that finds them is bounded. */
#define SAMPLE_EXACT_FROM 16
#define SAMPLE_MAX_POINTS 64

/* log2(1 + i/64) in 1/65536ths: the fraction of a logarithm, interpolated between entries. */
static const __u32 log2_fraction[65] = {
	0, 1466, 2909, 4331, 5732, 7112, 8473, 9814, 11136, 12440, 13727, 14996, 16248, 17484,
	18704, 19909, 21098, 22272, 23433, 24579, 25711, 26830, 27936, 29029, 30109, 31178, 32234,
	33279, 34312, 35334, 36346, 37346, 38336, 39316, 40286, 41246, 42196, 43137, 44068, 44990,
	45904, 46809, 47705, 48593, 49472, 50344, 51207, 52063, 52911, 53751, 54584, 55410, 56229,
	57040, 57845, 58643, 59434, 60219, 60997, 61769, 62534, 63294, 64047, 64794, 65536,
};

/* Bytes to the next sample point: sample_bytes * -ln(u), u uniform in (0, 1), the gap of a
 * Poisson process, in integers (no floating point in BPF): -ln(u) = ln 2 * (32 - log2(r)) for
 * r = u * 2^32, log2(r) its top bit's place plus a fraction from the table. */
static __always_inline __u64 next_sample_gap(void)
{
	__u32 r = bpf_get_prandom_u32() | 1;
	__u32 top = 0, x = r, norm, fraction, i, rest;
	__u64 neg_log2, neg_ln;

	if (x >> 16) { x >>= 16; top += 16; }
	if (x >> 8) { x >>= 8; top += 8; }
	if (x >> 4) { x >>= 4; top += 4; }
	if (x >> 2) { x >>= 2; top += 2; }
	if (x >> 1) top += 1;
	/* r's bits below the top one, as 16 bits of fraction in [0, 1). */
	norm = top >= 16 ? r >> (top - 16) : r << (16 - top);
	fraction = norm & 0xffff;
	i = (fraction >> 10) & 63;
	rest = fraction & 1023;
	fraction = log2_fraction[i] + (((log2_fraction[i + 1] - log2_fraction[i]) * rest) >> 10);
	neg_log2 = ((__u64)32 << 16) - (((__u64)top << 16) + fraction);
	/* ln 2 = 45426 / 65536. */
	neg_ln = (neg_log2 * 45426) >> 16;
	return (sample_bytes * neg_ln) >> 16;
}

/* What an outermost allocator call of `size` bytes counts if it allocates (see struct
 * alloc_call's bytes and milli): all of it, or with --sample-bytes its estimate or nothing. */
static __always_inline void weigh_call(struct alloc_call *call, __u64 size)
{
	__u32 zero = 0;
	__s64 *left;
	__u64 points = 0;

	call->bytes = size;
	call->milli = 1000;
	if (!sample_bytes || size >= SAMPLE_EXACT_FROM * sample_bytes)
		return;
	call->bytes = 0;
	call->milli = 0;
	left = bpf_map_lookup_elem(&sample_countdown, &zero);
	if (!left)
		return;
	/* 0 only before the CPU's first call: the loop leaves it above 0. */
	if (*left == 0)
		*left = next_sample_gap() + 1;
	*left -= size;
	for (int n = 0; n < SAMPLE_MAX_POINTS && *left <= 0; n++) {
		*left += next_sample_gap() + 1;
		points++;
	}
	if (points && size) {
		call->bytes = points * sample_bytes;
		call->milli = call->bytes * 1000 / size;
	}
}

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

/* Adds `bytes` in `milli` thousandths of an allocation to `key`'s total. */
static __always_inline void add_alloc_total(struct count_key *key, __u64 bytes, __u64 milli)
{
	struct alloc_total one = { .bytes = bytes, .milli = milli };
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
	__sync_fetch_and_add(&total->milli, milli);
}

/* Counts the block `addr` the current thread's allocator call returned, as the `bytes` and
 * `milli` allocations it stands for, at the caller's stacks (the registers are those just
 * after the return). */
static __always_inline void count_block(struct pt_regs *ctx, __u64 addr, __u64 bytes,
					__u64 milli)
{
	struct live_key where = { .pid = bpf_get_current_pid_tgid() >> 32, .addr = addr };
	struct live_alloc live = {};

	if (!current_key(ctx, ctx, alloc_event, 0, &live.key))
		return;
	if (!count_live) {
		add_alloc_total(&live.key, bytes, milli);
		return;
	}
	live.size = bytes;
	live.milli = milli;
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
	weigh_call(&call, call.size);
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
	if (addr && call.milli)
		count_block(ctx, addr, call.bytes, call.milli);
	return 0;
}
