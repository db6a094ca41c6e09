#!/usr/bin/env bash
# Whole-system recording under process churn: while a shell loop starts short processes
# without pause (the churn workload, ~10 ms of CPU each, and `true`), records the whole system
# at 999 Hz for 10 s and for 60 s with `stackscope record -a` and with
# `perf record -a --call-graph dwarf`, and prints each one's peak RSS (and, for stackscope,
# the RSS it held while sampling, before the final symbolization, and the highest anonymous
# and file-backed parts of its RSS, RssAnon and RssFile, polled every 0.2 s over the whole
# run: file-backed pages of mmapped binaries count in RSS but are the page cache's, shared and
# reclaimable) and lost samples.
# Memory that grows with the duration shows as a 60 s figure well above the 10 s one.
#
# Usage: benches/churn_memory.sh        (as root; installs perf, time and gcc if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        DURATIONS="10 60" to choose the recording lengths in seconds.
set -euo pipefail
trap 'echo "churn_memory: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

install_perf_tools
build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"
gcc -O2 -g "$root/crates/stackscope/tests/workloads/churn.c" -o churn

# The churning load, until the script ends.
sh -c 'while :; do ./churn 10; true; done' &
load=$!
trap 'kill "$load" 2>/dev/null; rm -rf "$work"' EXIT
[ -z "${KEEP:-}" ] || trap 'kill "$load" 2>/dev/null; echo "work dir: $work"' EXIT

mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# Highest VmRSS of pid $1 over its first $2 seconds, then highest RssAnon and RssFile until it
# ends (KiB, three words), polled every 0.2 s.
rss_while() {
    local pid=$1 until=$(($(date +%s) + $2)) sampling=0 anon=0 file=0 now
    while now=$(awk '/^(VmRSS|RssAnon|RssFile)/ { printf "%s ", $2 }' "/proc/$pid/status" 2>/dev/null) &&
        [ -n "$now" ]; do
        set -- $now
        [ "$(date +%s)" -ge "$until" ] || [ "$1" -le "$sampling" ] || sampling=$1
        [ "$2" -le "$anon" ] || anon=$2
        [ "$3" -le "$file" ] || file=$3
        sleep 0.2
    done
    echo "$sampling $anon $file"
}

row() { printf '%-12s %6s %14s %10s %10s %10s %8s\n' "$@"; }
row profiler secs "sampling MiB" "peak MiB" "anon MiB" "file MiB" lost
for secs in ${DURATIONS:-10 60}; do
    /usr/bin/time -o ss.time -f '%M' \
        "$STACKSCOPE" record -a -F 999 -d "$secs" -o ss.folded 2>ss.stderr &
    timer=$!
    sleep 0.5
    ss_pid=$(pgrep -P "$timer" -x stackscope)
    read -r sampling anon file < <(rss_while "$ss_pid" "$((secs - 1))")
    wait "$timer"
    ss_lost=$(sed -n 's/.* samples in .*, \([0-9]*\) lost$/\1/p' ss.stderr)
    row stackscope "$secs" "$(mib "$sampling")" "$(mib "$(cat ss.time)")" "$(mib "$anon")" \
        "$(mib "$file")" "$ss_lost"

    /usr/bin/time -o perf.time -f '%M' \
        perf record -q -a -F 999 --call-graph dwarf -o perf.data -- sleep "$secs" 2>perf.stderr
    perf_lost=$(perf report -i perf.data --stats 2>/dev/null |
        awk '$1 == "LOST_SAMPLES" || $1 == "LOST" { n += $NF } END { print n + 0 }')
    row perf "$secs" - "$(mib "$(cat perf.time)")" - - "$perf_lost"
    rm -f perf.data
done
