/* Spins in spin_work until killed or until argv[1] seconds (default 30) have passed, so a
 * forgotten instance cannot run forever. For attach and interrupt tests. With argv[2], first
 * names itself that, as any process may (prctl(PR_SET_NAME)): the tests give it names a
 * profile's writers must not pass on raw. */
#include <stdlib.h>
#include <sys/prctl.h>
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
    if (argc > 2 && prctl(PR_SET_NAME, argv[2]) != 0)
        return 2;
    while (time(NULL) < end)
        s = spin_work(s) + 1;
    sink = s;
    return 0;
}
