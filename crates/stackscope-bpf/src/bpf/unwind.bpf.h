/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * User-stack unwinding inside the kernel, from the compact unwind tables user space builds out
 * of each mapped file's .eh_frame (stackscope-bpf's unwind_table module) and writes into the
 * maps below (stackscope-bpf's tables.rs). Include once, after the basic types and
 * <bpf/bpf_helpers.h>; call unwind_user().
 *
 * Only code addresses leave this code (return addresses, and the interrupted pc saved in a
 * signal frame). Stack words are read with bpf_probe_read_user a window of 512 bytes at a time
 * into a per-CPU buffer that no one outside this program reads, and that the walk wipes
 * before it returns (unwind_window.bpf.h).
 *
 * Each frame is one bpf_loop() callback (nested bounded loops exceed the verifier's 1M
 * instruction limit). A frame costs a search of the rows and, unless its words are in the
 * window already, a user-memory read: on a 6.18 VM one took about 100 ns, so the words of
 * several frames are read at once. The row search is a plain bounded loop in a global function
 * (verified once), as an open-coded bpf_for() iterator pays a kfunc call per step (140 ns a
 * frame where the loop takes about 40). The mapping search, run only when a frame leaves the
 * previous frame's file, is one too. Needs bpf_loop (kernel >= 5.17); checked on 6.1 and 6.18.
 *
 * The rows are of the architecture the program is built for (the table's architecture field
 * in user space says which); x86-64 and aarch64 share the walk and differ in the row kinds
 * that say where the CFA, the return address and the frame pointer (rbp, x29) are. "sp" and
 * "bp" below are rsp and rbp, or sp and x29; "lr" is aarch64's x30, where a leaf's return
 * address still is.
 */
#ifndef STACKSCOPE_UNWIND_BPF_H
#define STACKSCOPE_UNWIND_BPF_H

/* The most frames a walk may take (the caller's max_frames is at most this). */
#define UNWIND_MAX_FRAMES 1024
/* Map sizes; tables.rs reads the real sizes from the maps. Each file's rows are a map of their
 * own, sized to the file and created by user space, so row storage grows with what is mapped;
 * UNWIND_MAX_TABLES is how many files' tables the kernel holds at once. */
#define UNWIND_MAX_TABLES 16384
#define UNWIND_MAX_MAPPINGS (1 << 16)
#define UNWIND_MAX_PROCS 16384
/* Binary search steps: a file's table has at most 1 << UNWIND_ROW_SEARCH_STEPS rows (libLLVM,
 * the largest file profiled here, has 1.4 million). */
#define UNWIND_ROW_SEARCH_STEPS 24
#define UNWIND_MAPPING_SEARCH_STEPS 18

/* How unwind_user ended. */
enum unwind_status {
	/* Reached the outermost frame: CFI with an undefined return address (_start, thread
	 * start), or a zero frame pointer / return address. */
	UNWIND_COMPLETE = 0,
	/* max_frames reached. */
	UNWIND_TRUNCATED = 1,
	/* Unreadable stack, or no usable rule nor frame pointer. */
	UNWIND_BROKEN = 2,
	/* The process has no tables loaded (yet): only ips[0] is set. */
	UNWIND_NO_TABLES = 3,
};

/* Row kinds; the same values as stackscope_bpf's unwind_table::RowKind. */
enum unwind_row_kind {
	UNWIND_ROW_END = 0,         /* no CFI: frame pointers */
	UNWIND_ROW_CFA_RSP = 1,     /* CFA = rsp + cfa_offset */
	UNWIND_ROW_CFA_RBP = 2,     /* CFA = rbp + cfa_offset */
	UNWIND_ROW_PLT = 3,         /* CFA = rsp + cfa_offset + ((pc & 15) >= aux ? 8 : 0) */
	UNWIND_ROW_STOP = 4,        /* return address undefined: outermost frame */
	UNWIND_ROW_UNSUPPORTED = 5, /* CFI the rows cannot express: frame pointers */
	UNWIND_ROW_SIGNAL = 6,      /* signal trampoline: registers from the ucontext at sp */
	UNWIND_ROW_CFA_DEREF_RSP = 7, /* CFA = *(rsp + cfa_offset) + 8 (OpenSSL's realigned frames) */
	/* CFA = rsp + 8 * ((aux >> 3) << 16 | (u16)cfa_offset), rbp saved at CFA - 8 * (aux & 7)
	 * (0: unchanged): frames over 32 KiB. */
	UNWIND_ROW_CFA_RSP_LARGE = 8,
	/* aarch64: CFA = sp + cfa_offset (9) or x29 + cfa_offset (10); x30 saved at
	 * CFA + 8 * aux, or still in lr when aux is 0; x29 unchanged. */
	UNWIND_ROW_A64_CFA_SP = 9,
	UNWIND_ROW_A64_CFA_FP = 10,
	/* aarch64: as 9 and 10, with the frame record (x29, then x30) saved at CFA + 8 * aux. */
	UNWIND_ROW_A64_CFA_SP_RECORD = 11,
	UNWIND_ROW_A64_CFA_FP_RECORD = 12,
	/* aarch64: CFA = sp + cfa_offset; x30 (13) or the frame record (14) saved at
	 * sp + 8 * (u8)aux: GCC's saved registers at the bottom of a frame over 1 KiB. 15 and
	 * 16 are the same from x29. */
	UNWIND_ROW_A64_CFA_SP_LOW = 13,
	UNWIND_ROW_A64_CFA_SP_LOW_RECORD = 14,
	UNWIND_ROW_A64_CFA_FP_LOW = 15,
	UNWIND_ROW_A64_CFA_FP_LOW_RECORD = 16,
};

/* The bits of a user return address that are address: on aarch64 the rest is the pointer
 * authentication code of signed return addresses (set by user space to the host walk's
 * mask); all ones on x86-64. */
const volatile __u64 unwind_code_mask = ~0ULL;

/* Where the kernel saved the interrupted registers, from sp at the signal trampoline (the
 * ucontext of struct rt_sigframe): uc_mcontext is at 40, and in it rbp, rsp, rip at 80,
 * 120, 128 (uapi asm/sigcontext.h, struct sigcontext_64). */
#if defined(__TARGET_ARCH_arm64)
/* aarch64 (uapi asm/sigcontext.h, asm/ucontext.h): siginfo (128 bytes), then the ucontext,
 * whose uc_mcontext (at 176) is a struct sigcontext: fault_address, regs[31], sp, pc. */
#define UNWIND_SIGNAL_REGS (128 + 176 + 8)
#define UNWIND_SIGNAL_RBP (UNWIND_SIGNAL_REGS + 29 * 8)
#define UNWIND_SIGNAL_LR (UNWIND_SIGNAL_REGS + 30 * 8)
#define UNWIND_SIGNAL_RSP (UNWIND_SIGNAL_REGS + 31 * 8)
#define UNWIND_SIGNAL_RIP (UNWIND_SIGNAL_REGS + 32 * 8)
#else
#define UNWIND_SIGNAL_RBP (40 + 80)
#define UNWIND_SIGNAL_RSP (40 + 120)
#define UNWIND_SIGNAL_RIP (40 + 128)
#endif

/* The user registers a walk starts from; lr is aarch64's only (0 on x86-64). */
struct unwind_regs {
	__u64 ip, sp, bp, lr;
};

/* One row, valid from file address `addr` to the next row. For CFA_RSP/CFA_RBP, aux != 0
 * means rbp was saved at CFA + 8 * aux; the return address is always at CFA - 8. */
struct unwind_row {
	__u32 addr;
	__s16 cfa_offset;
	__u8 kind;
	__s8 aux;
};

/* One executable mapping of a process: file address = pc - bias; its file's rows are
 * unwind_tables[table][0 .. row_count). row_count == 0: no table (JIT code, files without
 * CFI, tables that did not fit): frame pointers. */
struct unwind_mapping {
	__u64 start;
	__u64 end;
	__u64 bias;
	__u32 table;
	__u32 row_count;
};

/* A process's mappings: unwind_mappings[first .. first + count), sorted by start. */
struct unwind_proc {
	__u32 first;
	__u32 count;
};

/* One file's rows. BPF_F_INNER_MAP lets each file's map have its own size. */
struct unwind_file_rows {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE | BPF_F_INNER_MAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct unwind_row));
	__uint(max_entries, 1);
};

/* The rows of every file loaded, one map per file, shared by every process mapping it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, UNWIND_MAX_TABLES);
	__array(values, struct unwind_file_rows);
} unwind_tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_mapping);
	__uint(max_entries, UNWIND_MAX_MAPPINGS);
} unwind_mappings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct unwind_proc);
	__uint(max_entries, UNWIND_MAX_PROCS);
} unwind_procs SEC(".maps");

#include "unwind_window.bpf.h"

/* The walk's state, shared by the bpf_loop callbacks. */
struct unwind_state {
	/* lr holds a return address only while exact_ip is set. */
	__u64 ip, sp, bp, lr;
	__u64 *ips;
	__u32 first, count;
	/* Frames written; only written by the steps, read at the end. */
	__u32 n, max;
	__u32 status;
	/* ip was interrupted (leaf or below a signal frame), not a return address. */
	__u32 exact_ip;
	/* The mapping of the last frame: callers are mostly in the same file, so most frames
	 * need no mapping search. */
	struct unwind_mapping last;
	/* The stack words read ahead. */
	struct unwind_cursor window;
};

/*
 * The index in unwind_mappings of this process's mapping holding pc, or -1. A global function
 * with a plain bounded loop, as the row search: checked once by the verifier, and loadable by
 * kernels without bpf_for (before 6.4).
 */
__noinline __s64 unwind_mapping_index(__u32 first, __u32 count, __u64 pc)
{
	struct unwind_mapping *m;
	__u32 lo = first, hi = first + count, mid;
	int i;

	/* The first mapping whose start is above pc, then one back. */
#pragma clang loop unroll(disable)
	for (i = 0; i < UNWIND_MAPPING_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		mid = lo + (hi - lo) / 2;
		m = bpf_map_lookup_elem(&unwind_mappings, &mid);
		if (!m)
			return -1;
		if (m->start <= pc)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo != hi || lo == first)
		return -1;
	mid = lo - 1;
	m = bpf_map_lookup_elem(&unwind_mappings, &mid);
	if (!m || pc >= m->end)
		return -1;
	return mid;
}

/*
 * The rule of the row of unwind_tables[table][0 .. count) covering file address addr: its
 * cfa_offset in bits 0-15, kind in 16-23 and aux in 24-31; -1 when no row covers it. A global
 * function, checked once by the verifier rather than in every state of the walk.
 */
__noinline __s64 unwind_row_rule(__u32 table, __u32 count, __u64 addr)
{
	struct unwind_row *r;
	void *rows;
	__u32 lo = 0, hi = count, mid;
	int i;

	if (addr > 0xffffffffULL)
		return -1;
	rows = bpf_map_lookup_elem(&unwind_tables, &table);
	if (!rows)
		return -1;
#pragma clang loop unroll(disable)
	for (i = 0; i < UNWIND_ROW_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		mid = lo + (hi - lo) / 2;
		r = bpf_map_lookup_elem(rows, &mid);
		if (!r)
			return -1;
		if (r->addr <= (__u32)addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo != hi || lo == 0)
		return -1;
	mid = lo - 1;
	r = bpf_map_lookup_elem(rows, &mid);
	if (!r)
		return -1;
	return (__u16)r->cfa_offset | (__u32)r->kind << 16 | (__u32)(__u8)r->aux << 24;
}

/* Where a frame's caller's registers are: the CFA, and the slots of the return address and of
 * the frame pointer in words from it (fp_slot 0: unchanged; ra_slot 0: still in lr). */
struct unwind_frame {
	__u64 cfa;
	__s32 ra_slot, fp_slot;
};

/* Reads the frame of s->ip from its row (kind, cfa_offset, aux); -1 to go on, else the enum
 * unwind_status to stop with. */
static __always_inline int unwind_frame_of(struct unwind_state *s, __u8 kind, __s16 cfa_offset,
					   __s8 aux, struct unwind_frame *f)
{
	__u64 sp = s->sp, bp = s->bp;

	f->ra_slot = -1;
	f->fp_slot = aux;
	switch (kind) {
	case UNWIND_ROW_STOP:
		return UNWIND_COMPLETE;
	case UNWIND_ROW_CFA_RSP:
		f->cfa = sp + cfa_offset;
		return -1;
	case UNWIND_ROW_CFA_RBP:
		f->cfa = bp + cfa_offset;
		return -1;
	case UNWIND_ROW_CFA_RSP_LARGE:
		f->cfa = sp + ((__u64)((__u8)aux >> 3) << 16 | (__u16)cfa_offset) * 8;
		f->fp_slot = -(__s8)((__u8)aux & 7);
		return -1;
	case UNWIND_ROW_CFA_DEREF_RSP:
		if (unwind_read(&s->window, sp + cfa_offset, &f->cfa))
			return UNWIND_BROKEN;
		f->cfa += 8;
		return -1;
	case UNWIND_ROW_PLT:
		f->cfa = sp + cfa_offset + ((s->ip & 15) >= (__u64)aux ? 8 : 0);
		f->fp_slot = 0;
		return -1;
	case UNWIND_ROW_A64_CFA_SP:
	case UNWIND_ROW_A64_CFA_FP:
		f->cfa = (kind == UNWIND_ROW_A64_CFA_SP ? sp : bp) + cfa_offset;
		f->ra_slot = aux;
		f->fp_slot = 0;
		return -1;
	case UNWIND_ROW_A64_CFA_SP_RECORD:
	case UNWIND_ROW_A64_CFA_FP_RECORD:
		f->cfa = (kind == UNWIND_ROW_A64_CFA_SP_RECORD ? sp : bp) + cfa_offset;
		f->ra_slot = aux + 1;
		return -1;
	case UNWIND_ROW_A64_CFA_SP_LOW:
	case UNWIND_ROW_A64_CFA_SP_LOW_RECORD:
	case UNWIND_ROW_A64_CFA_FP_LOW:
	case UNWIND_ROW_A64_CFA_FP_LOW_RECORD:
		/* base + 8 * aux as words from the CFA (base + cfa_offset): aux - cfa_offset / 8,
		 * cfa_offset being positive and a multiple of 8 here. */
		f->cfa = (kind <= UNWIND_ROW_A64_CFA_SP_LOW_RECORD ? sp : bp) + cfa_offset;
		f->fp_slot = (__s32)(__u8)aux - (__s32)((__u16)cfa_offset / 8);
		f->ra_slot = f->fp_slot;
		if (kind == UNWIND_ROW_A64_CFA_SP_LOW_RECORD || kind == UNWIND_ROW_A64_CFA_FP_LOW_RECORD)
			f->ra_slot += 1;
		else
			f->fp_slot = 0;
		return -1;
	default:
		/* Frame pointers: [bp] = caller's bp, [bp + 8] = return address (a frame record
		 * on aarch64). */
		if (bp == 0)
			return UNWIND_COMPLETE;
		if (bp < sp || (bp & 7))
			return UNWIND_BROKEN;
		f->cfa = bp + 16;
		f->fp_slot = -2;
		return -1;
	}
}

/* Below a signal trampoline: the interrupted registers from the frame the kernel saved at sp.
 * 1 = stop. */
static __always_inline long unwind_signal(struct unwind_state *s, __u64 n)
{
	__u64 ra = 0, cfa = 0, saved_bp = 0, lr = 0;

	/* The interrupted code may run on another stack (sigaltstack): no ordering check. */
	if (unwind_read(&s->window, s->sp + UNWIND_SIGNAL_RIP, &ra) ||
	    unwind_read(&s->window, s->sp + UNWIND_SIGNAL_RSP, &cfa) ||
	    unwind_read(&s->window, s->sp + UNWIND_SIGNAL_RBP, &saved_bp) ||
#ifdef UNWIND_SIGNAL_LR
	    unwind_read(&s->window, s->sp + UNWIND_SIGNAL_LR, &lr) ||
#endif
	    ra == 0) {
		s->status = UNWIND_BROKEN;
		return 1;
	}
	s->ips[n] = ra;
	s->n = n + 1;
	s->ip = ra;
	s->sp = cfa;
	s->bp = saved_bp;
	s->lr = lr;
	s->exact_ip = 1;
	return 0;
}

/* The packed rule (as unwind_row_rule's) of the row covering pc, through the mapping holding
 * it (kept in s->last for the next frames); -1 where none does. */
static __always_inline __s64 unwind_rule_at(struct unwind_state *s, __u64 pc)
{
	struct unwind_mapping *m;
	__s64 mapping;
	__u32 key;

	if (pc < s->last.start || pc >= s->last.end) {
		mapping = unwind_mapping_index(s->first, s->count, pc);
		key = mapping;
		m = mapping >= 0 ? bpf_map_lookup_elem(&unwind_mappings, &key) : NULL;
		if (m)
			s->last = *m;
	}
	/* A pc in no mapping known (JIT code mapped since the maps were read) has no rows: its
	 * frame pointer leads on, as perf's unwinder does. */
	if (pc >= s->last.start && pc < s->last.end && s->last.row_count)
		return unwind_row_rule(s->last.table, s->last.row_count, pc - s->last.bias);
	return -1;
}

/* One frame: finds the caller of s->ip and appends its return address. 1 = stop. */
static long unwind_step(__u64 index, void *data)
{
	struct unwind_state *s = data;
	struct unwind_frame f = {};
	__s64 rule;
	__u64 pc = s->ip, ra = 0, saved_bp = s->bp;
	/* Each step appends one frame or stops, so the frames so far are index + 1. Counting
	 * with the loop index, not a counter in s, keeps the verifier from seeing a new
	 * constant every round. */
	__u64 n = index + 1;
	__u8 kind = UNWIND_ROW_END;
	__s16 cfa_offset = 0;
	__s8 aux = 0;
	int stop;

	if (n >= s->max || n >= UNWIND_MAX_FRAMES) {
		s->status = UNWIND_TRUNCATED;
		return 1;
	}
	/* A return address points after its call, maybe past the end of the caller's code. */
	if (!s->exact_ip)
		pc -= 1;
	rule = unwind_rule_at(s, pc);
	if (rule >= 0) {
		cfa_offset = (__s16)(rule & 0xffff);
		kind = (rule >> 16) & 0xff;
		aux = (__s8)((rule >> 24) & 0xff);
	}
	if (kind == UNWIND_ROW_SIGNAL)
		return unwind_signal(s, n);
	stop = unwind_frame_of(s, kind, cfa_offset, aux, &f);
	if (stop >= 0) {
		s->status = stop;
		return 1;
	}
	/* Every frame pops at least its return address: this also ends any cycle. Only an
	 * interrupted frame whose return address is still in lr may have no stack frame (an
	 * aarch64 leaf); lr is then used up. */
	if (f.cfa < s->sp || (f.cfa == s->sp && f.ra_slot)) {
		s->status = UNWIND_BROKEN;
		return 1;
	}
	if (!f.ra_slot) {
		if (!s->exact_ip) {
			s->status = UNWIND_BROKEN;
			return 1;
		}
		ra = s->lr;
	} else if (unwind_read(&s->window, f.cfa + (__s64)f.ra_slot * 8, &ra)) {
		s->status = UNWIND_BROKEN;
		return 1;
	}
	if (f.fp_slot && unwind_read(&s->window, f.cfa + (__s64)f.fp_slot * 8, &saved_bp)) {
		s->status = UNWIND_BROKEN;
		return 1;
	}
	/* A signed return address (aarch64 pointer authentication) loses its code. */
	if (!(ra & (1ULL << 55)))
		ra &= unwind_code_mask;
	if (ra == 0) {
		s->status = UNWIND_COMPLETE;
		return 1;
	}
	s->ips[n] = ra;
	s->n = n + 1;
	s->ip = ra;
	s->sp = f.cfa;
	s->bp = saved_bp;
	s->exact_ip = 0;
	return 0;
}

/*
 * Unwinds the user stack whose registers are regs, of process tgid: writes ips[0] = regs->ip,
 * then the return addresses of the callers, outermost last. ips must point into a map value
 * with room for UNWIND_MAX_FRAMES entries. Returns the number of entries written and sets
 * *status to an enum unwind_status.
 */
static __always_inline int unwind_user(struct unwind_regs *regs, __u32 tgid, __u64 *ips,
				       int max_frames, __u32 *status)
{
	struct unwind_state s = {};
	struct unwind_proc *proc;

	ips[0] = regs->ip;
	proc = bpf_map_lookup_elem(&unwind_procs, &tgid);
	if (!proc) {
		*status = UNWIND_NO_TABLES;
		return 1;
	}
	if (max_frames > UNWIND_MAX_FRAMES)
		max_frames = UNWIND_MAX_FRAMES;
	s.ip = regs->ip;
	s.sp = regs->sp;
	s.bp = regs->bp;
	s.lr = regs->lr;
	s.ips = ips;
	s.first = proc->first;
	s.count = proc->count;
	s.n = 1;
	s.max = max_frames > 1 ? max_frames : 1;
	s.status = UNWIND_TRUNCATED;
	s.exact_ip = 1;
	bpf_loop(s.max, unwind_step, &s, 0);
	unwind_wipe(&s.window);
	*status = s.status;
	return s.n;
}

#endif
