#!/usr/bin/env bash
# Turns one large `perf record --call-graph dwarf` recording into a flamegraph two ways and
# compares them: `perf script | inferno-collapse-perf | inferno-flamegraph` against
# `stackscope report perf.data -o b.svg`. Wall time and peak memory (maximum resident set
# size; for the pipeline its largest process and the sum of its three) of each, medians over
# RUNS rounds, and the ratio. Checks that both flamegraphs hold about the same number of
# samples and that ours has inlined frames.
#
# The recording is of the release `stackscope` binary (a large Rust binary with line tables
# and inlining info) rendering a large folded file ITER times: tens of thousands of samples.
#
# Usage: benches/report_vs_perf_script.sh   (as root; installs perf, time and inferno if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; RUNS=N rounds (default 3);
#        ITER=N renders recorded (default 15, about 1.5 s of CPU each); KEEP=1 keeps the work dir;
#        BENCH_CACHE=dir for tools installed by the bench (default ~/.cache/stackscope-bench).
set -euo pipefail
trap 'echo "report_vs_perf_script: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

need perf linux-perf
need /usr/bin/time time
install_needed
cache=${BENCH_CACHE:-$HOME/.cache/stackscope-bench}
export PATH="$HOME/.cargo/bin:$cache/bin:$PATH"
if ! command -v inferno-collapse-perf >/dev/null || ! command -v inferno-flamegraph >/dev/null; then
    cargo install --locked inferno --root "$cache"
fi

build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

svg_total() { grep -o '<title>all ([0-9,]* samples' "$1" | head -n1 | tr -dc '0-9'; }

# A large folded file for the recorded program to render: 300k random stacks.
awk 'BEGIN { srand(7); for (i = 0; i < 300000; i++) { d = 3 + int(rand() * 20); s = "prog";
    for (j = 0; j < d; j++) s = s ";fn_" int(rand() * (j + 3) * 4); print s, 1 + int(rand() * 100) } }' \
    >input.folded

echo "recording: perf record -F 999 --call-graph dwarf of $(basename "$STACKSCOPE") rendering a flamegraph ${ITER:-15} times"
perf record -q -F 999 --call-graph dwarf -o perf.data -- \
    sh -c 'for i in $(seq "$1"); do "$2" report input.folded -o render.svg 2>/dev/null; done' \
    sh "${ITER:-15}" "$STACKSCOPE" 2>/dev/null
samples=$(perf script -F tid -i perf.data 2>/dev/null | wc -l)
echo "perf.data: $(du -m perf.data | cut -f1) MB, $samples samples"

printf '%-5s %10s %10s %10s %12s %12s\n' round perf_s ours_s speedup perf_rss_MB ours_rss_MB
: >perf.wall; : >ours.wall; : >perf.rss; : >perf.rss_sum; : >ours.rss
for round in $(seq "${RUNS:-3}"); do
    t0=$(now)
    /usr/bin/time -f %M -o script.mem perf script -i perf.data 2>/dev/null |
        /usr/bin/time -f %M -o collapse.mem inferno-collapse-perf |
        /usr/bin/time -f %M -o flame.mem inferno-flamegraph >a.svg
    t1=$(now)
    /usr/bin/time -f %M -o ours.mem "$STACKSCOPE" report perf.data -o b.svg 2>ours.stderr ||
        { cat ours.stderr >&2; exit 1; }
    t2=$(now)
    perf_s=$(calc "$t1 - $t0")
    ours_s=$(calc "$t2 - $t1")
    # %M is in KiB.
    perf_rss=$(cat script.mem collapse.mem flame.mem | sort -g | tail -n1)
    perf_sum=$(cat script.mem collapse.mem flame.mem | awk '{ s += $1 } END { print s }')
    ours_rss=$(cat ours.mem)
    echo "$perf_s" >>perf.wall; echo "$ours_s" >>ours.wall
    echo "$perf_rss" >>perf.rss; echo "$perf_sum" >>perf.rss_sum; echo "$ours_rss" >>ours.rss
    printf '%-5s %10s %10s %9sx %12s %12s\n' "$round" "$perf_s" "$ours_s" \
        "$(calc "$perf_s / $ours_s")" "$(calc "$perf_rss / 1024")" "$(calc "$ours_rss / 1024")"
done

perf_med=$(median <perf.wall); ours_med=$(median <ours.wall)
echo
echo "median wall: perf script | inferno-collapse-perf | inferno-flamegraph ${perf_med}s," \
    "stackscope report ${ours_med}s: $(calc "$perf_med / $ours_med")x faster (goal: >= 10x)"
echo "median peak RSS: perf pipeline largest process $(calc "$(median <perf.rss) / 1024") MB" \
    "(all three together $(calc "$(median <perf.rss_sum) / 1024") MB), stackscope $(calc "$(median <ours.rss) / 1024") MB"

# Same samples: inferno weights perf's stacks by their period, so compare sample counts with
# the number of samples perf script lists.
ours_total=$(svg_total b.svg)
echo "samples: perf script lists $samples, our flamegraph holds $ours_total"
awk -v a="$samples" -v b="$ours_total" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 * a) }' ||
    { echo "report_vs_perf_script: sample totals differ by more than 1%" >&2; exit 1; }
"$STACKSCOPE" report perf.data -o b.json 2>/dev/null
inlined=$(grep -o '"inlined":true' b.json | wc -l)
echo "inlined frames in our profile: $inlined; perf's: $(grep -c '(inlined)' <(perf script -i perf.data 2>/dev/null | head -n 200000) || true) (inlined) lines in its first 200000"
[ "$inlined" -gt 0 ] || { echo "report_vs_perf_script: no inlined frames in our profile" >&2; exit 1; }
if [ -n "${KEEP:-}" ]; then echo "flamegraphs: $work/a.svg (perf) $work/b.svg (stackscope)"; fi
