/*
 * A tiny kernel for profiling tests on x86-64, riscv64 and aarch64: every CPU spins forever in
 * work_loop, which calls spin_a for SHARE_A_PERMILLE of its iterations and spin_b for the
 * rest, and measures with the architecture's counter how much time each really took (the
 * share a sampler should find: under software emulation two loops of equal iteration counts
 * need not take equal time), in the rounds the host ran it through. CPU 0 enters through
 * kmain, the others through ap_main. Every CPU prints its measured times to the serial port
 * about every REPORT_TICKS, one line at a time under a lock: "stackscope-guest: cpuN a=HEX
 * b=HEX u=HEX t=HEX", with the units of work it has done (its own progress) and the counter
 * as it reported. The counter holds while the guest is stopped (by a debugger too), so
 * against the host's clock it tells how much of the time the guest was stopped.
 *
 * The architecture's part (board.h in x86_64/, riscv64/ or aarch64/) gives uart_putc,
 * counter_now, counter_hz, and start_others, which starts the other CPUs and returns how many
 * it started.
 */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;

#define MAX_CPUS 8
/*
 * Loop iterations per unit of work; a round of work_loop is 1 to 64 units. Reading the
 * counter is slow under QEMU (it may wait for QEMU's big lock, which the GDB stub holds while
 * it answers), so rounds are long: the reads stay a small part of the time measured, and a
 * sampler seldom finds a vCPU in one.
 */
#define UNIT 20000
#define SHARE_A_PERMILLE 300

/*
 * Every function a stack may show is called, never inlined nor cloned under another name
 * (gcc's noinline still allows a `.constprop` or `.isra` copy; clang knows no noipa).
 */
#ifdef __clang__
#define OWN_FRAME __attribute__((noinline))
#else
#define OWN_FRAME __attribute__((noipa))
#endif

/* Counted by each CPU as it enters; a board's start_others may wait on it. */
static volatile u32 cpus_running;

#include "board.h"

/* How often each CPU prints its measured times: five times a second of guest time. */
#define REPORT_TICKS (counter_hz() / 5)

static volatile u32 serial_lock;

/* One cache line per CPU, so the CPUs do not slow each other down. */
static struct {
    volatile u64 value;
    volatile u64 time_a, time_b, last_report;
    u64 best; /* fewest ticks a unit of work has taken */
    volatile u64 units; /* units of work done */
    u8 pad[16];
} per_cpu[MAX_CPUS];

static void serial_write(const char *s)
{
    for (; *s; s++)
        uart_putc(*s);
}

static void serial_hex(u64 v)
{
    char digits[17];
    for (int i = 15; i >= 0; i--) {
        digits[i] = "0123456789abcdef"[v & 15];
        v >>= 4;
    }
    digits[16] = 0;
    serial_write(digits);
}

static void lock(void)
{
    while (__atomic_exchange_n(&serial_lock, 1, __ATOMIC_ACQUIRE))
        ;
}

static void unlock(void)
{
    __atomic_store_n(&serial_lock, 0, __ATOMIC_RELEASE);
}

/* The accumulator lives on the stack so that these leaves have a frame to unwind. */
OWN_FRAME void spin_a(u32 cpu, u64 n)
{
    volatile u64 acc = per_cpu[cpu].value;
    for (u64 i = 0; i < n; i++)
        acc += i;
    per_cpu[cpu].value = acc;
}

OWN_FRAME void spin_b(u32 cpu, u64 n)
{
    volatile u64 acc = per_cpu[cpu].value;
    for (u64 i = 0; i < n; i++)
        acc ^= i;
    per_cpu[cpu].value = acc;
}

OWN_FRAME static void report(u32 cpu, u64 now)
{
    lock();
    serial_write("stackscope-guest: cpu");
    uart_putc((char)('0' + cpu));
    serial_write(" a=");
    serial_hex(per_cpu[cpu].time_a);
    serial_write(" b=");
    serial_hex(per_cpu[cpu].time_b);
    serial_write(" u=");
    serial_hex(per_cpu[cpu].units);
    serial_write(" t=");
    serial_hex(now);
    serial_write("\n");
    unlock();
}

/*
 * Each round's length varies at random (1 to 64 units, same split): a sampler stopping the
 * guest at a fixed rate would otherwise lock onto the phase of a fixed-length round.
 */
OWN_FRAME void work_loop(u32 cpu)
{
    u64 seed = 0x9e3779b97f4a7c15ULL * (cpu + 1);
    for (;;) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        u64 units = 1 + (seed >> 58);
        u64 a = units * UNIT * SHARE_A_PERMILLE / 1000;
        u64 b = units * UNIT * (1000 - SHARE_A_PERMILLE) / 1000;
        u64 t0 = counter_now();
        spin_a(cpu, a);
        u64 t1 = counter_now();
        spin_b(cpu, b);
        u64 t2 = counter_now();
        per_cpu[cpu].units += units;
        u64 per_unit = (t2 - t0) / units;
        if (per_cpu[cpu].best == 0 || per_unit < per_cpu[cpu].best)
            per_cpu[cpu].best = per_unit;
        /*
         * A round that took far longer than the fastest is one in which the host did not run
         * this vCPU for a while: the time it stood still went on the counter all the same,
         * whichever function it stood in, and a few such rounds would swamp the split of the
         * time the vCPU ran. Only rounds that ran through count.
         */
        if (per_unit <= 3 * per_cpu[cpu].best) {
            per_cpu[cpu].time_a += t1 - t0;
            per_cpu[cpu].time_b += t2 - t1;
        }
        if (t2 - per_cpu[cpu].last_report >= REPORT_TICKS) {
            per_cpu[cpu].last_report = t2;
            report(cpu, t2);
        }
    }
}

OWN_FRAME void ap_main(u32 cpu)
{
    __atomic_add_fetch(&cpus_running, 1, __ATOMIC_SEQ_CST);
    work_loop(cpu);
}

OWN_FRAME void kmain(u32 cpu)
{
    __atomic_add_fetch(&cpus_running, 1, __ATOMIC_SEQ_CST);
    u32 cpus = start_others(cpu);
    /* Wait for the others, or a second when fewer came up than started. */
    u64 start = counter_now();
    while (cpus_running < cpus && counter_now() - start < counter_hz())
        ;
    lock();
    serial_write("stackscope-guest: ");
    uart_putc((char)('0' + cpus_running));
    serial_write(" cpus running\n");
    unlock();
    work_loop(cpu);
}
