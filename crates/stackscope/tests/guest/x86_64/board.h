/*
 * QEMU's x86-64 `pc` machine, entered through the PVH note: CPU 0 runs kmain, and
 * start_others wakes the others with INIT-SIPI-SIPI through the local APIC, one at a time.
 */
#define TRAMPOLINE 0x8000UL
#define APIC_ICR_LOW ((volatile u32 *)0xfee00300UL)
#define APIC_ICR_HIGH ((volatile u32 *)0xfee00310UL)
#define FW_CFG_NB_CPUS 0x05
#define COM1 0x3f8

extern char ap_trampoline[], ap_trampoline_end[];

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" : : "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port)
{
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static inline void uart_putc(char c) { outb(COM1, (u8)c); }

/*
 * The TSC. Under TCG, QEMU derives it from the host's TSC while the guest runs and holds it
 * while the guest is stopped (by a debugger too), so it measures the time a vCPU had.
 */
static inline u64 counter_now(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return (u64)hi << 32 | lo;
}

/*
 * The TSC runs at the host's rate, which the guest has no cheap way to learn: a nominal 2 GHz
 * (hosts run theirs at 1 to 5 GHz) sets only how often CPUs report, and the CPUs are started
 * one after the other, so kmain never waits on it.
 */
static inline u64 counter_hz(void) { return 2000000000UL; }

static u32 cpu_count(void)
{
    outw(0x510, FW_CFG_NB_CPUS);
    u32 n = inb(0x511);
    n |= (u32)inb(0x511) << 8;
    if (n < 1)
        n = 1;
    return n > MAX_CPUS ? MAX_CPUS : n;
}

static void pause_a_little(u32 n)
{
    for (volatile u32 i = 0; i < n; i++)
        __asm__ volatile("pause");
}

static void send_ipi(u32 apic_id, u32 command)
{
    *APIC_ICR_HIGH = apic_id << 24;
    *APIC_ICR_LOW = command;
    while (*APIC_ICR_LOW & (1u << 12)) /* delivery pending */
        ;
}

/* Copies the real-mode trampoline below 1 MiB and starts each other CPU there in turn. */
static u32 start_others(u32 cpu)
{
    (void)cpu;
    u32 cpus = cpu_count();
    u8 *dst = (u8 *)TRAMPOLINE;
    for (char *src = ap_trampoline; src < ap_trampoline_end; src++)
        *dst++ = (u8)*src;
    /* QEMU numbers APIC ids 0..n-1. */
    for (u32 id = 1; id < cpus; id++) {
        send_ipi(id, 0x4500); /* INIT */
        pause_a_little(10000);
        for (int i = 0; i < 2; i++) {
            send_ipi(id, 0x4600 | (TRAMPOLINE >> 12)); /* STARTUP */
            pause_a_little(1000);
        }
        while (cpus_running < id + 1)
            __asm__ volatile("pause");
    }
    return cpus;
}
