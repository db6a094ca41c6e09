/* Two named worker threads, each running its own function for a fixed amount of work;
 * thread B does twice the work of thread A. main only waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink_a, sink_b;
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
    sink_a = thread_a_work(rounds);
    return NULL;
}

static void *worker_b(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "worker_b");
    sink_b = thread_b_work(2 * rounds);
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
    return 0;
}
