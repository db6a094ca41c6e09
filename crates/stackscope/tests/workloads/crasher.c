/* Works about a second in crash_work, then dies of SIGSEGV. */
#include <stdlib.h>

volatile unsigned long sink;
int *volatile null_pointer;

__attribute__((noipa)) unsigned long crash_work(long r)
{
    unsigned long s = 1;
    for (long i = 0; i < r; i++) {
        for (unsigned long j = 0; j < 300000UL; j++) {
            s = s * 6364136223846793005UL + 1442695040888963407UL;
            s ^= s >> 29;
        }
    }
    return s;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 2000;
    sink = crash_work(rounds);
    *null_pointer = 1; /* SIGSEGV */
    return 0;
}
