#!/usr/bin/env bash
# What counting memory by stack costs an allocation-heavy program, in one run: the program's
# own allocation rate (allocations and frees per second, start-up left out) and CPU, and each
# tool's own CPU and peak memory, for
#   none        untraced
#   alloc       stackscope record --alloc   (bytes and calls per stack, counted in the kernel)
#   in-use      stackscope record --in-use  (each live block kept until freed)
#   sampled     stackscope record --alloc --sample-bytes 512K (one allocation per 512 KiB on
#               average, an estimate; the traps stay, the stack walks and map updates go)
#   heaptrack   heaptrack (LD_PRELOAD: every call unwound in the process, written to a file,
#               then heaptrack_print for the allocations per site)
#   memleak     bcc's memleak (-p, every call, stacks by frame pointers). bcc compiles its BPF
#               program at start-up against kernel headers, which this kernel ships none of: it
#               is pointed (BCC_KERNEL_SOURCE) at the distribution kernel's headers, merged
#               into one tree, enough for its user-space probes. Its -c starts the command
#               before the probes are in, so the program waits for memleak to attach.
# and whether each tool's count per site is the program's own. Medians over RUNS rounds, and
# each tool's slowdown (untraced rate / traced rate).
# The program (-O2, frame pointers kept so that memleak's stacks are whole too) allocates
# CALLS blocks of 16 to 271 bytes from three sites two frames below main, frees two of three
# at once and the rest at the end.
#
# Usage: benches/alloc_vs_peers.sh   (as root; installs gcc, heaptrack, bpfcc-tools and
#        linux-headers-amd64 if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; RUNS=N (default 3);
#        CALLS=N allocations per run (default 300000); KEEP=1 keeps the work dir.
set -euo pipefail
trap 'echo "alloc_vs_peers: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

runs=${RUNS:-3}
calls=${CALLS:-300000}

need gcc gcc libc6-dev
need heaptrack heaptrack
need /usr/bin/time time
need memleak-bpfcc bpfcc-tools
[ -n "$(ls -d /usr/src/linux-headers-*-common 2>/dev/null)" ] || need_apt+=(linux-headers-amd64)
install_needed
build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

cat > churn.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
static void **kept;
static long n_kept;
static unsigned long bytes[3], count[3];
void *volatile last;
/* The store after the call keeps malloc from being a tail call, so each site is a frame. */
#define SITE(i) \
	__attribute__((noipa)) void *site##i(size_t n) \
	{ \
		void *p = malloc(n); \
		bytes[i] += n; \
		count[i] += 1; \
		last = p; \
		return p; \
	}
SITE(0)
SITE(1)
SITE(2)
__attribute__((noipa)) void work(long calls)
{
	void *(*sites[3])(size_t) = { site0, site1, site2 };
	for (long i = 0; i < calls; i++) {
		void *p = sites[i % 3](16 + (i * 7) % 256);
		if (i % 3 == 0)
			kept[n_kept++] = p;
		else
			free(p);
	}
}
int main(int argc, char **argv)
{
	long calls = argc > 1 ? atol(argv[1]) : 300000;
	struct timespec a, b;
	struct rusage ru;
	kept = calloc(calls / 3 + 1, sizeof(void *));
	/* With a second argument: wait for that file before working (a tracer attaching). */
	while (argc > 2 && access(argv[2], F_OK) != 0)
		usleep(1000);
	clock_gettime(CLOCK_MONOTONIC, &a);
	work(calls);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double secs = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
	getrusage(RUSAGE_SELF, &ru);
	printf("allocs_per_sec %.0f cpu %.3f\n", calls / secs,
	       ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
	for (int s = 0; s < 3; s++)
		printf("site%d %lu bytes %lu calls\n", s, bytes[s], count[s]);
	for (long i = 0; i < n_kept; i++)
		free(kept[i]);
	return 0;
}
EOF
gcc -O2 -g -fno-omit-frame-pointer churn.c -o churn

memleak=$(command -v memleak-bpfcc || true)
# The distribution kernel's headers as one tree (its generated files over the common ones).
headers=$work/kernel-headers
mkdir -p "$headers"
common=$(ls -d /usr/src/linux-headers-*-common | sort -V | tail -1)
cp -rs "$common/." "$headers/"
cp -rsf "${common%-common}-amd64/." "$headers/" 2>/dev/null || true

# memleak -p on churn waiting for ./go: starts it, lets the program go once memleak says it
# attached, stops memleak once the program is done.
run_memleak() {
    rm -f go
    ./churn "$calls" go >memleak.out &
    local churn=$!
    BCC_KERNEL_SOURCE=$headers /usr/bin/time -f "time %e %U %S %M" -o memleak.time \
        "$memleak" -p "$churn" >memleak.err 2>&1 &
    local tool=$!
    for _ in $(seq 600); do
        grep -qs "Attaching to pid" memleak.err && break
        kill -0 "$tool" 2>/dev/null || break
        sleep 0.1
    done
    touch go
    wait "$churn"
    # memleak itself, GNU time's child (a background job ignores SIGINT: SIGTERM ends it).
    pkill -TERM -P "$tool" 2>/dev/null || true
    wait "$tool" || true
    grep -q "Attaching to pid" memleak.err
}

rate_of() { awk '/^allocs_per_sec/ { print $2 }' "$1"; }
prog_cpu() { awk '/^allocs_per_sec/ { print $4 }' "$1"; }
# GNU time's "elapsed user sys maxrss_kib" line, the last in FILE.
timed() { /usr/bin/time -f "time %e %U %S %M" -o "$1" "${@:2}"; }
tool_cpu() { awk '/^time/ { printf "%.3f", $3 + $4 - '"$2"' }' "$1"; }
peak_mib() { awk '/^time/ { printf "%.1f", $5 / 1024 }' "$1"; }

declare -A rates cpus peaks
add() { rates[$1]+="$2 "; cpus[$1]+="$3 "; peaks[$1]+="$4 "; }

for _ in $(seq "$runs"); do
    timed none.time ./churn "$calls" >none.out
    add none "$(rate_of none.out)" "$(prog_cpu none.out)" 0
    for mode in alloc in-use sampled; do
        flags=("--$mode")
        [ "$mode" = sampled ] && flags=(--alloc --sample-bytes 512K)
        timed "$mode.time" "$STACKSCOPE" record "${flags[@]}" -o "$mode.folded" -- ./churn "$calls" \
            >"$mode.out" 2>"$mode.err"
        # stackscope's own CPU: what GNU time counted less the program's, which it waited for.
        add "$mode" "$(rate_of "$mode.out")" "$(tool_cpu "$mode.time" "$(prog_cpu "$mode.out")")" \
            "$(peak_mib "$mode.time")"
    done
    rm -f heaptrack.churn.*
    timed heaptrack.time heaptrack -o heaptrack.churn ./churn "$calls" >heaptrack.out 2>heaptrack.err
    add heaptrack "$(rate_of heaptrack.out)" "$(tool_cpu heaptrack.time "$(prog_cpu heaptrack.out)")" \
        "$(peak_mib heaptrack.time)"
    if [ -n "$memleak" ] && run_memleak; then
        # memleak's CPU is its own: it did not wait for the program.
        add memleak "$(rate_of memleak.out)" "$(tool_cpu memleak.time 0)" "$(peak_mib memleak.time)"
    fi
done

printf "%-10s %14s %10s %12s %12s\n" tool "allocs/s" slowdown "tool CPU s" "peak MiB"
none_rate=$(printf "%s\n" ${rates[none]} | median)
for tool in none alloc in-use sampled heaptrack memleak; do
    [ -n "${rates[$tool]:-}" ] || continue
    rate=$(printf "%s\n" ${rates[$tool]} | median)
    printf "%-10s %14.0f %10s %12s %12s\n" "$tool" "$rate" "$(calc "$none_rate / $rate")" \
        "$(printf "%s\n" ${cpus[$tool]} | median)" "$(printf "%s\n" ${peaks[$tool]} | median)"
done
echo "(peak MiB: GNU time's largest resident set among the tool's process and the program it" \
    "waited for; stackscope's CPU is its own plus the kernel's in its process, not the traps" \
    "the program pays)"

# Bytes and calls per site: the program's own, stackscope's (folded stacks: the bytes), and
# heaptrack's allocations (it prints no bytes per stack).
heaptrack_file=$(ls heaptrack.churn.*)
heaptrack_print -f "$heaptrack_file" --flamegraph-cost-type allocations -F heaptrack.stacks >/dev/null
under() { awk -v f="$2" '{ n_fr = split($1, fr, ";"); for (i = 1; i <= n_fr; i++) if (fr[i] == f) { n += $NF; break } } END { print n + 0 }' "$1"; }
# heaptrack's stack lines end in the count after a space, its frames `name (file.c)`.
heaptrack_under() { awk -v f="$2" '{ c = $NF; n_fr = split($0, fr, ";"); for (i = 1; i <= n_fr; i++) if (fr[i] == f || index(fr[i], f " (") == 1) { n += c; break } } END { print n + 0 }' "$1"; }
printf "%-6s %12s %10s %16s %16s %16s %16s\n" site "own bytes" "own calls" "--alloc bytes" "--in-use bytes" \
    "sampled bytes" "heaptrack calls"
for s in 0 1 2; do
    read -r own_bytes own_calls < <(awk -v s="site$s" '$1 == s { print $2, $4 }' alloc.out)
    printf "%-6s %12s %10s %16s %16s %16s %16s\n" "site$s" "$own_bytes" "$own_calls" \
        "$(under alloc.folded "site$s")" "$(under in-use.folded "site$s")" \
        "$(under sampled.folded "site$s")" \
        "$(heaptrack_under heaptrack.stacks "site$s")"
done
echo "(--in-use: the program frees every block before it exits, so nothing is held at the end;" \
    "sampled: an estimate, within a few sqrt(bytes * 512K) of the truth)"
if [ -z "$memleak" ]; then
    echo "memleak: not installed (apt install bpfcc-tools)"
elif [ -z "${rates[memleak]:-}" ]; then
    echo "memleak: did not run: $(grep -v '^ ' memleak.err | tail -1)"
fi
