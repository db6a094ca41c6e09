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

/* The user-visible register layout (asm/ptrace.h), as perf_event and uprobe programs see it in
 * their ctx and as bpf_task_pt_regs() begins, with what the programs read of it by name:
 * REGS_USER (the registers are of user mode), REGS_IP, REGS_SP, REGS_FP, REGS_LR (aarch64
 * only), REGS_ARG(r, n) (a function's n-th integer argument at its entry, n < 4) and REGS_RET
 * (its return value). */
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8;
	unsigned long rax, rcx, rdx, rsi, rdi, orig_rax;
	unsigned long rip, cs, eflags, rsp, ss;
};
#define REGS_USER(r) (((r)->cs & 3) != 0)
#define REGS_IP(r) ((r)->rip)
#define REGS_SP(r) ((r)->rsp)
#define REGS_FP(r) ((r)->rbp)
#define REGS_ARG(r, n) ((n) == 0 ? (r)->rdi : (n) == 1 ? (r)->rsi : (n) == 2 ? (r)->rdx : (r)->rcx)
#define REGS_RET(r) ((r)->rax)
#elif defined(__TARGET_ARCH_arm64)
/* struct user_pt_regs, which the kernel's struct pt_regs begins with. */
struct pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};
/* PSR_MODE_MASK is 0xf, and EL0 (user mode) is mode 0. */
#define REGS_USER(r) (((r)->pstate & 0xf) == 0)
#define REGS_IP(r) ((r)->pc)
#define REGS_SP(r) ((r)->sp)
#define REGS_FP(r) ((r)->regs[29])
/* The link register, where a leaf's return address stays (aarch64 only). */
#define REGS_LR(r) ((r)->regs[30])
#define REGS_ARG(r, n) ((r)->regs[n])
#define REGS_RET(r) ((r)->regs[0])
#else
#error "stackscope's BPF program supports x86_64 and aarch64 only"
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
