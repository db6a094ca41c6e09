#!/usr/bin/env bash
# Builds stackscope and profiles an example program into flame.svg.
# The example (crates/stackscope/tests/workloads/split.c) is built without frame pointers;
# func_a and func_b do the same work, about 30/70 by iteration counts; each measures the CPU
# time it really takes, and the script prints that split next to the flamegraph's.
# Run as root (perf_event_open on another process needs it unless perf_event_paranoid allows).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/install-deps.sh build

echo "building stackscope (release)..."
cargo build --release -p stackscope --quiet
bin="${CARGO_TARGET_DIR:-$root/target}/release/stackscope"

out_dir="${CARGO_TARGET_DIR:-$root/target}/demo"
mkdir -p "$out_dir"
gcc -O2 -g -fomit-frame-pointer crates/stackscope/tests/workloads/split.c -o "$out_dir/split"

echo "profiling $out_dir/split ..."
"$bin" record -F 999 -o "$out_dir/flame.svg" -- "$out_dir/split" 4000 "$out_dir/split.truth"
echo "flamegraph written to $out_dir/flame.svg (open it in a browser)"

# The truth file holds `func_a NS`, `func_b NS` and `cpu NS` (all CPU time since main started);
# the flamegraph's <title>s hold `func_a (N samples, P%)`.
for f in func_a func_b; do
    measured=$(awk -v f="$f" '$1 == f { ns = $2 } $1 == "cpu" { cpu = $2 }
        END { printf "%.1f", 100 * ns / cpu }' "$out_dir/split.truth")
    profiled=$(grep -o "<title>$f ([0-9,]* samples, [0-9.]*%)" "$out_dir/flame.svg" |
        awk -F'[ %]' '{ sum += $(NF-1) } END { printf "%.1f", sum }')
    echo "$f: $measured% of CPU time measured by the program, $profiled% in the profile"
done
