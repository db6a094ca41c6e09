#!/usr/bin/env bash
# What a malloc uprobe costs the probed program, in one run: calls per second a malloc-heavy
# program keeps (measured by the program over its calls, start-up left out)
#   none        unprobed
#   stackscope  stackscope record --event uprobe:libc:malloc (stack unwound in the kernel and
#               counted per stack at each call)
#   bpftrace    bpftrace counting the same probe per user stack: @[ustack] = count()
# Medians over RUNS rounds, and the ratios to the unprobed rate and stackscope / bpftrace.
# The program (-O2, frame pointers kept so that bpftrace's ustack sees whole stacks too) calls
# malloc and free CALLS times from three call sites, two frames below main.
#
# Usage: benches/probe_malloc.sh   (as root; installs bpftrace and gcc if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; RUNS=N (default 3);
#        CALLS=N malloc calls per run (default 1000000); KEEP=1 keeps the work dir.
set -euo pipefail
trap 'echo "probe_malloc: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

runs=${RUNS:-3}
calls=${CALLS:-1000000}

set_up_against_bpftrace

cat > mallocs.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void *volatile sink;
__attribute__((noipa)) void site(int which, size_t n) { sink = malloc(n + which); free(sink); }
__attribute__((noipa)) void work(long calls) {
    for (long i = 0; i < calls; i++) site(i % 3, 16 + i % 256);
}
int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    work(calls);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("calls_per_sec %.0f\n", calls / secs);
    return 0;
}
EOF
gcc -O2 -g -fno-omit-frame-pointer mallocs.c -o mallocs

libc=$(ldd ./mallocs | awk '/libc\.so/ { print $3 }')
rate_of() { awk '/^calls_per_sec/ { print $2 }' "$1"; }

declare -A rates
for _ in $(seq "$runs"); do
    ./mallocs "$calls" >none.out
    rates[none]+="$(rate_of none.out) "
    "$STACKSCOPE" record --event uprobe:libc:malloc -o stacks.folded -- ./mallocs "$calls" \
        >stackscope.out 2>stackscope.err
    rates[stackscope]+="$(rate_of stackscope.out) "
    # The same probe, stacks counted in a map as stackscope does; only the program's calls.
    bpftrace -e "uprobe:$libc:malloc /pid == cpid/ { @[ustack] = count(); }" \
        -c "./mallocs $calls" >bpftrace.out 2>bpftrace.err
    rates[bpftrace]+="$(rate_of bpftrace.out) "
done

# Both tools saw the program's calls: stackscope's three sites hold them all.
counted=$(awk '/;site;/ { n += $NF } END { print n + 0 }' stacks.folded)
echo "stackscope counted $counted malloc calls under site (the program made $calls)"

rate_table "calls/s"
