/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The user stack words the in-kernel walk (unwind.bpf.h) reads: a window of them read ahead
 * into a per-CPU buffer with bpf_probe_read_user, since callers' frames lie above their
 * callees', and wiped before the walk returns so no stack memory outlives it. Included by
 * unwind.bpf.h.
 */
#ifndef STACKSCOPE_UNWIND_WINDOW_BPF_H
#define STACKSCOPE_UNWIND_WINDOW_BPF_H

/* Stack words read at once: a few frames of a Rust program, a dozen of C. */
#define UNWIND_WINDOW_WORDS 64

/* Stack memory read ahead of the walk, one per CPU: callers' frames lie above their callees'. */
struct unwind_window {
	__u64 words[UNWIND_WINDOW_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct unwind_window);
	__uint(max_entries, 1);
} unwind_window SEC(".maps");

/* The window holds the stack words of user addresses [start, end). */
struct unwind_cursor {
	__u64 start, end;
};

/*
 * Reads the user stack word at addr, from the window or into it; 0 on success, and on
 * failure *out is 0. A global function: the verifier checks it once, not at every call with
 * every state of the walk (inlined at each call, it took the program past 1M instructions).
 */
__noinline long unwind_read(struct unwind_cursor *c, __u64 addr, __u64 *out)
{
	__u32 zero = 0;
	struct unwind_window *win = bpf_map_lookup_elem(&unwind_window, &zero);
	__u64 index;

	if (!c || !out)
		return -1;
	*out = 0;
	if (!win)
		return -1;
	index = (addr - c->start) / 8;
	if (addr >= c->start && addr < c->end && !(addr & 7) && index < UNWIND_WINDOW_WORDS) {
		*out = win->words[index];
		return 0;
	}
	/* A failed read clears the buffer: the window is empty until one succeeds. */
	c->end = 0;
	if (!(addr & 7) && !bpf_probe_read_user(win->words, sizeof(win->words), (void *)addr)) {
		c->start = addr;
		c->end = addr + sizeof(win->words);
		*out = win->words[0];
		return 0;
	}
	/* Near the top of the stack a whole window runs past its end: one word then. */
	return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
}

/* Empties the window, so that no stack memory outlives the walk. */
static __always_inline void unwind_wipe(struct unwind_cursor *c)
{
	__u32 zero = 0;
	struct unwind_window *win = bpf_map_lookup_elem(&unwind_window, &zero);

	if (win && c->end)
		__builtin_memset(win->words, 0, sizeof(win->words));
	c->end = 0;
}

#endif
