/* Two functions doing the same work in a 30/70 ratio of iterations.
 * main interleaves them in small slices so any sampling window sees the same ratio. */
#include <stdio.h>
#include <stdlib.h>

/* Same loop body in both functions; a macro rather than a helper so that no inlined
 * frame sits between func_a/func_b and the sample. */
#define SPIN(n, seed)                                                  \
    do {                                                               \
        for (unsigned long i = 0; i < (n); i++) {                      \
            (seed) = (seed) * 6364136223846793005UL + 1442695040888963407UL; \
            (seed) ^= (seed) >> 29;                                    \
        }                                                              \
    } while (0)

volatile unsigned long sink;
volatile unsigned long slice = 30000; /* volatile: keep the compiler from folding the work */

/* Called at the end of each slice so that func_a and func_b are not leaf functions: gcc gives
 * a leaf that needs no stack frame no frame pointer even under -fno-omit-frame-pointer, and a
 * frame-pointer walk starting in such a leaf skips its caller (main). */
__attribute__((noipa)) void slice_done(unsigned long seed)
{
    sink = seed;
}

__attribute__((noipa)) unsigned long func_a(unsigned long n, unsigned long seed)
{
    SPIN(n, seed);
    slice_done(seed);
    return seed;
}

__attribute__((noipa)) unsigned long func_b(unsigned long n, unsigned long seed)
{
    SPIN(n, seed);
    slice_done(seed);
    return seed;
}

int main(int argc, char **argv)
{
    /* Optional argument scales the amount of work (rounds); default is about 2 s of CPU. */
    long rounds = argc > 1 ? atol(argv[1]) : 4000;
    unsigned long s = 1, n = slice;
    for (long r = 0; r < rounds; r++) {
        s = func_a(3 * n, s) + 1;
        s = func_b(7 * n, s) + 1;
    }
    sink = s;
    return 0;
}
