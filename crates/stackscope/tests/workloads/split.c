/* Two functions doing the same work, func_a about 30% and func_b about 70% of it, that measure
 * the CPU time they really take: iteration counts do not fix how the CPU spends its time, so a
 * test compares a profile with what the program measured, not with 30/70.
 *
 * Usage: split [ROUNDS [TRUTH_FILE [SLICE]]]. ROUNDS scales the work (default 4000, about 2 s of
 * CPU); SLICE is the mean work between two reads of the clock (default 30000), longer where a
 * read of the clock is slow (under emulation, a system call costs as much as a long slice), and
 * the truth file below is written as many times less often as the slice is longer.
 * With TRUTH_FILE, the program writes there, at start, every 100 ms or so of CPU time and at
 * exit, the thread CPU time spent in each function and in all since main started:
 *
 *     func_a NS
 *     func_b NS
 *     cpu NS
 *
 * Each write replaces the file whole (written aside, then renamed), so a reader never sees
 * half of it. Reading it at the start and end of a profile's window gives the window's truth. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Same loop body in both functions; a macro rather than a helper so that no inlined
 * frame sits between func_a/func_b and the sample. */
#define SPIN(n, seed)                                                  \
    do {                                                               \
        for (unsigned long i = 0; i < (n); i++) {                      \
            (seed) = (seed) * 6364136223846793005UL + 1442695040888963407UL; \
            (seed) ^= (seed) >> 29;                                    \
        }                                                              \
    } while (0)

/* The calling thread's CPU time in ns. A macro too, so that the clock is read from the
 * function's own frame: the time the read takes is sampled in that function. The clock's
 * calls also keep func_a and func_b from being leaf functions, which under
 * -fno-omit-frame-pointer gcc would leave without a frame pointer, so that a frame-pointer
 * walk from them skipped main. */
#define THREAD_CPU_NS(out)                                             \
    do {                                                               \
        struct timespec t_;                                            \
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t_);                   \
        (out) = (unsigned long long)t_.tv_sec * 1000000000ULL + (unsigned long long)t_.tv_nsec; \
    } while (0)

volatile unsigned long sink;
volatile unsigned long slice = 30000; /* volatile: keep the compiler from folding the work */
unsigned long long spent_a, spent_b;  /* thread CPU time inside func_a and func_b, in ns */

__attribute__((noipa)) unsigned long func_a(unsigned long n, unsigned long seed)
{
    unsigned long long start, end;
    THREAD_CPU_NS(start);
    SPIN(n, seed);
    THREAD_CPU_NS(end);
    spent_a += end - start;
    return seed;
}

__attribute__((noipa)) unsigned long func_b(unsigned long n, unsigned long seed)
{
    unsigned long long start, end;
    THREAD_CPU_NS(start);
    SPIN(n, seed);
    THREAD_CPU_NS(end);
    spent_b += end - start;
    return seed;
}

/* A slice length between half and one and a half times `slice`, pseudo-random (xorshift), so
 * that no steady sampling rate falls into step with the alternation of the two functions. */
static unsigned long slice_len(unsigned long *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return slice * (512 + (*state >> 54)) / 1024;
}

static void write_truth(const char *path, unsigned long long main_start)
{
    char tmp[4096];
    unsigned long long now;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fprintf(stderr, "split: truth file name too long: %s\n", path);
        exit(2);
    }
    THREAD_CPU_NS(now);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        exit(2);
    }
    fprintf(f, "func_a %llu\nfunc_b %llu\ncpu %llu\n", spent_a, spent_b, now - main_start);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 4000;
    const char *truth = argc > 2 ? argv[2] : NULL;
    if (argc > 3)
        slice = strtoul(argv[3], NULL, 10);
    unsigned long long main_start, written = 0;
    unsigned long s = 1, lengths = 0x9e3779b97f4a7c15UL;
    THREAD_CPU_NS(main_start);
    if (truth)
        write_truth(truth, main_start);
    for (long r = 0; r < rounds; r++) {
        s = func_a(3 * slice_len(&lengths), s) + 1;
        s = func_b(7 * slice_len(&lengths), s) + 1;
        if (truth && spent_a + spent_b - written >= 100000000ULL / 30000 * slice) {
            written = spent_a + spent_b;
            write_truth(truth, main_start);
        }
    }
    if (truth)
        write_truth(truth, main_start);
    sink = s;
    return 0;
}
