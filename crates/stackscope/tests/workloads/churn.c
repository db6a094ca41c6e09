/* One short-lived run: about argv[1] milliseconds (default 20) of CPU work in churn_work,
 * then exit. Run thousands of times in a loop, it makes the exec/exit churn of a build. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noipa)) unsigned long churn_work(unsigned long seed, double ms)
{
    double end = cpu_ms() + ms;
    while (cpu_ms() < end) {
        for (int i = 0; i < 20000; i++) {
            seed = seed * 6364136223846793005UL + 1442695040888963407UL;
            seed ^= seed >> 29;
        }
    }
    return seed;
}

int main(int argc, char **argv)
{
    double ms = argc > 1 ? atof(argv[1]) : 20;
    sink = churn_work((unsigned long)argc, ms);
    return 0;
}
