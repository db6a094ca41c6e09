/*
 * A tiny kernel for profiling tests: every CPU spins forever in work_loop, which spends a known
 * share of its time in spin_a (SHARE_A_PERMILLE) and the rest in spin_b. Both loops have the
 * same body shape, so time follows iteration counts. CPU 0 enters through kmain, the others
 * through ap_main; once all run, one line goes to the serial port.
 */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;

#define MAX_CPUS 8
#define TRAMPOLINE 0x8000UL
#define APIC_ICR_LOW ((volatile u32 *)0xfee00300UL)
#define APIC_ICR_HIGH ((volatile u32 *)0xfee00310UL)
#define FW_CFG_NB_CPUS 0x05
#define COM1 0x3f8

/* Loop iterations per unit of work; a round of work_loop is 1 to 64 units. */
#define UNIT 200
#define SHARE_A_PERMILLE 300

extern char ap_trampoline[], ap_trampoline_end[];
extern volatile u32 next_cpu;

static volatile u32 cpus_running;
static volatile u32 keep_spinning = 1;

/* One cache line per CPU, so the CPUs do not slow each other down. */
static struct {
    volatile u64 value;
    u8 pad[56];
} sink[MAX_CPUS];

/* Units of work done by each CPU: how fast the guest runs, read by a debugger. */
volatile u64 work_units[MAX_CPUS * 8];

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" : : "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port)
{
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static void serial_write(const char *s)
{
    for (; *s; s++)
        outb(COM1, (u8)*s);
}

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

/*
 * noipa: neither inlined into work_loop nor merged with each other. The accumulator lives on
 * the stack so that these leaves, too, get a frame in the frame-pointer build (gcc sets up no
 * frame in a leaf that does not touch the stack).
 */
__attribute__((noipa)) void spin_a(u32 cpu, u64 n)
{
    volatile u64 acc = sink[cpu].value;
    for (u64 i = 0; i < n; i++)
        acc += i;
    sink[cpu].value = acc;
}

__attribute__((noipa)) void spin_b(u32 cpu, u64 n)
{
    volatile u64 acc = sink[cpu].value;
    for (u64 i = 0; i < n; i++)
        acc ^= i;
    sink[cpu].value = acc;
}

/*
 * Each round's length varies at random (1 to 64 units, same split): a sampler stopping the
 * guest at a fixed rate would otherwise lock onto the phase of a fixed-length round and see
 * one function more often than its share.
 */
__attribute__((noipa)) void work_loop(u32 cpu)
{
    u64 seed = 0x9e3779b97f4a7c15ULL * (cpu + 1);
    while (keep_spinning) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        u64 units = 1 + (seed >> 58);
        spin_a(cpu, units * UNIT * SHARE_A_PERMILLE / 1000);
        spin_b(cpu, units * UNIT * (1000 - SHARE_A_PERMILLE) / 1000);
        work_units[cpu * 8] += units;
    }
}

__attribute__((noipa)) void ap_main(u32 cpu)
{
    __atomic_add_fetch(&cpus_running, 1, __ATOMIC_SEQ_CST);
    work_loop(cpu);
    serial_write("stackscope-guest: work_loop returned\n");
}

__attribute__((noipa)) void kmain(u32 cpu)
{
    u32 cpus = cpu_count();
    u8 *dst = (u8 *)TRAMPOLINE;
    for (char *src = ap_trampoline; src < ap_trampoline_end; src++)
        *dst++ = (u8)*src;
    __atomic_add_fetch(&cpus_running, 1, __ATOMIC_SEQ_CST);
    /* QEMU numbers APIC ids 0..n-1; start the others one at a time. */
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
    char line[] = "stackscope-guest: N cpus running\n";
    line[18] = (char)('0' + cpus);
    serial_write(line);
    work_loop(cpu);
    serial_write("stackscope-guest: work_loop returned\n");
}
