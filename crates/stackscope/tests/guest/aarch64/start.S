/*
 * Entry of the aarch64 test kernel: QEMU starts CPU 0 here at EL1 with the MMU off, and kmain
 * starts the others here through PSCI. Each CPU takes its own stack (by its MPIDR affinity 0)
 * and calls kmain (CPU 0) or ap_main. The CFI marks _start as the outermost frame, and the
 * final frame record does for frame-pointer walks.
 */
#define STACK_SIZE 16384
#define MAX_CPUS   8

#ifdef KERNEL_NO_EH_FRAME
        .cfi_sections .debug_frame
#endif

        .section .text.start, "ax"
        .globl _start
        .type _start, %function
_start:
        .cfi_startproc
        .cfi_undefined x30
        mrs x0, mpidr_el1
        and x0, x0, #0xff
        cmp x0, #MAX_CPUS
        b.hs .Lpark
        adrp x1, cpu_stacks
        add x1, x1, :lo12:cpu_stacks
        add x2, x0, #1
        mov x3, #STACK_SIZE
        madd x1, x2, x3, x1
        mov sp, x1
        /* The final frame record, {0, 0}, as AAPCS64 ends a frame chain. */
        stp xzr, xzr, [sp, #-16]!
        mov x29, sp
        cbnz x0, 1f
        bl kmain
        b .Lpark
1:      bl ap_main
.Lpark:   wfe
        b .Lpark
        .cfi_endproc
        .size _start, . - _start

        .section .bss
        .balign 16
cpu_stacks:
        .skip MAX_CPUS * STACK_SIZE
