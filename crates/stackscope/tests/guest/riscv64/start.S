/*
 * Entry of the riscv64 test kernel: QEMU (-bios none) starts every hart here in machine mode
 * with nothing set up; RAM, and so .bss, is zero. Each hart takes its own stack and calls
 * kmain (hart 0) or ap_main. The CFI marks _start as the outermost frame, and the frame pointer
 * is 0 there for frame-pointer walks.
 */
#define STACK_SIZE 16384
#define MAX_CPUS   8

#ifdef KERNEL_NO_EH_FRAME
        .cfi_sections .debug_frame
#endif

        .section .text.start, "ax"
        .globl _start
        .type _start, @function
_start:
        .cfi_startproc
        .cfi_undefined ra
        csrr a0, mhartid
        li t0, MAX_CPUS
        bgeu a0, t0, .Lpark
        la sp, cpu_stacks
        li t1, STACK_SIZE
        addi t2, a0, 1
        mul t1, t1, t2
        add sp, sp, t1
        li fp, 0
        bnez a0, 1f
        call kmain
        j .Lpark
1:      call ap_main
.Lpark:   wfi
        j .Lpark
        .cfi_endproc
        .size _start, . - _start

        .section .bss
        .balign 16
cpu_stacks:
        .skip MAX_CPUS * STACK_SIZE
