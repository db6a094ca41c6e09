#!/bin/sh
# Builds seed corpora from real recordings and runs every fuzz target for SECONDS each (default
# 600), one after another, or until RUNS executions when given. Installs what it needs: perf and
# gcc (apt), nightly Rust, cargo-fuzz.
# Usage: fuzz/run.sh [SECONDS [RUNS]]
set -eu
seconds=${1:-600}
runs=${2:--1}
fuzz=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$fuzz")
cd "$fuzz"

need_apt=""
command -v perf >/dev/null || need_apt="$need_apt linux-perf"
command -v gcc >/dev/null || need_apt="$need_apt gcc"
if [ -n "$need_apt" ]; then
    apt-get update && apt-get install -y $need_apt
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly
cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz

# Seeds: perf.data files of a real workload (without build-ids or perf's build-id cache, which
# another recording writing the cache at once can make perf abort on), the same run recorded
# by stackscope as JSON and folded stacks, and OSDK JSON written from that.
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
(cd "$root" && cargo build --release -p stackscope)
gcc -O2 -g -fno-omit-frame-pointer -o "$seeds/split" "$root/crates/stackscope/tests/workloads/split.c"
stackscope="$root/target/release/stackscope"
mkdir -p corpus/perf_data corpus/stackscope_json corpus/folded corpus/osdk_json corpus/profile_input
perf record -q -N -B -F 99 -g -o corpus/perf_data/split-fp.data -- "$seeds/split" 200 >/dev/null
perf record -q -N -B -F 99 --call-graph dwarf,1024 -o corpus/perf_data/split-dwarf.data -- "$seeds/split" 200 >/dev/null
# Compressed records (zstd), and the layout perf writes to a pipe (split prints nothing to
# stdout, which holds the recording there).
perf record -q -N -B -z -F 99 -g -o corpus/perf_data/split-fp-z.data -- "$seeds/split" 200 >/dev/null
perf record -q -N -B -F 99 -g -o - -- "$seeds/split" 200 > corpus/perf_data/split-fp-pipe.data
perf record -q -N -B -z -F 99 -g -o - -- "$seeds/split" 200 > corpus/perf_data/split-fp-pipe-z.data
"$stackscope" record -F 99 -o corpus/stackscope_json/split.json -- "$seeds/split" 200 >/dev/null
"$stackscope" report corpus/stackscope_json/split.json -o corpus/folded/split.folded
"$stackscope" report corpus/stackscope_json/split.json -o corpus/osdk_json/split.osdk.json --format osdk
cp corpus/stackscope_json/split.json corpus/folded/split.folded corpus/osdk_json/split.osdk.json \
    corpus/profile_input/
# Files a profiled process names: a JIT's perf map and jitdump, ELF files (the workload, stripped, with a
# debug link; a shared library), and MiniDebugInfo as objcopy and xz make it.
mkdir -p corpus/perf_map corpus/elf corpus/mini_debuginfo
printf '7f0000001000 40 jit_hot_loop\n0x7f0000002000 0x10 LazyCompile:*leafJs /app.js:3\n' \
    > corpus/perf_map/node.map
cp "$seeds/split" corpus/elf/split
# The head of a jitdump as Node writes it (in its working directory), when node is there: its
# first records, of every kind, without megabytes of code.
mkdir -p corpus/jitdump
if command -v node >/dev/null; then
    (cd "$seeds" && node --perf-prof -e 'let s = 0; for (let i = 0; i < 1e6; i++) s += i % 7;' &&
        head -c 65536 jit-*.dump > "$fuzz/corpus/jitdump/node.dump") || true
fi
objcopy --only-keep-debug "$seeds/split" "$seeds/split.debug"
strip --strip-all -o "$seeds/split.stripped" "$seeds/split"
objcopy --add-gnu-debuglink="$seeds/split.debug" "$seeds/split.stripped"
cp "$seeds/split.stripped" corpus/elf/split-debuglink
cp /lib/x86_64-linux-gnu/libm.so.6 corpus/elf/ 2>/dev/null || true
objcopy -S --remove-section .gdb_index --remove-section .comment "$seeds/split.debug" "$seeds/mini"
xz -fk "$seeds/mini"
cp "$seeds/mini.xz" corpus/mini_debuginfo/split.xz
head -c 4M /dev/zero | xz -0 > corpus/mini_debuginfo/zeros.xz

failed=""
for target in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$target"
    echo "== $target: ${seconds}s"
    # perf.data seeds are tens of kilobytes; text seeds a few.
    cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -runs="$runs" -max_len=262144 -rss_limit_mb=2048 -timeout=30 \
        -print_final_stats=1 || failed="$failed $target"
done
if [ -n "$failed" ]; then
    echo "crashed:$failed (inputs under fuzz/artifacts/)"
    exit 1
fi
