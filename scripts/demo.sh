#!/usr/bin/env bash
# Builds stackscope and profiles an example program into flame.svg.
# The example (crates/stackscope/tests/workloads/split.c) is built without frame pointers;
# func_a and func_b do the same work 30/70, so the flamegraph should show main with func_b
# about 70% wide and func_a about 30%.
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
"$bin" record -F 999 -o "$out_dir/flame.svg" -- "$out_dir/split"
echo "flamegraph written to $out_dir/flame.svg (open it in a browser)"
