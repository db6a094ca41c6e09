/* A tiny JIT: copies hand-written x86-64 machine code into anonymous memory, makes it
 * executable, names it in /tmp/perf-PID.map as jit_hot_loop and calls it for about a second
 * from run_jit. The map file is left behind on purpose: profilers read it after the process
 * has exited; whoever runs this removes it. Prints `pid PID` first. With a second argument,
 * leaves in the map's place what a hostile process could: `fifo` (a named pipe), `zero` (a
 * link to /dev/zero) or `sparse` (a sparse file of 8 GiB). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned long (*jit_fn)(unsigned long n);

/* unsigned long jit_hot_loop(unsigned long n), n > 0: sums n, n-1, ..., 1 with a frame
 * pointer set up, as JITs that want to be unwound do. */
static const unsigned char code[] = {
    0x55,             /* push rbp */
    0x48, 0x89, 0xe5, /* mov rbp, rsp */
    0x48, 0x89, 0xf9, /* mov rcx, rdi */
    0x31, 0xc0,       /* xor eax, eax */
    /* loop: */
    0x48, 0x01, 0xc8, /* add rax, rcx */
    0x48, 0xff, 0xc9, /* dec rcx */
    0x75, 0xf8,       /* jnz loop */
    0x5d,             /* pop rbp */
    0xc3,             /* ret */
};

volatile unsigned long sink;

/* Calls the generated code in a loop; the sum keeps each call live and not a tail call. */
__attribute__((noipa)) unsigned long run_jit(jit_fn f, long calls)
{
    unsigned long s = 0;
    for (long i = 0; i < calls; i++)
        s += f(1000000UL);
    return s;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 1500;
    printf("pid %d\n", (int)getpid());
    fflush(stdout);

    size_t size = 4096;
    unsigned char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    memcpy(mem, code, sizeof code);
    if (mprotect(mem, size, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 2;
    }

    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map) {
        perror(path);
        return 2;
    }
    fprintf(map, "%lx %zx jit_hot_loop\n", (unsigned long)mem, sizeof code);
    fclose(map);

    sink = run_jit((jit_fn)mem, calls);

    const char *instead = argc > 2 ? argv[2] : NULL;
    if (instead) {
        unlink(path);
        int failed = 0;
        if (strcmp(instead, "fifo") == 0) {
            failed = mkfifo(path, 0644);
        } else if (strcmp(instead, "zero") == 0) {
            failed = symlink("/dev/zero", path);
        } else if (strcmp(instead, "sparse") == 0) {
            FILE *f = fopen(path, "w");
            failed = !f || ftruncate(fileno(f), 8L << 30) != 0;
            if (f)
                fclose(f);
        } else {
            fprintf(stderr, "unknown replacement %s\n", instead);
            return 2;
        }
        if (failed) {
            perror(path);
            return 2;
        }
    }
    return 0;
}
