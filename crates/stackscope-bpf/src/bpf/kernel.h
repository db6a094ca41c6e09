/* The few kernel ABI definitions the BPF programs use, copied by value from the stable uapi
 * (linux/bpf.h, linux/bpf_perf_event.h, asm/ptrace.h, errno) so the build needs neither kernel
 * headers nor a generated vmlinux.h. Kernel-internal structs are declared where they are read,
 * with preserve_access_index, and relocated against the running kernel's BTF at load. */
#ifndef STACKSCOPE_KERNEL_H
#define STACKSCOPE_KERNEL_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0
#define NULL ((void *)0)

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_STACK_TRACE = 7,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LPM_TRIE = 11,
	BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
	BPF_MAP_TYPE_RINGBUF = 27,
};

/* bpf_map_update_elem flags */
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

/* map_flags */
#define BPF_F_NO_PREALLOC (1U << 0)
#define BPF_F_RDONLY_PROG (1U << 7)
#define BPF_F_MMAPABLE (1U << 10)
#define BPF_F_INNER_MAP (1U << 12)

/* bpf_get_stackid / bpf_get_stack flags */
#define BPF_F_SKIP_FIELD_MASK 0xffULL
#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_F_FAST_STACK_CMP (1ULL << 9)
#define BPF_F_REUSE_STACKID (1ULL << 10)

/* bpf_ringbuf_output flags */
#define BPF_RB_NO_WAKEUP (1ULL << 0)
#define BPF_RB_FORCE_WAKEUP (1ULL << 1)

struct bpf_pidns_info {
	__u32 pid;
	__u32 tgid;
};

/* Opaque state of an open-coded number iterator (bpf_for), kernel >= 6.4. */
struct bpf_iter_num {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

#if defined(__TARGET_ARCH_x86)
/* User-visible register layout (asm/ptrace.h), as perf_event programs see it in their ctx. */
struct pt_regs {
	unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8;
	unsigned long rax, rcx, rdx, rsi, rdi, orig_rax;
	unsigned long rip, cs, eflags, rsp, ss;
};
#else
#error "stackscope's BPF program supports x86_64 only"
#endif

struct bpf_perf_event_data {
	struct pt_regs regs;
	__u64 sample_period;
	__u64 addr;
};

#define ENOENT 2
#define E2BIG 7
#define EFAULT 14
#define EEXIST 17
#define ENOMEM 12

#endif
