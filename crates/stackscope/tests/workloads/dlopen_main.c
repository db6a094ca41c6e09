/* Loads the library named by argv[1] after start-up and spends its time in
 * lib_hot_function, called through a function pointer. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIBRARY [ROUNDS]\n", argv[0]);
        return 2;
    }
    long rounds = argc > 2 ? atol(argv[2]) : 4000;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    unsigned long (*hot)(unsigned long, unsigned long) =
        (unsigned long (*)(unsigned long, unsigned long))dlsym(lib, "lib_hot_function");
    if (!hot) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    unsigned long s = 1;
    for (long r = 0; r < rounds; r++)
        s = hot(300000UL, s) + 1;
    sink = s;
    return 0;
}
