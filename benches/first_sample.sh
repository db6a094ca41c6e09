#!/usr/bin/env bash
# How soon a launched program runs under each profiler, in one run, on the same programs:
#   bpf        stackscope record --backend bpf (the default where eBPF runs): the perf source
#              samples the program from its exec while the kernel verifies the sampling program
#              and the unwind tables go in, then hands over; later library loads hold it until
#              their tables are in; cold = an empty table cache, warm = the cache the cold run
#              filled
#   perf_copy  stackscope record --backend perf (perf_event, stack copies)
#   perf       perf record --call-graph dwarf
# Programs: `true` (the whole recording: wall and CPU seconds, profiler and program together,
# as a user waits for it), a small C program and `rustc --version` (its librustc_driver and
# libLLVM are over 100 MB each). For the last two, the delay is the time from launching the
# profiler to the program's first line of output (printed as main starts) minus the same time
# without a profiler: what profiling adds before the program's first sample can be taken.
#
# Usage: benches/first_sample.sh        (as root; installs perf, time and gcc if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N rounds (default 5); medians are printed.
set -euo pipefail
trap 'echo "first_sample: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

need perf linux-perf
need /usr/bin/time time
need gcc gcc libc6-dev
install_needed
build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

cat >hello.c <<'EOF'
#include <stdio.h>
volatile unsigned long sink;
int main(void)
{
    puts("started");
    fflush(stdout);
    for (unsigned long i = 0; i < 20000000UL; i++)
        sink += i;
    return 0;
}
EOF
gcc -O2 hello.c -o hello

# Runs "$@" and prints the seconds from its launch to its first line of output.
first_line_after() {
    local t0
    t0=$(now)
    "$@" 2>>prof.stderr | {
        IFS= read -r _ || true
        now >first.ts
        cat >/dev/null
    }
    calc "$(cat first.ts) - $t0"
}

# The profiler's command line for tool $1, before the program.
profiler() {
    case $1 in
    bpf_cold | bpf_warm) echo "$STACKSCOPE" record --backend bpf -F 999 -o out.folded -- ;;
    perf_copy) echo "$STACKSCOPE" record --backend perf -F 999 -o out.folded -- ;;
    perf) echo perf record -q -F 999 --call-graph dwarf -o perf.data -- ;;
    none) ;;
    esac
}

tools="none bpf_cold bpf_warm perf_copy perf"
declare -A results
keep() { results[$1/$2]+="$3 "; }

for _ in $(seq "${RUNS:-5}"); do
    for tool in $tools; do
        # shellcheck disable=SC2046
        set -- $(profiler "$tool")
        if [ "$tool" = bpf_cold ]; then
            rm -rf "$work/cache"
        fi
        export XDG_CACHE_HOME=$work/cache
        if [ "$tool" != none ]; then
            /usr/bin/time -o true.time -f '%e %U %S' "$@" true 2>>prof.stderr
            keep true_wall "$tool" "$(awk '{ print $1 }' true.time)"
            keep true_cpu "$tool" "$(awk '{ print $2 + $3 }' true.time)"
        fi
        [ "$tool" != bpf_cold ] || rm -rf "$work/cache"
        keep hello "$tool" "$(first_line_after "$@" ./hello)"
        [ "$tool" != bpf_cold ] || rm -rf "$work/cache"
        keep rustc "$tool" "$(first_line_after "$@" rustc --version)"
    done
done

med() { tr ' ' '\n' | grep -v '^$' | median; }
echo "medians over ${RUNS:-5} rounds, seconds; hello and rustc: delay to the first line over the unprofiled run"
printf '%-10s %10s %10s %10s %10s\n' tool true_wall true_cpu hello rustc
for tool in $tools; do
    [ "$tool" != none ] || continue
    printf '%-10s %10s %10s %10s %10s\n' "$tool" \
        "$(med <<<"${results[true_wall/$tool]}")" "$(med <<<"${results[true_cpu/$tool]}")" \
        "$(calc "$(med <<<"${results[hello/$tool]}") - $(med <<<"${results[hello/none]}")")" \
        "$(calc "$(med <<<"${results[rustc/$tool]}") - $(med <<<"${results[rustc/none]}")")"
done
