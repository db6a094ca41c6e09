#!/usr/bin/env bash
# What profiling costs the machine, in one run, on the same workloads and at 999 Hz:
#   bpf       stackscope record --backend bpf (stacks counted and user stacks unwound in the kernel)
#   perf_copy stackscope record (perf_event + 32 KiB stack copy per sample, unwound in stackscope)
#   perf_dw   perf record --call-graph dwarf (stack copy, unwound by perf script)
#   perf_fp   perf record -g (frame pointers; for reference: cheap, but broken stacks here)
# For each: the workload's CPU time over an unprofiled run of it (slowdown; for bpf this is
# where the in-kernel work is charged), the profiler's own CPU (recording, plus perf script +
# inferno-collapse-perf for perf, which stackscope does not need), their sum (extra), and the
# share of the workload's samples whose stack reaches main (whole stacks). For bpf it also
# prints the kernel's own timing of the sampling program (BPF_ENABLE_STATS, as stackscope
# reports it): all its runs on every CPU, against the workload's unprofiled CPU time. That is
# the cost to the profiled program that the slowdown column measures too coarsely to see.
# Workloads: split.c built -O2 -fomit-frame-pointer and rust_deep.rs (release, no frame
# pointers), each a fixed amount of work.
#
# Usage: benches/overhead_bpf.sh        (as root; installs perf, time and inferno if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N rounds (default 3); medians and ratios to perf_dw are printed at the end;
#        TOOLS="bpf perf_dw" to run only some of them (perf_dw is the ratios' reference).
set -euo pipefail
trap 'echo "overhead_bpf: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
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
calc() { awk "BEGIN { printf \"%.3f\", $* }"; }

# Runs the workload "$@" so that its own CPU time lands in wl.time.
wrapped() {
    printf '%s\n' /bin/sh -c '/usr/bin/time -o wl.time -f "%U %S" "$@"' sh "$@"
}

# Samples of comm $2 in folded file $1, and the share (%) of them with a frame named $3; $4
# divides the counts (inferno-collapse-perf weighs each sample by its period, in ns).
folded_stats() {
    awk -v comm="$2" -v main="$3" -v unit="${4:-1}" '
        { n = $NF; split($0, f, ";"); if (f[1] != comm) next; total += n
          sub(/ [0-9]+$/, ""); k = split($0, g, ";")
          for (i = 2; i <= k; i++) if (g[i] == main) { whole += n; break } }
        END { printf "%.0f %.2f", total / unit, total ? 100 * whole / total : 0 }' "$1"
}

tools=${TOOLS:-bpf perf_copy perf_dw perf_fp}

row() { printf '%-10s %-9s %8s %7s %9s %9s %9s %9s\n' "$@"; }

# results[workload/tool/field] = space-separated values, one per round.
declare -A results
keep() { results[$1/$2/$3]+="$4 "; }

run_one() {
    local name=$1 main=$2
    shift 2
    local -a cmd
    mapfile -t cmd < <(wrapped "$@")

    "${cmd[@]}"
    local base
    base=$(cpu_of wl.time)

    local tool own post unit wl samples main_pct stats
    for tool in $tools; do
        post=0 unit=1
        case $tool in
        bpf | perf_copy)
            local backend=bpf
            [ "$tool" = perf_copy ] && backend=perf
            /usr/bin/time -o prof.time -f '%U %S' \
                "$STACKSCOPE" record --backend "$backend" -F 999 -o out.folded -- "${cmd[@]}" \
                2>prof.stderr || { cat prof.stderr >&2; return 1; }
            ;;
        perf_dw | perf_fp)
            local -a how=(--call-graph dwarf)
            [ "$tool" = perf_fp ] && how=(-g)
            /usr/bin/time -o prof.time -f '%U %S' \
                perf record -q -F 999 "${how[@]}" -o perf.data -- "${cmd[@]}" 2>/dev/null
            /usr/bin/time -o post.time -f '%U %S' sh -c \
                'perf script -i perf.data 2>/dev/null | inferno-collapse-perf > out.folded'
            post=$(cpu_of post.time)
            unit=1001001 # the cpu-clock period at 999 Hz
            ;;
        esac
        if [ "$tool" = bpf ]; then
            local kernel_ms
            kernel_ms=$(sed -n 's/^in-kernel sampling: .* \([0-9.]*\) ms of CPU in all$/\1/p' prof.stderr)
            keep "$name" bpf kernel_ms "${kernel_ms:-0}"
            keep "$name" bpf per_run "$(sed -n 's/^in-kernel sampling: [0-9]* runs, \([0-9.]*\) µs each.*/\1/p' prof.stderr)"
        fi
        wl=$(cpu_of wl.time)
        own=$(calc "$(cpu_of prof.time) - $wl")
        stats=$(folded_stats out.folded "$name" "$main" "$unit")
        samples=${stats% *}
        main_pct=${stats#* }
        local slow extra
        slow=$(calc "$wl - $base")
        extra=$(calc "$slow + $own + $post")
        row "$name" "$tool" "$samples" "$main_pct" "$slow" "$own" "$post" "$extra"
        keep "$name" "$tool" slow "$slow"
        keep "$name" "$tool" own "$own"
        keep "$name" "$tool" post "$post"
        keep "$name" "$tool" extra "$extra"
        keep "$name" "$tool" main "$main_pct"
        keep "$name" "$tool" base "$base"
        if [ -n "${KEEP:-}" ]; then cp out.folded "$name.$tool.folded"; fi
    done
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "slowdown: workload CPU s profiled minus unprofiled (same round); own: profiler's CPU s while"
echo "recording; post: perf script + collapse CPU s; extra = slowdown + own + post; main%: share of"
echo "the workload's samples whose stack reaches main (whole stacks)"
row workload tool samples "main%" slowdown own post extra
for _ in $(seq "${RUNS:-3}"); do
    run_one split_nofp main ./split_nofp 6000
    run_one rust_deep rust_deep::main ./rust_deep 6000
done

echo
echo "medians over ${RUNS:-3} rounds; extra% = extra / unprofiled workload CPU; ratio = extra / perf_dw's extra"
printf '%-10s %-9s %7s %9s %9s %9s %9s %7s %7s\n' workload tool "main%" slowdown own post extra "extra%" ratio
for name in split_nofp rust_deep; do
    # Without perf_dw in TOOLS there is no ratio; every tool's round has the unprofiled base.
    ref=
    [ -z "${results[$name/perf_dw/extra]:-}" ] || ref=$(median <<<"${results[$name/perf_dw/extra]}")
    base=$(median <<<"${results[$name/${tools%% *}/base]}")
    for tool in $tools; do
        m() { median <<<"${results[$name/$tool/$1]}"; }
        extra=$(m extra)
        ratio=-
        [ -z "$ref" ] || ratio=$(calc "$extra / ($ref > 0 ? $ref : 0.001)")
        printf '%-10s %-9s %7s %9s %9s %9s %9s %7s %7s\n' "$name" "$tool" "$(m main)" "$(m slow)" \
            "$(m own)" "$(m post)" "$extra" "$(calc "100 * $extra / $base")" "$ratio"
    done
done

case " $tools " in
*" bpf "*)
    echo
    echo "bpf in the kernel (medians): the sampling program's runs on all CPUs, timed by the kernel"
    printf '%-10s %12s %12s %18s\n' workload "µs per run" "ms in all" "% of workload CPU"
    for name in split_nofp rust_deep; do
        base=$(median <<<"${results[$name/bpf/base]}")
        kernel_ms=$(median <<<"${results[$name/bpf/kernel_ms]}")
        printf '%-10s %12s %12s %18s\n' "$name" "$(median <<<"${results[$name/bpf/per_run]}")" \
            "$kernel_ms" "$(calc "100 * $kernel_ms / 1000 / $base")"
    done
    ;;
esac
