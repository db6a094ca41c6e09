#!/usr/bin/env bash
# What fetching debug info from a debuginfod server costs stackscope, against elfutils' own
# client in the same run. A C program with FUNCS generated functions (a debug file of some
# megabytes) and two hot static functions is built with -g, its debug info split off and served
# by a local `debuginfod -F`, and the program stripped. Then, medians over RUNS rounds, each
# with an empty cache:
#   find    wall time of `debuginfod-find debuginfo BUILD-ID` (elfutils' client)
#   fetch   wall time `stackscope report perf.data` adds with the server over
#           `--no-debuginfod` (download, cache, and naming from the fetched file)
# and the ratio fetch / find. Then, with DEBUGINFOD_URLS naming a closed port and a blackholed
# one and DEBUGINFOD_TIMEOUT=TIMEOUT, what `report` adds over `--no-debuginfod`, against the
# timeout (the ratio should be about 1: each dead server is waited for once, not per file).
#
# Usage: benches/debuginfod_fetch.sh   (as root; installs debuginfod, elfutils, perf, gcc)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; RUNS=N (default 5); FUNCS=N
#        (default 20000); TIMEOUT=seconds (default 3); KEEP=1 keeps the work dir.
set -euo pipefail
trap 'echo "debuginfod_fetch: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

runs=${RUNS:-5}
funcs=${FUNCS:-20000}
timeout=${TIMEOUT:-3}

need debuginfod debuginfod
need debuginfod-find debuginfod
need perf linux-perf
need gcc gcc libc6-dev
need python3 python3
need curl curl
install_needed
build_unless_set STACKSCOPE stackscope
make_work_dir
cd "$work"

# The program: FUNCS small functions (called once, so that they stay), and two hot ones.
{
    echo 'static volatile unsigned long sink;'
    for ((i = 0; i < funcs; i++)); do
        echo "__attribute__((noipa)) unsigned long gen_$i(unsigned long x) { return x * $i + sink; }"
    done
    echo 'static __attribute__((noipa)) unsigned long warm_alpha(unsigned long n) {
        unsigned long s = n; for (unsigned long i = 0; i < n; i++) s = s * 6364136223846793005UL + 1; return s; }
    static __attribute__((noipa)) unsigned long warm_beta(unsigned long n) {
        unsigned long s = n; for (unsigned long i = 0; i < n; i++) s = (s ^ (s >> 29)) * 3; return s; }
    int main(void) {'
    for ((i = 0; i < funcs; i += 97)); do echo "    sink += gen_$i(1);"; done
    echo '    for (int r = 0; r < 300; r++) { sink += warm_alpha(1000000); sink += warm_beta(1000000); }
        return 0; }'
} >prog.c
gcc -O1 -g -o prog.full prog.c
mkdir served
objcopy --only-keep-debug prog.full served/prog.debug
strip -s -o prog prog.full
build_id=$(readelf -n prog | awk '/Build ID/ { print $3 }')
echo "debug file: $(du -h served/prog.debug | cut -f1), build-id $build_id"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
debuginfod -F -p "$port" -d "$work/db.sqlite" served >server.log 2>&1 &
server=$!
# A closed port, and a blackholed one: a listener whose queue (cut to one) is held full.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)
c = socket.socket(); c.connect(s.getsockname())
print(s.getsockname()[1], flush=True); time.sleep(3600)' >blackhole.port &
blackhole=$!
trap 'kill $server $blackhole 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/buildid/$build_id/debuginfo")" = 200 ] && break
    sleep 0.1
done
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dead="http://127.0.0.1:$closed http://127.0.0.1:$(cat blackhole.port)"

perf record -N -q -F 999 -g -o perf.data -- ./prog
# report_time [ENV...] -- [OPTIONS...]: wall seconds of `stackscope report perf.data`.
report_time() {
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    rm -rf cache
    local t0
    t0=$(now)
    env DEBUGINFOD_CACHE_PATH="$work/cache" "${env[@]}" "$STACKSCOPE" report perf.data -o out.folded "$@" 2>report.err
    calc "$(now) - $t0"
}

: >find.txt >off.txt >fetch.txt >dead.txt
for ((r = 0; r < runs; r++)); do
    rm -rf find-cache
    t0=$(now)
    DEBUGINFOD_CACHE_PATH="$work/find-cache" DEBUGINFOD_URLS="$url" debuginfod-find debuginfo "$build_id" >/dev/null
    calc "$(now) - $t0" >>find.txt
    echo >>find.txt
    report_time DEBUGINFOD_URLS="$url" -- --no-debuginfod >>off.txt && echo >>off.txt
    report_time DEBUGINFOD_URLS="$url" -- >>fetch.txt && echo >>fetch.txt
    grep -q warm_alpha out.folded || { echo "warm_alpha not named from the server" >&2; exit 1; }
    report_time DEBUGINFOD_URLS="$dead" DEBUGINFOD_TIMEOUT="$timeout" -- >>dead.txt && echo >>dead.txt
done

find=$(median <find.txt)
off=$(median <off.txt)
fetch=$(calc "$(median <fetch.txt) - $off")
dead=$(calc "$(median <dead.txt) - $off")
echo "debuginfod-find debuginfo:           $find s"
echo "stackscope report, fetch added:      $fetch s (report alone $off s)"
echo "ratio fetch / debuginfod-find:       $(calc "$fetch / $find")"
echo "unreachable servers, cost added:     $dead s with DEBUGINFOD_TIMEOUT=$timeout"
echo "ratio cost / timeout:                $(calc "$dead / $timeout")"
