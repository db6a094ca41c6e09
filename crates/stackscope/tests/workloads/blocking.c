/* A program that sleeps and burns CPU by turns, measuring what it did: for the off-CPU and
 * wall-clock profiles of `record --off-cpu` and `--wall`.
 *
 *     blocking wall ROUNDS       ROUNDS turns of a sleep of 8 ms in nap() and 2 ms of CPU burnt
 *                                in burn() (~80% asleep on an idle machine), each slice's
 *                                length drawn at random; prints `nap NS burn NS` at the end:
 *                                the wall time nap() spent in clock_nanosleep and the thread
 *                                CPU time burn() took
 *     blocking blocks ROUNDS SHORT_US LONG_US MIN_US
 *                                ROUNDS times: 5 sleeps of SHORT_US in short_nap(), then one of
 *                                LONG_US in long_nap(); prints `short NS short_over NS long NS`:
 *                                the wall time of all short sleeps, of those that took MIN_US or
 *                                more (a loaded machine stretches some), and of the long ones
 *     blocking loop              prints `ready`, then naps and burns until killed
 *
 * nap() and the others read the clock after the sleep returns, so none of them ends in a tail
 * call that would leave its frame off the stack. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned long long clock_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

/* Sleeps `ns` and returns the wall time the sleep took. Inlined into each caller, so that the
 * caller itself makes the call to clock_nanosleep and reads the clock after it. */
static inline __attribute__((always_inline)) unsigned long long sleep_ns(unsigned long long ns)
{
    unsigned long long start = clock_ns(CLOCK_MONOTONIC);
    struct timespec t = { .tv_sec = ns / 1000000000ULL, .tv_nsec = ns % 1000000000ULL };
    clock_nanosleep(CLOCK_MONOTONIC, 0, &t, NULL);
    return clock_ns(CLOCK_MONOTONIC) - start;
}

__attribute__((noipa)) unsigned long long nap(unsigned long long ns)
{
    return sleep_ns(ns);
}

__attribute__((noipa)) unsigned long long short_nap(unsigned long long ns)
{
    return sleep_ns(ns);
}

__attribute__((noipa)) unsigned long long long_nap(unsigned long long ns)
{
    return sleep_ns(ns);
}

volatile unsigned long sink;

/* Burns `ns` of this thread's CPU time; returns the CPU time it took. */
__attribute__((noipa)) unsigned long long burn(unsigned long long ns)
{
    unsigned long long start = clock_ns(CLOCK_THREAD_CPUTIME_ID), now;
    unsigned long x = sink;
    do {
        for (int i = 0; i < 20000; i++)
            x = x * 6364136223846793005UL + 1442695040888963407UL;
        now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    } while (now - start < ns);
    sink = x;
    return now - start;
}

/* Between half and one and a half times `mean`, at random (xorshift), so that no steady
 * sampling rate falls into step with the turns. */
static unsigned long long around(unsigned long long mean, unsigned long long *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return mean * (512 + (*state >> 54)) / 1024;
}

int main(int argc, char **argv)
{
    unsigned long long state = 0x9e3779b97f4a7c15ULL ^ (unsigned long long)clock_ns(CLOCK_MONOTONIC);
    const char *mode = argc > 1 ? argv[1] : "";

    if (strcmp(mode, "wall") == 0 && argc == 3) {
        int rounds = atoi(argv[2]);
        unsigned long long napped = 0, burnt = 0;
        for (int r = 0; r < rounds; r++) {
            napped += nap(around(8000000, &state));
            burnt += burn(around(2000000, &state));
        }
        printf("nap %llu burn %llu\n", napped, burnt);
        return 0;
    }
    if (strcmp(mode, "blocks") == 0 && argc == 6) {
        int rounds = atoi(argv[2]);
        unsigned long long short_ns = atoll(argv[3]) * 1000ULL, long_ns = atoll(argv[4]) * 1000ULL;
        unsigned long long min_ns = atoll(argv[5]) * 1000ULL;
        unsigned long long shorts = 0, over = 0, longs = 0;
        for (int r = 0; r < rounds; r++) {
            for (int i = 0; i < 5; i++) {
                unsigned long long took = short_nap(short_ns);
                shorts += took;
                if (took >= min_ns)
                    over += took;
            }
            longs += long_nap(long_ns);
        }
        printf("short %llu short_over %llu long %llu\n", shorts, over, longs);
        return 0;
    }
    if (strcmp(mode, "loop") == 0) {
        printf("ready\n");
        fflush(stdout);
        for (;;) {
            nap(around(8000000, &state));
            burn(around(2000000, &state));
        }
    }
    fprintf(stderr, "usage: blocking wall ROUNDS | blocking blocks ROUNDS SHORT_US LONG_US MIN_US | blocking loop\n");
    return 2;
}
