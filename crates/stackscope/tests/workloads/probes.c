/* The probes workload: calls malloc from two sites, parses numbers, opens and writes files
 * and fires a USDT probe, each a number of times given on the command line, then prints what
 * it did so the test compares the profile with the program's own account. The guarded USDT
 * probe fires only while a tool has raised its semaphore.
 * usage: probes SITE_A SITE_B PARSES OPENS WRITES TICKS
 *        probes loop   (calls malloc from alloc_site_a until killed, at most 60 s) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Probes with semaphores: a tool raises a probe's semaphore while attached, and the guarded
 * probe fires only then. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <time.h>
#include <unistd.h>

void *volatile sink;
volatile unsigned short stackscope_test_tick_semaphore __attribute__((section(".probes")));
volatile unsigned short stackscope_test_guarded_semaphore __attribute__((section(".probes")));

/* noipa: each site stays a frame of its own, calling malloc itself. */
__attribute__((noipa)) void alloc_site_a(size_t n)
{
	sink = malloc(n);
	free(sink);
}

__attribute__((noipa)) void alloc_site_b(size_t n)
{
	sink = malloc(n);
	free(sink);
}

__attribute__((noipa)) long parse_number(const char *s)
{
	return strtol(s, NULL, 10);
}

__attribute__((noipa)) int open_files(int n)
{
	int opened = 0;

	for (int i = 0; i < n; i++) {
		int fd = open("/dev/null", O_RDONLY);

		if (fd >= 0) {
			opened++;
			close(fd);
		}
	}
	return opened;
}

__attribute__((noipa)) int write_lines(int fd, int n)
{
	int written = 0;

	for (int i = 0; i < n; i++)
		written += write(fd, "line\n", 5) == 5;
	return written;
}

__attribute__((noipa)) void tick(int n)
{
	for (int i = 0; i < n; i++)
		DTRACE_PROBE1(stackscope_test, tick, i);
}

/* Fires the guarded probe n times if its semaphore is up; returns how often it fired. */
__attribute__((noipa)) int guarded_tick(int n)
{
	int fired = 0;

	for (int i = 0; i < n; i++) {
		if (stackscope_test_guarded_semaphore) {
			DTRACE_PROBE1(stackscope_test, guarded, i);
			fired++;
		}
	}
	return fired;
}

int main(int argc, char **argv)
{
	long n[6];
	int fd;

	if (argc == 2 && strcmp(argv[1], "loop") == 0) {
		time_t end = time(NULL) + 60;

		printf("looping\n");
		fflush(stdout);
		while (time(NULL) < end)
			alloc_site_a(32);
		return 0;
	}
	if (argc != 7) {
		fprintf(stderr, "usage: probes SITE_A SITE_B PARSES OPENS WRITES TICKS\n");
		return 2;
	}
	for (int i = 0; i < 6; i++)
		n[i] = parse_number(argv[i + 1]);
	for (long i = 0; i < n[0]; i++)
		alloc_site_a(16 + i % 64);
	for (long i = 0; i < n[1]; i++)
		alloc_site_b(16 + i % 64);
	for (long i = 6; i < 6 + n[2]; i++)
		sink = (void *)parse_number("42");
	fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return 1;
	int opened = open_files(n[3]);
	int written = write_lines(fd, n[4]);
	tick(n[5]);
	int guarded = guarded_tick(n[5]);
	printf("site_a %ld site_b %ld parses %ld opens %d writes %d ticks %ld guarded %d\n", n[0],
	       n[1], n[2] + 6, opened, written, n[5], guarded);
	return 0;
}
