#!/usr/bin/env bash
# Compares `stackscope record` with `perf record --call-graph dwarf` + inferno on the same
# workloads: samples taken, share of whole stacks (containing `main`), extra CPU time taken
# from the machine (the profiler's own and the workload's slowdown), and the time from the
# target's exit to a written flamegraph.
#
# Usage: benches/record_vs_perf.sh        (as root; installs perf, time and inferno if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N rounds per workload (default 3): single timings on a shared machine are noise,
#        so compare the per-round ratios, not one absolute figure.
set -euo pipefail
trap 'echo "record_vs_perf: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

workloads="$root/crates/stackscope/tests/workloads"

install_perf_tools

build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

gcc -O2 -g -fomit-frame-pointer "$workloads/split.c" -o split_nofp
rustc -C opt-level=3 -C debuginfo=1 -C force-frame-pointers=no "$workloads/rust_deep.rs" -o rust_deep

# CPU seconds (user + sys) from a /usr/bin/time -f '%U %S' file.
cpu_of() { awk '{ print $1 + $2 }' "$1"; }

# Total sample count and share (%) of frames named `main`, read from an inferno SVG: the
# root rectangle's title holds the total, each `main` rectangle's title its percentage.
svg_total() {
    grep -o '<title>all ([0-9,]* samples' "$1" | head -n1 | tr -dc '0-9'
}
svg_main_pct() {
    grep -o '<title>main ([^)]*)' "$1" | sed 's/.*, \([0-9.]*\)%)$/\1/' |
        awk '{ s += $1 } END { printf "%.2f", s + 0 }'
}

# Runs the workload "$@" wrapped so that its own CPU time lands in wl.time and the moment
# it exits in exit.ts.
wrapped() {
    printf '%s\n' /bin/sh -c '/usr/bin/time -o wl.time -f "%U %S" "$@"; status=$?; date +%s.%N > exit.ts; exit $status' sh "$@"
}

row() { printf '%-10s %-10s %8s %8s %9s %9s %9s %9s %9s\n' "$@"; }

run_one() {
    local name=$1
    shift
    local -a cmd
    mapfile -t cmd < <(wrapped "$@")

    # Unprofiled baseline.
    "${cmd[@]}"
    local base
    base=$(cpu_of wl.time)

    # perf: record, then script | collapse | flamegraph.
    /usr/bin/time -o perf_rec.time -f '%U %S' \
        perf record -q -F 999 --call-graph dwarf -o perf.data -- "${cmd[@]}" 2>/dev/null
    local perf_wl perf_exit
    perf_wl=$(cpu_of wl.time)
    perf_exit=$(cat exit.ts)
    /usr/bin/time -o perf_post.time -f '%U %S' sh -c \
        'perf script -i perf.data 2>/dev/null > perf.script && inferno-collapse-perf perf.script > perf.folded && inferno-flamegraph perf.folded > perf.svg'
    local perf_done perf_samples perf_main perf_cpu perf_slow perf_lat
    perf_done=$(now)
    perf_samples=$(grep -c -E '^[^[:space:]]' perf.script || true)
    perf_main=$(svg_main_pct perf.svg)
    # Profiler CPU = everything under perf record minus the workload, plus post-processing;
    # plus what the workload itself lost to being profiled.
    perf_cpu=$(calc "$(cpu_of perf_rec.time) - $perf_wl + $(cpu_of perf_post.time)")
    perf_slow=$(calc "$perf_wl - $base")
    perf_lat=$(calc "$perf_done - $perf_exit")

    # stackscope: straight to a flamegraph.
    /usr/bin/time -o ss.time -f '%U %S' \
        "$STACKSCOPE" record -F 999 -o stackscope.svg -- "${cmd[@]}" 2>ss.stderr ||
        { cat ss.stderr >&2; return 1; }
    local ss_done ss_wl ss_exit ss_samples ss_main ss_cpu ss_slow ss_lat
    ss_done=$(now)
    ss_wl=$(cpu_of wl.time)
    ss_exit=$(cat exit.ts)
    ss_samples=$(svg_total stackscope.svg)
    ss_main=$(svg_main_pct stackscope.svg)
    ss_cpu=$(calc "$(cpu_of ss.time) - $ss_wl")
    ss_slow=$(calc "$ss_wl - $base")
    ss_lat=$(calc "$ss_done - $ss_exit")

    row "$name" perf "$perf_samples" "$perf_main" "$perf_cpu" "$perf_slow" "$perf_lat" "" ""
    row "" stackscope "$ss_samples" "$ss_main" "$ss_cpu" "$ss_slow" "$ss_lat" \
        "$(calc "$ss_cpu / ($perf_cpu > 0 ? $perf_cpu : 0.001)")" \
        "$(calc "$ss_lat / ($perf_lat > 0 ? $perf_lat : 0.001)")"
    if [ -n "${KEEP:-}" ]; then
        cp perf.svg "$name.perf.svg"
        cp stackscope.svg "$name.stackscope.svg"
    fi
}

echo "own_cpu: CPU seconds of the profiler's processes (recording + post-processing), workload excluded"
echo "slowdown: workload CPU seconds under the profiler minus an unprofiled run of the same round (noisy)"
echo "cpu_ratio, lat_ratio: stackscope / perf for own_cpu and exit→svg (seconds from target exit to flamegraph)"
row workload tool samples "main%" "own_cpu" "slowdown" "exit→svg" "cpu_ratio" "lat_ratio"
for _ in $(seq "${RUNS:-3}"); do
    run_one split ./split_nofp
    run_one rust_deep ./rust_deep
done
