/*
 * Entry of the x86-64 test kernel. QEMU enters `pvh_start` through the Xen PVH note in 32-bit
 * protected mode with paging off; application processors enter `ap_trampoline` (copied below
 * 1 MiB by start_others) in real mode after INIT-SIPI-SIPI. Both end in `start64`, which
 * gives each CPU its own stack and calls kmain (CPU 0) or ap_main (the others).
 */

#define SEL_CODE64 0x08
#define SEL_DATA   0x10
#define SEL_CODE32 0x18
#define STACK_SIZE 16384
#define MAX_CPUS   8

#ifdef KERNEL_NO_EH_FRAME
/* The frame-pointer build carries no .eh_frame at all, so unwinders must use the frame chain. */
        .cfi_sections .debug_frame
#endif

/* XEN_ELFNOTE_PHYS32_ENTRY (18): the physical address QEMU jumps to in 32-bit mode. */
        .pushsection .note.Xen, "a", @note
        .balign 4
        .long 4
        .long 8
        .long 18
        .asciz "Xen"
        .balign 4
        .quad pvh_start
        .balign 4
        .popsection

        .section .rodata
        .balign 16
gdt:
        .quad 0
        .quad 0x00af9a000000ffff        /* 64-bit code */
        .quad 0x00cf92000000ffff        /* flat data */
        .quad 0x00cf9a000000ffff        /* 32-bit code */
gdt_end:
        .balign 8
gdt_ptr:
        .word gdt_end - gdt - 1
        .long gdt

        .section .bss
        .balign 4096
pml4:   .skip 4096
pdpt:   .skip 4096
pd:     .skip 4 * 4096                  /* identity map of the first 4 GiB (the local APIC too) */
        .balign 16
        .globl cpu_stacks
cpu_stacks:
        .skip MAX_CPUS * STACK_SIZE
        .globl next_cpu
next_cpu:
        .long 0

        .section .text
        .code32
        .globl pvh_start
        .type pvh_start, @function
pvh_start:
        cli
        cld
        lgdt gdt_ptr
        ljmp $SEL_CODE32, $1f
1:      mov $SEL_DATA, %ax
        mov %ax, %ds
        mov %ax, %es
        mov %ax, %ss
        /* Zero .bss (page tables, stacks, the CPU counter). */
        mov $__bss_start, %edi
        mov $__bss_end, %ecx
        sub %edi, %ecx
        xor %eax, %eax
        rep stosb
        /* pml4[0] -> pdpt; pdpt[0..4] -> pd; pd: 2048 entries of 2 MiB pages. */
        mov $pdpt + 3, %eax
        mov %eax, pml4
        mov $pd + 3, %eax
        xor %ecx, %ecx
2:      mov %eax, pdpt(,%ecx,8)
        add $4096, %eax
        inc %ecx
        cmp $4, %ecx
        jb 2b
        mov $0x83, %eax                 /* present, writable, 2 MiB page */
        xor %ecx, %ecx
3:      mov %eax, pd(,%ecx,8)
        add $0x200000, %eax
        inc %ecx
        cmp $2048, %ecx
        jb 3b
        jmp enter_long_mode
        .size pvh_start, . - pvh_start

        .globl ap_start32
        .type ap_start32, @function
ap_start32:
        mov $SEL_DATA, %ax
        mov %ax, %ds
        mov %ax, %es
        mov %ax, %ss
        /* fall through */
enter_long_mode:
        mov %cr4, %eax
        or $0x20, %eax                  /* PAE */
        mov %eax, %cr4
        mov $pml4, %eax
        mov %eax, %cr3
        mov $0xc0000080, %ecx           /* EFER */
        rdmsr
        or $0x100, %eax                 /* LME */
        wrmsr
        mov %cr0, %eax
        or $0x80000001, %eax            /* PG | PE */
        mov %eax, %cr0
        ljmp $SEL_CODE64, $start64
        .size ap_start32, . - ap_start32

        .code64
        .globl start64
        .type start64, @function
start64:
        .cfi_startproc
        /* The outermost frame: no return address above it. */
        .cfi_undefined rip
        mov $SEL_DATA, %ax
        mov %ax, %ds
        mov %ax, %es
        mov %ax, %ss
        xor %eax, %eax
        mov %ax, %fs
        mov %ax, %gs
        mov $1, %eax
        lock xadd %eax, next_cpu(%rip)
        mov %eax, %edi                  /* the CPU index: first argument */
        lea 1(%rax), %rdx
        shl $14, %rdx                   /* (index + 1) * STACK_SIZE */
        lea cpu_stacks(%rip), %rsp
        add %rdx, %rsp
        xor %ebp, %ebp                  /* ends the frame-pointer chain */
        test %edi, %edi
        jnz 4f
        call kmain
        jmp 5f
4:      call ap_main
5:      cli
        hlt
        jmp 5b
        .cfi_endproc
        .size start64, . - start64

/*
 * Real-mode code for the application processors, copied to TRAMPOLINE (0x8000) and entered
 * with CS = 0x0800, IP = 0: only offsets within it are used before protected mode.
 */
        .code16
        .globl ap_trampoline, ap_trampoline_end
        .type ap_trampoline, @function
ap_trampoline:
        cli
        cld
        mov %cs, %ax
        mov %ax, %ds
        lgdtl ap_gdtr - ap_trampoline
        mov %cr0, %eax
        or $1, %eax
        mov %eax, %cr0
        ljmpl $SEL_CODE32, $ap_start32
        .balign 8
ap_gdtr:
        .word gdt_end - gdt - 1
        .long gdt
ap_trampoline_end:
        .size ap_trampoline, . - ap_trampoline

        .section .note.GNU-stack, "", @progbits
