/* Many distinct stacks: each round recurses to a pseudo-random depth (1..400) through one of
 * two recursive functions before spinning, so a profile sees hundreds of unique stacks.
 * For stack-storage overflow tests. Runs argv[1] seconds (default 30). */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noipa)) unsigned long spin(unsigned long seed)
{
    for (unsigned long i = 0; i < 20000UL; i++) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        seed ^= seed >> 29;
    }
    return seed;
}

__attribute__((noipa)) unsigned long down_b(unsigned depth, unsigned long seed);

/* The addition after each call keeps the recursion from becoming a loop. */
__attribute__((noipa)) unsigned long down_a(unsigned depth, unsigned long seed)
{
    if (depth == 0)
        return spin(seed);
    return (depth & 1 ? down_b(depth - 1, seed) : down_a(depth - 1, seed)) + depth;
}

__attribute__((noipa)) unsigned long down_b(unsigned depth, unsigned long seed)
{
    if (depth == 0)
        return spin(seed ^ 1);
    return (depth % 3 ? down_a(depth - 1, seed) : down_b(depth - 1, seed)) + depth;
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : 30;
    time_t end = time(NULL) + limit;
    unsigned long s = 1;
    while (time(NULL) < end) {
        unsigned depth = 1 + (unsigned)((s >> 17) % 400);
        s = down_a(depth, s) + 1;
    }
    sink = s;
    return 0;
}
