/* Runs libtwo_hot.so's two hot static functions for argv[1] rounds. */
#include <stdio.h>
#include <stdlib.h>

unsigned long two_hot_run(unsigned long rounds);

int main(int argc, char **argv)
{
    unsigned long rounds = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
    printf("%lu\n", two_hot_run(rounds));
    return 0;
}
