/* The allocations workload: allocates known bytes from known sites through glibc's allocator
 * family, frees a known part, and prints its own account so a test compares a memory profile
 * with it. Sizes vary with the seed, so no fixed number can pass by chance.
 * usage: allocs SEED CALLS OLD_MS|wait [arena]
 *   every site allocates CALLS times (at most 65536; sizes from SEED); the blocks of site_old
 *   are allocated first, OLD_MS milliseconds before the rest (with `wait`: after printing
 *   `ready`, once a line arrives on stdin), and every other one of them is freed after the
 *   rest; the program then exits at once. With `arena`, site_arena allocates through an
 *   allocator of the program's own too (arena_alloc, which mallocs a block with a header).
 * Prints `SITE_bytes N SITE_calls N SITE_held N SITE_held_calls N ...` for every site. */
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct site {
	const char *name;
	unsigned long bytes, calls, held, held_calls;
};

enum { OLD, MALLOC, CALLOC, REALLOC, MEMALIGN, ALIGNED, MMAP, ARENA, SITES };
static struct site sites[SITES] = {
	{ "site_old" },	     { "site_malloc" },	 { "site_calloc" }, { "site_realloc" },
	{ "site_memalign" }, { "site_aligned" }, { "site_mmap" },   { "site_arena" },
};

static unsigned long seed;
void *volatile sink;
static void *old_blocks[65536];
static size_t old_sizes[65536];

static size_t next_size(void)
{
	seed = seed * 6364136223846793005UL + 1442695040888963407UL;
	return 8 + (seed >> 33) % 3000;
}

static void allocated(int site, size_t n)
{
	sites[site].bytes += n;
	sites[site].calls += 1;
}

static void kept(int site, size_t n)
{
	sites[site].held += n;
	sites[site].held_calls += 1;
}

/* noipa: each site stays a frame of its own, calling the allocator itself. Every third block
 * of a site is kept, the others freed. */
__attribute__((noipa)) void site_old(long i)
{
	size_t n = next_size();

	old_blocks[i] = malloc(n);
	old_sizes[i] = n;
	allocated(OLD, n);
}

/* Frees every other block of site_old: a profiler attached after they were allocated sees
 * frees of blocks it never saw allocated. */
__attribute__((noipa)) void free_old(long calls)
{
	for (long i = 0; i < calls; i++) {
		if (i % 2)
			free(old_blocks[i]);
		else
			kept(OLD, old_sizes[i]);
	}
}

__attribute__((noipa)) void site_malloc(long i)
{
	size_t n = next_size();
	void *p = malloc(n);

	allocated(MALLOC, n);
	if (i % 3 == 0) {
		kept(MALLOC, n);
		sink = p;
	} else {
		free(p);
	}
}

__attribute__((noipa)) void site_calloc(long i)
{
	size_t each = 1 + next_size() % 64, count = 1 + i % 7;
	void *p = calloc(count, each);

	allocated(CALLOC, count * each);
	if (i % 3 == 0) {
		kept(CALLOC, count * each);
		sink = p;
	} else {
		free(p);
	}
}

/* Grows one block three times: each realloc frees the block before (realloc(NULL, n), the
 * first, allocates through malloc inside glibc, counted once). The last size is kept every
 * third time. */
__attribute__((noipa)) void site_realloc(long i)
{
	void *p = NULL;
	size_t n = 0;

	for (int step = 0; step < 3; step++) {
		n += next_size();
		p = realloc(p, n);
		allocated(REALLOC, n);
	}
	if (i % 3 == 0) {
		kept(REALLOC, n);
		sink = p;
	} else {
		free(p);
	}
}

__attribute__((noipa)) void site_memalign(long i)
{
	size_t n = next_size();
	void *p = NULL;

	if (posix_memalign(&p, 64, n) != 0)
		abort();
	allocated(MEMALIGN, n);
	if (i % 3 == 0) {
		kept(MEMALIGN, n);
		sink = p;
	} else {
		free(p);
	}
}

/* aligned_alloc and memalign are one function in glibc: both names are probed. */
__attribute__((noipa)) void site_aligned(long i)
{
	size_t n = 256 * (1 + next_size() % 16);
	void *p = i % 2 ? aligned_alloc(256, n) : memalign(256, n);

	allocated(ALIGNED, n);
	if (i % 3 == 0) {
		kept(ALIGNED, n);
		sink = p;
	} else {
		free(p);
	}
}

/* Anonymous mappings are allocations, unmapped two times of three; a file's mapping is not. */
__attribute__((noipa)) void site_mmap(long i)
{
	size_t n = 4096 * (1 + next_size() % 4);
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd = open("/proc/self/exe", O_RDONLY);
	void *file = fd >= 0 ? mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;

	if (p == MAP_FAILED)
		abort();
	if (file != MAP_FAILED)
		munmap(file, 4096);
	if (fd >= 0)
		close(fd);
	allocated(MMAP, n);
	if (i % 3 == 0) {
		kept(MMAP, n);
		sink = p;
	} else {
		munmap(p, n);
	}
}

/* An allocator of the program's own: each block carries a 64-byte header it mallocs with it. */
__attribute__((noipa)) void *arena_alloc(size_t n)
{
	char *block = malloc(n + 64);

	return block ? block + 64 : NULL;
}

__attribute__((noipa)) void arena_free(void *p)
{
	if (p)
		free((char *)p - 64);
}

__attribute__((noipa)) void site_arena(long i)
{
	size_t n = next_size();
	void *p = arena_alloc(n);

	allocated(ARENA, n);
	if (i % 3 == 0) {
		kept(ARENA, n);
		sink = p;
	} else {
		arena_free(p);
	}
}

static int with_arena;

__attribute__((noipa)) void run_sites(long calls)
{
	for (long i = 0; i < calls; i++) {
		if (with_arena)
			site_arena(i);
		site_malloc(i);
		site_calloc(i);
		site_realloc(i);
		site_memalign(i);
		site_aligned(i);
		site_mmap(i);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4 && !(argc == 5 && strcmp(argv[4], "arena") == 0)) {
		fprintf(stderr, "usage: allocs SEED CALLS OLD_MS|wait [arena]\n");
		return 2;
	}
	with_arena = argc == 5;
	seed = strtoul(argv[1], NULL, 10);
	long calls = atol(argv[2]);
	long old_ms = atol(argv[3]);
	struct timespec wait = { old_ms / 1000, (old_ms % 1000) * 1000000L };
	char line[16];

	if (calls < 0 || calls > 65536) {
		fprintf(stderr, "allocs: CALLS is 0 to 65536\n");
		return 2;
	}
	for (long i = 0; i < calls; i++)
		site_old(i);
	if (strcmp(argv[3], "wait") == 0) {
		/* Unbuffered, so that `ready` allocates no stdout buffer. */
		setvbuf(stdout, NULL, _IONBF, 0);
		printf("ready\n");
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	} else {
		nanosleep(&wait, NULL);
	}
	run_sites(calls);
	free_old(calls);
	for (int s = 0; s < SITES; s++)
		printf("%s_bytes %lu %s_calls %lu %s_held %lu %s_held_calls %lu ", sites[s].name,
		       sites[s].bytes, sites[s].name, sites[s].calls, sites[s].name, sites[s].held,
		       sites[s].name, sites[s].held_calls);
	printf("\n");
	fflush(stdout);
	return 0;
}
