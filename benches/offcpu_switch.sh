#!/usr/bin/env bash
# What counting off-CPU time costs a program that does little but switch: switches per second a
# ping-pong program keeps (two threads handing a byte to each other over two pipes, each
# blocking in read until the other writes; switches counted by getrusage, measured by the
# program over its round trips, start-up left out)
#   none        unprofiled
#   stackscope  stackscope record --off-cpu (at each switch out of a thread of the program:
#               kernel stack, user stack walked in the kernel, time until it is back)
#   bpftrace    bpftrace doing the same on tracepoint:sched:sched_switch: kstack and ustack
#               (frame pointers) stored per thread at the switch out, the time summed per
#               stack pair at the switch back in
# Medians over RUNS rounds, and the ratios to the unprofiled rate and stackscope / bpftrace.
# bcc's offcputime is not run: bcc compiles its program against kernel headers at start-up,
# and kernels without headers installed (as here) refuse it.
#
# Usage: benches/offcpu_switch.sh   (as root; installs bpftrace and gcc if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; RUNS=N (default 3);
#        ROUNDS=N round trips per run (default 100000); KEEP=1 keeps the work dir.
set -euo pipefail
trap 'echo "offcpu_switch: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

runs=${RUNS:-3}
rounds=${ROUNDS:-100000}

set_up_against_bpftrace

cat > pingpong.c <<'EOF'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
static int there[2], back[2];
static long rounds;
/* Waits for the byte, then hands it on. */
__attribute__((noipa)) void hand_on(int in, int out)
{
    char c;
    if (read(in, &c, 1) != 1 || write(out, &c, 1) != 1)
        exit(1);
}
static void *echo(void *arg)
{
    (void)arg;
    for (long i = 0; i < rounds; i++)
        hand_on(there[0], back[1]);
    return NULL;
}
int main(int argc, char **argv)
{
    rounds = argc > 1 ? atol(argv[1]) : 100000;
    pthread_t t;
    struct rusage r0, r1;
    struct timespec a, b;
    char c = 1;
    if (pipe(there) || pipe(back) || pthread_create(&t, NULL, echo, NULL))
        return 1;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (write(there[1], &c, 1) != 1)
        return 1;
    for (long i = 1; i < rounds; i++)
        hand_on(back[0], there[1]);
    if (read(back[0], &c, 1) != 1)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    getrusage(RUSAGE_SELF, &r1);
    pthread_join(t, NULL);
    double secs = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    long switches = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
    printf("switches %ld\nswitches_per_sec %.0f\n", switches, switches / secs);
    return 0;
}
EOF
# Frame pointers kept, so that bpftrace's ustack sees whole stacks too.
gcc -O2 -g -fno-omit-frame-pointer -pthread pingpong.c -o pingpong

rate_of() { awk '/^switches_per_sec/ { print $2 }' "$1"; }

declare -A rates
for _ in $(seq "$runs"); do
    ./pingpong "$rounds" >none.out
    rates[none]+="$(rate_of none.out) "
    "$STACKSCOPE" record --off-cpu -o stacks.folded -- ./pingpong "$rounds" \
        >stackscope.out 2>stackscope.err
    rates[stackscope]+="$(rate_of stackscope.out) "
    # The switch runs in the thread leaving the CPU (pid, tid, ustack, kstack are its); the
    # thread coming in is args->next_pid.
    bpftrace -e 'tracepoint:sched:sched_switch {
        if (pid == cpid) { @start[tid] = nsecs; @ks[tid] = kstack; @us[tid] = ustack; }
        $s = @start[args->next_pid];
        if ($s) { @[@ks[args->next_pid], @us[args->next_pid]] = sum(nsecs - $s);
                  delete(@start[args->next_pid]); }
    }' -c "./pingpong $rounds" >bpftrace.out 2>bpftrace.err
    rates[bpftrace]+="$(rate_of bpftrace.out) "
done

# stackscope saw the program block where it does: in hand_on's read, under main and echo.
blocked=$(awk '/;hand_on;/ { n += $NF } END { printf "%.3f", n / 1e6 }' stacks.folded)
echo "stackscope counted $blocked s off the CPU under hand_on; $(grep 'in-kernel' stackscope.err)"

rate_table "switches/s"
