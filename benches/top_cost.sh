#!/usr/bin/env bash
# What watching the whole system costs: `stackscope top` (full-screen, 999 Hz, whole stacks)
# against `perf top` (999 Hz on cpu-clock, its own stackless default, and with
# `--call-graph dwarf` for whole stacks), each run for SECS seconds in a terminal of its own
# (tmux) while a build runs, one after the other, ROUNDS times: each one's own CPU (user +
# system, from wait4) and peak RSS, medians, and the ratios of stackscope's to each perf's.
# Goal: stackscope's own CPU at most half of perf top's.
# With LONG=SECS, stackscope top then runs alone for that long (600: 10 minutes) under the
# same build, its RSS (anonymous and file-backed) polled every 10 s: memory should stay flat
# (at most 64 MiB).
# `stackscope record -a` over the same time is measured beside them: what sampling and naming
# cost without the view; and `stackscope top --backend bpf`, which counts and walks in the
# kernel: its program's time there (the kernel's BPF run-time statistics, switched on for
# that run) is charged to the sampled threads, not to stackscope, so it is reported beside
# its own CPU ("bpf_in_kernel"), as is the sum of both.
#
# Usage: benches/top_cost.sh     (as root; installs perf, time, tmux and gcc if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        SECS=30; ROUNDS=3; LONG=600 for the memory run.
set -euo pipefail
trap 'echo "top_cost: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

need tmux tmux
install_perf_tools
build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"
secs=${SECS:-30}
rounds=${ROUNDS:-3}
socket="stackscope-bench-$$"

# The build: stackscope's profile crate compiled again and again into a target directory of
# its own (its dependencies are already fetched), at the machine's parallelism.
build_loop() {
    while :; do
        rm -rf "$work/build-target"
        (cd "$root" && cargo build --release --quiet -p stackscope-profile \
            --target-dir "$work/build-target") >/dev/null 2>&1 || sleep 1
    done
}
build_loop &
load=$!
cleanup() {
    kill "$load" 2>/dev/null || true
    pkill -P "$load" 2>/dev/null || true
    tmux -L "$socket" kill-server 2>/dev/null || true
    [ -n "${KEEP:-}" ] && echo "work dir: $work" || rm -rf "$work"
}
trap cleanup EXIT
sleep 5

# in_terminal NAME COMMAND...: runs COMMAND under GNU time in a 200x50 tmux window until it
# ends; leaves "USER SYS MAXRSS_KIB" in NAME.time.
in_terminal() {
    local name=$1
    shift
    rm -f "$name.time" "$name.done"
    tmux -L "$socket" new-session -d -x 200 -y 50 \
        "/usr/bin/time -o $name.time -f '%U %S %M' $*; touch $name.done"
    while [ ! -e "$name.done" ]; do sleep 0.5; done
}

# bpf_run_ns PID: the run time, in ns, the kernel counted for the BPF programs PID holds.
bpf_run_ns() {
    cat /proc/"$1"/fdinfo/* 2>/dev/null | awk '/^run_time_ns:/ { t += $2 } END { print t + 0 }'
}

# The eBPF top's program time, read just before its end (its programs go with it), into
# bpf_in_kernel.ns.
watch_bpf_time() {
    local pid=""
    while [ -z "$pid" ]; do
        sleep 0.2
        pid=$(pgrep -f "^$STACKSCOPE top --backend bpf" | head -n 1 || true)
    done
    sleep $((secs - 2))
    bpf_run_ns "$pid" > bpf_in_kernel.ns
}

tools="stackscope stackscope_bpf record perf perf_dwarf"
declare -A cpu mem
for _ in $(seq "$rounds"); do
    in_terminal stackscope "$STACKSCOPE" top -F 999 -d "$secs"
    stats_were=$(sysctl -n kernel.bpf_stats_enabled)
    sysctl -q -w kernel.bpf_stats_enabled=1
    watch_bpf_time &
    in_terminal stackscope_bpf "$STACKSCOPE" top --backend bpf -F 999 -d "$secs"
    wait $!
    sysctl -q -w kernel.bpf_stats_enabled="$stats_were"
    cpu[bpf_in_kernel]+="$(calc "$(cat bpf_in_kernel.ns) / 1e9") "
    in_terminal record "$STACKSCOPE" record -a -F 999 -d "$secs" -o record.folded
    in_terminal perf timeout --foreground -s INT "$secs" perf top -F 999 -e cpu-clock --stdio
    in_terminal perf_dwarf timeout --foreground -s INT "$secs" perf top -F 999 -e cpu-clock \
        --call-graph dwarf --stdio
    for tool in $tools; do
        # GNU time puts "Command exited with non-zero status N" (perf top at its timeout) first.
        read -r user sys kib < <(tail -n 1 "$tool.time")
        cpu[$tool]+="$(calc "$user + $sys") "
        mem[$tool]+="$(calc "$kib / 1024") "
    done
done

printf "%-13s %12s %12s   (%s s, whole system, under a build)\n" tool "CPU s" "peak MiB" "$secs"
declare -A med_cpu med_mem
for tool in $tools bpf_in_kernel; do
    # shellcheck disable=SC2086
    med_cpu[$tool]=$(printf "%s\n" ${cpu[$tool]} | median)
    # shellcheck disable=SC2086
    med_mem[$tool]=$(printf "%s\n" ${mem[$tool]:-0} | median)
    printf "%-13s %12.2f %12.1f   rounds: %s\n" "$tool" "${med_cpu[$tool]}" "${med_mem[$tool]}" \
        "${cpu[$tool]}"
done
with_kernel=$(calc "${med_cpu[stackscope_bpf]} + ${med_cpu[bpf_in_kernel]}")
echo "ratios of CPU: stackscope/perf $(calc "${med_cpu[stackscope]} / ${med_cpu[perf]}")," \
    "stackscope/perf_dwarf $(calc "${med_cpu[stackscope]} / ${med_cpu[perf_dwarf]}")," \
    "stackscope_bpf/perf $(calc "${med_cpu[stackscope_bpf]} / ${med_cpu[perf]}")," \
    "stackscope_bpf+bpf_in_kernel/perf $(calc "$with_kernel / ${med_cpu[perf]}")"

if [ -n "${LONG:-}" ]; then
    # The shell in the window gives its pid to stackscope (exec): no other stackscope running
    # on the machine is mistaken for it.
    tmux -L "$socket" new-session -d -x 200 -y 50 \
        "echo \$\$ > long.pid; exec $STACKSCOPE top -F 999 -d $LONG"
    while [ ! -s long.pid ]; do sleep 0.1; done
    pid=$(cat long.pid)
    echo "stackscope top for $LONG s: RSS in MiB (anonymous + file-backed) every 10 s"
    while kill -0 "$pid" 2>/dev/null; do
        awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 }
            END { if (a != "") printf "%.0f+%.0f ", a / 1024, f / 1024 }' \
            "/proc/$pid/status" 2>/dev/null || true
        sleep 10
    done
    echo
fi
