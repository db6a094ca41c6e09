#!/usr/bin/env bash
# cargo-flamegraph with the real perf against cargo-flamegraph with stackscope-perf, in one run,
# on the same cargo project (tests/workloads/rust_deep.rs: 60-frame recursion with inlined
# leaves, release with debug info, no frame pointers), at cargo-flamegraph's own settings
# (-F 997 --call-graph dwarf,64000):
#   total   wall time of the whole `cargo flamegraph` (record + script + fold + render)
#   script  wall time and peak memory of `$PERF script --force -i perf.data` alone, the step
#           cargo-flamegraph users wait for once the program has finished
# Medians over RUNS rounds; ratios perf / stackscope-perf.
#
# Usage: benches/cargo_flamegraph.sh   (as root; installs perf, time and cargo-flamegraph if missing)
# Env:   STACKSCOPE_PERF=path/to/stackscope-perf to skip building it; RUNS=N (default 3);
#        ROUNDS=N work of the program (default 3000); KEEP=1 keeps the work dir.
set -euo pipefail
trap 'echo "cargo_flamegraph: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

runs=${RUNS:-3}
rounds=${ROUNDS:-3000}

need perf linux-perf
need /usr/bin/time time
install_needed
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo-flamegraph >/dev/null ||
    cargo install flamegraph --locked --quiet || cargo install flamegraph --quiet

build_unless_set STACKSCOPE_PERF stackscope-perf
make_work_dir
project="$work/deep"
mkdir -p "$project/src"
cp "$root/crates/stackscope/tests/workloads/rust_deep.rs" "$project/src/main.rs"
cat > "$project/Cargo.toml" <<'EOF'
[package]
name = "deep"
version = "0.1.0"
edition = "2021"

[profile.release]
debug = true
EOF
export CARGO_TARGET_DIR="$work/target"
(cd "$project" && cargo build --release --quiet)

# seconds and peak KiB of one command, from GNU time
measure() {
    /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/stderr" ||
        { cat "$work/stderr" >&2; return 1; }
    cat "$work/time"
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

declare -A total script_s script_kb
for tool in perf stackscope-perf; do
    bin=perf
    [ "$tool" = stackscope-perf ] && bin="$STACKSCOPE_PERF"
    for _ in $(seq "$runs"); do
        rm -f "$project/perf.data" "$project/flamegraph.svg"
        read -r t _ < <(cd "$project" && PERF="$bin" measure cargo flamegraph --bin deep -o flamegraph.svg -- "$rounds")
        grep -q "deep::leaf_a" "$project/flamegraph.svg" || { echo "$tool: flamegraph lacks leaf_a" >&2; exit 1; }
        read -r s kb < <(cd "$project" && measure "$bin" script --force -i perf.data)
        total[$tool]+="$t "
        script_s[$tool]+="$s "
        script_kb[$tool]+="$kb "
        echo "$tool: total ${t}s, script ${s}s ${kb} KiB" >&2
    done
done

med() { tr ' ' '\n' <<<"$1" | grep . | median; }
printf "%-16s %10s %10s %12s\n" tool total_s script_s script_peak_KiB
for tool in perf stackscope-perf; do
    printf "%-16s %10s %10s %12s\n" "$tool" "$(med "${total[$tool]}")" "$(med "${script_s[$tool]}")" "$(med "${script_kb[$tool]}")"
done
awk -v pt="$(med "${total[perf]}")" -v st="$(med "${total[stackscope-perf]}")" \
    -v ps="$(med "${script_s[perf]}")" -v ss="$(med "${script_s[stackscope-perf]}")" \
    -v pk="$(med "${script_kb[perf]}")" -v sk="$(med "${script_kb[stackscope-perf]}")" \
    'function r(a, b) { return b > 0 ? sprintf("%.1fx", a / b) : "inf" }
     BEGIN { printf "ratios perf/stackscope-perf: total %s, script time %s, script memory %s\n", r(pt, st), r(ps, ss), r(pk, sk) }'
