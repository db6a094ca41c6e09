/* QEMU's aarch64 `virt` machine at EL1, MMU off: the other CPUs wait powered off for PSCI. */
#define UART0 ((volatile u32 *)0x09000000UL)    /* PL011 data register */
#define PSCI_CPU_ON 0xc4000003UL

extern char _start[];


static inline void uart_putc(char c) { *UART0 = (u8)c; }

static inline u64 counter_now(void)
{
    u64 v;
    __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v));
    return v;
}

static inline u64 counter_hz(void)
{
    u64 v;
    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(v));
    return v;
}

/* PSCI CPU_ON through QEMU's HVC conduit, for each CPU that may exist, entering at _start. */
static inline u32 start_others(u32 cpu)
{
    u32 started = 1;
    for (u64 target = 0; target < MAX_CPUS; target++) {
        if (target == cpu)
            continue;
        register u64 x0 __asm__("x0") = PSCI_CPU_ON;
        register u64 x1 __asm__("x1") = target;
        register u64 x2 __asm__("x2") = (u64)_start;
        register u64 x3 __asm__("x3") = target;
        __asm__ volatile("hvc #0" : "+r"(x0) : "r"(x1), "r"(x2), "r"(x3) : "memory");
        if (x0 == 0)
            started++;
    }
    return started;
}
