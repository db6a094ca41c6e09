/* Spends most of its time in the kernel: kernel_work reads /dev/zero in large chunks. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char buf[1 << 16];

__attribute__((noipa)) long kernel_work(int fd, long r)
{
    long total = 0;
    for (long i = 0; i < r; i++) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            return -1;
        total += n;
    }
    return total;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000000;
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) {
        perror("/dev/zero");
        return 1;
    }
    long total = kernel_work(fd, rounds);
    close(fd);
    return total < 0;
}
