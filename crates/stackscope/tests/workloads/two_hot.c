/* Two hot static functions, alternating for argv[1] rounds, for the tests of names in
 * stripped binaries. Built with -DLIBRARY as a shared library whose two_hot_run does the
 * same (two_hot_main.c calls it). */
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long sink;

static __attribute__((noipa)) unsigned long hot_alpha(unsigned long n)
{
    unsigned long acc = 1;
    for (unsigned long i = 0; i < n; i++)
        acc = acc * 6364136223846793005UL + i; /* ALPHA_LINE */
    return acc;
}

static __attribute__((noipa)) unsigned long hot_beta(unsigned long n)
{
    unsigned long acc = 7;
    for (unsigned long i = 0; i < n; i++)
        acc ^= (acc << 7) + (i >> 3); /* BETA_LINE */
    return acc;
}

/* Slice lengths vary from round to round, so neither function is sampled in step. */
unsigned long two_hot_run(unsigned long rounds)
{
    for (unsigned long r = 0; r < rounds; r++) {
        sink += hot_alpha(200000 + r % 7 * 20000);
        sink += hot_beta(200000 + r % 5 * 30000);
    }
    return sink;
}

#ifndef LIBRARY
int main(int argc, char **argv)
{
    unsigned long rounds = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
    printf("%lu\n", two_hot_run(rounds));
    return 0;
}
#endif
