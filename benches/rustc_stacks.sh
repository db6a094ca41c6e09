#!/usr/bin/env bash
# Profiles the biggest program most users profile, a Rust compiler, with each way of taking
# stacks, in one run: `rustc -C opt-level=3` compiling a real crate (regex-syntax from the
# cargo registry, else a generated one), whose librustc_driver and libLLVM are each over
# 100 MB and whose query stacks are deep, on a thread with a large stack.
#   default    stackscope record, no flag (the backend it picks is named in its summary)
#   perf_copy  stackscope record --backend perf (perf_event + 32 KiB stack copy per sample,
#              unwound here)
#   read_on    stackscope record --read-stack-on (the same, reading on over the live stack)
#   bpf        stackscope record --backend bpf (user stacks unwound in the kernel)
#   perf_dw    perf record --call-graph dwarf (8 KiB stack copy, unwound by perf script
#              --no-inline: with inlined frames, perf's addr2line on librustc_driver takes
#              more than half an hour)
# For each: samples, the share of them whose stack reaches a program or thread entry
# (outermost frame `_start`, `main`, `__libc_start_call_main`, `start_thread`, `clone3`...,
# read from the folded output), the profiler's own CPU (plus perf script + collapse for
# perf), the kernel's timing of the sampling program (bpf), the kernel memory of the unwind
# tables where the profiler says it, and start-up: from launching the profiler to the
# compiler's first instruction.
#
# Usage: benches/rustc_stacks.sh        (as root; installs perf, time and inferno if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N rounds (default 1); TOOLS="bpf perf_copy" to run only some. The eBPF
#        backend's table cache is the user's (warm after the first round).
set -euo pipefail
trap 'echo "rustc_stacks: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

install_perf_tools

build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

# The crate: regex-syntax builds alone (no dependencies); else a generated one.
crate=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/regex-syntax-0.8.* 2>/dev/null | sort -V | tail -n1 || true)
if [ -n "$crate" ]; then
    src=$crate/src/lib.rs
else
    src=$work/generated.rs
    for i in $(seq 1 400); do
        printf 'pub fn f%d(v: &[u64]) -> u64 { v.iter().map(|x| x.wrapping_mul(%d).rotate_left(%d)).fold(0, |a, b| a ^ b) }\n' "$i" "$i" $((i % 63))
        printf 'pub struct S%d { pub a: Vec<String>, pub b: std::collections::HashMap<u64, String> }\n' "$i"
        printf 'impl S%d { pub fn g(&self) -> usize { self.a.iter().map(|s| s.len()).sum::<usize>() + self.b.len() } }\n' "$i"
    done >"$src"
fi
echo "crate: $src"
compile=(rustc --edition 2021 --crate-type lib -C opt-level=3 --cap-lints allow "$src" -o out.rlib)

cpu_of() { awk '{ print $1 + $2 }' "$1"; }
calc() { awk "BEGIN { printf \"%.3f\", $* }"; }
now() { date +%s.%N; }

# The compiler wrapped so that its CPU time lands in wl.time and the moment it starts in
# start.ts.
wrapped() {
    printf '%s\n' /bin/sh -c 'date +%s.%N > start.ts; exec /usr/bin/time -o wl.time -f "%U %S" "$@"' sh "$@"
}

# Samples (divided by $2) in folded file $1 outside the wrapper, and the share (%) of them
# whose outermost frame is an entry.
entry_stats() {
    awk -v unit="${2:-1}" '
        BEGIN { split("main _start _dl_start_user __libc_start_main __libc_start_main_impl __libc_start_call_main start_thread clone clone3 __clone __clone3", e, " ")
                for (i in e) entry[e[i]] = 1 }
        { n = $NF; sub(/ [0-9]+$/, ""); k = split($0, f, ";")
          if (f[1] == "sh" || f[1] == "time" || k < 2) next
          total += n; if (f[2] in entry) whole += n }
        END { printf "%.0f %.1f", total / unit, total ? 100 * whole / total : 0 }' "$1"
}

row() { printf '%-10s %8s %7s %9s %10s %10s %9s\n' "$@"; }
tools=${TOOLS:-default perf_copy read_on bpf perf_dw}
mapfile -t cmd < <(wrapped "${compile[@]}")

"${cmd[@]}"
echo "unprofiled compile: $(cpu_of wl.time) s of CPU"
row tool samples whole% own_cpu kernel_ms tables startup_s
for round in $(seq 1 "${RUNS:-1}"); do
    for tool in $tools; do
        post=0 unit=1 kernel=- tables=-
        t0=$(now)
        case $tool in
        default | perf_copy | read_on | bpf)
            how=(--backend perf)
            [ "$tool" = default ] && how=()
            [ "$tool" = read_on ] && how+=(--read-stack-on)
            [ "$tool" = bpf ] && how=(--backend bpf)
            /usr/bin/time -o prof.time -f '%U %S' \
                "$STACKSCOPE" record ${how[@]+"${how[@]}"} -F 999 -o out.folded -- "${cmd[@]}" \
                2>prof.stderr || { cat prof.stderr >&2; exit 1; }
            kernel=$(sed -n 's/^in-kernel sampling: .* \([0-9.]*\) ms of CPU in all$/\1/p' prof.stderr)
            tables=$(grep -o -i -E '[0-9.]+ [KMG]iB of (kernel memory|unwind tables?)' prof.stderr | head -n1 | awk '{ print $1 $2 }' || true)
            ;;
        perf_dw)
            /usr/bin/time -o prof.time -f '%U %S' \
                perf record -q -F 999 --call-graph dwarf -o perf.data -- "${cmd[@]}" 2>/dev/null
            /usr/bin/time -o post.time -f '%U %S' sh -c \
                'perf script --no-inline -i perf.data 2>/dev/null | inferno-collapse-perf > out.folded'
            post=$(cpu_of post.time)
            unit=1001001 # the cpu-clock period at 999 Hz
            ;;
        esac
        startup=$(calc "$(cat start.ts) - $t0")
        own=$(calc "$(cpu_of prof.time) - $(cpu_of wl.time) + $post")
        stats=$(entry_stats out.folded "$unit")
        row "$tool" "${stats% *}" "${stats#* }" "$own" "${kernel:--}" "${tables:--}" "$startup"
        if [ -n "${KEEP:-}" ]; then
            cp out.folded "rustc.$tool.$round.folded"
            [ -f prof.stderr ] && cp prof.stderr "rustc.$tool.$round.stderr"
        fi
    done
done
