/* Spins in spin_work until killed or until argv[1] seconds (default 30) have passed, so a
 * forgotten instance cannot run forever. For attach and interrupt tests. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noipa)) unsigned long spin_work(unsigned long seed)
{
    for (unsigned long i = 0; i < 1000000UL; i++) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        seed ^= seed >> 29;
    }
    return seed;
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : 30;
    time_t end = time(NULL) + limit;
    unsigned long s = 1;
    while (time(NULL) < end)
        s = spin_work(s) + 1;
    sink = s;
    return 0;
}
