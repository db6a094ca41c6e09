/* Keeps a secret in stack buffers while burning CPU: reads 48 hex digits (24 bytes) from
 * standard input, decodes them into a buffer in main's frame, and copies them into a buffer
 * in every frame of a short recursion whose leaf spins. For the test that no stack memory of
 * a profiled program reaches stackscope. Runs argv[1] seconds (default 30). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SECRET_LEN 24

volatile unsigned long sink;

__attribute__((noipa)) unsigned long burn(const volatile unsigned char *secret, int depth,
                                          unsigned long seed)
{
    volatile unsigned char copy[SECRET_LEN];
    for (int i = 0; i < SECRET_LEN; i++)
        copy[i] = secret[i];
    if (depth > 0)
        return burn(copy, depth - 1, seed) + copy[depth % SECRET_LEN];
    for (unsigned long i = 0; i < 2000000UL; i++) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        seed ^= seed >> 29;
    }
    return seed + copy[seed % SECRET_LEN];
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : 30;
    char hex[2 * SECRET_LEN + 2];
    volatile unsigned char secret[SECRET_LEN];
    if (!fgets(hex, sizeof hex, stdin) || strlen(hex) < 2 * SECRET_LEN) {
        fprintf(stderr, "secret: expected %d hex digits on standard input\n", 2 * SECRET_LEN);
        return 2;
    }
    for (int i = 0; i < SECRET_LEN; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            return 2;
        secret[i] = (unsigned char)byte;
    }
    time_t end = time(NULL) + limit;
    unsigned long s = 1;
    while (time(NULL) < end)
        s = burn(secret, 8, s) + 1;
    sink = s;
    return 0;
}
