/* Forks two children that each run their own function; the parent works too, then waits.
 * Prints "parent PID", "child1 PID" and "child2 PID" so callers can attribute samples. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile unsigned long sink;

#define SPIN(n, seed)                                                  \
    do {                                                               \
        for (unsigned long i = 0; i < (n); i++) {                      \
            (seed) = (seed) * 6364136223846793005UL + 1442695040888963407UL; \
            (seed) ^= (seed) >> 29;                                    \
        }                                                              \
    } while (0)

__attribute__((noipa)) unsigned long child_one_work(long r)
{
    unsigned long s = 1;
    for (long i = 0; i < r; i++)
        SPIN(200000UL, s);
    return s;
}

__attribute__((noipa)) unsigned long child_two_work(long r)
{
    unsigned long s = 2;
    for (long i = 0; i < r; i++)
        SPIN(200000UL, s);
    return s;
}

__attribute__((noipa)) unsigned long parent_work(long r)
{
    unsigned long s = 3;
    for (long i = 0; i < r; i++)
        SPIN(200000UL, s);
    return s;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 2000;
    printf("parent %d\n", (int)getpid());
    fflush(stdout);
    pid_t one = fork();
    if (one < 0) {
        perror("fork");
        return 1;
    }
    if (one == 0) {
        sink = child_one_work(rounds);
        _exit(0);
    }
    pid_t two = fork();
    if (two < 0) {
        perror("fork");
        return 1;
    }
    if (two == 0) {
        sink = child_two_work(rounds);
        _exit(0);
    }
    printf("child1 %d\nchild2 %d\n", (int)one, (int)two);
    fflush(stdout);
    sink = parent_work(rounds);
    int status, failed = 0;
    while (wait(&status) > 0)
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return failed;
}
