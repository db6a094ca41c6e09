/* QEMU's riscv64 `virt` machine, in machine mode (-bios none): every hart starts at once. */
#define UART0 ((volatile u8 *)0x10000000UL)     /* ns16550a transmit register */

static inline void uart_putc(char c) { *UART0 = (u8)c; }
/* The time CSR, which QEMU gives machine mode too. */
static inline u64 counter_now(void)
{
    u64 v;
    __asm__ volatile("rdtime %0" : "=r"(v));
    return v;
}

static inline u64 counter_hz(void) { return 10000000UL; } /* the ACLINT timer */

/* The other harts entered _start with hart 0; kmain waits for as many as may come. */
static inline u32 start_others(u32 cpu)
{
    (void)cpu;
    return MAX_CPUS;
}
