/* Names itself, as any process may (prctl(PR_SET_NAME)), with what a profile's writers must not
 * pass on raw: a terminal escape, XML's specials, a C0 control, folded's frame separator and a
 * newline. Then spins in spin_work until argv[1] seconds (default 30) have passed. */
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

/* The comm the tests look for: at most 15 bytes, the kernel's limit. */
#define NAME "\x1b[m<&evil\x01;x\n"

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
    if (prctl(PR_SET_NAME, NAME) != 0)
        return 2;
    while (time(NULL) < end)
        s = spin_work(s) + 1;
    sink = s;
    return 0;
}
