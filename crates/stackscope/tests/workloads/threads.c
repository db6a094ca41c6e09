/* Two named worker threads, each running its own function for a fixed amount of work;
 * thread B does twice the work of thread A. main only waits.
 *
 * Usage: threads [ROUNDS [TRUTH_FILE]]. Work counts do not fix how CPU time splits on a
 * shared machine, so each worker reads its own thread CPU clock around its function, and at
 * the end the program writes to TRUTH_FILE what it measured: `thread_a_work NS`,
 * `thread_b_work NS` and `cpu NS` (the whole process), the split a profile must show. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink_a, sink_b;
static unsigned long long spent_a, spent_b;

static unsigned long long cpu_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}
static long rounds = 2000;

#define SPIN(n, seed)                                                  \
    do {                                                               \
        for (unsigned long i = 0; i < (n); i++) {                      \
            (seed) = (seed) * 6364136223846793005UL + 1442695040888963407UL; \
            (seed) ^= (seed) >> 29;                                    \
        }                                                              \
    } while (0)

__attribute__((noipa)) unsigned long thread_a_work(long r)
{
    unsigned long s = 1;
    for (long i = 0; i < r; i++)
        SPIN(200000UL, s);
    return s;
}

__attribute__((noipa)) unsigned long thread_b_work(long r)
{
    unsigned long s = 2;
    for (long i = 0; i < r; i++)
        SPIN(200000UL, s);
    return s;
}

static void *worker_a(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "worker_a");
    unsigned long long start = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    sink_a = thread_a_work(rounds);
    spent_a = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - start;
    return NULL;
}

static void *worker_b(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "worker_b");
    unsigned long long start = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    sink_b = thread_b_work(2 * rounds);
    spent_b = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - start;
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t a, b;
    if (argc > 1)
        rounds = atol(argv[1]);
    if (pthread_create(&a, NULL, worker_a, NULL) || pthread_create(&b, NULL, worker_b, NULL)) {
        perror("pthread_create");
        return 1;
    }
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    if (argc > 2) {
        FILE *f = fopen(argv[2], "w");
        if (!f) {
            perror(argv[2]);
            return 1;
        }
        fprintf(f, "thread_a_work %llu\nthread_b_work %llu\ncpu %llu\n", spent_a, spent_b,
                cpu_ns(CLOCK_PROCESS_CPUTIME_ID));
        if (fclose(f)) {
            perror(argv[2]);
            return 1;
        }
    }
    return 0;
}
