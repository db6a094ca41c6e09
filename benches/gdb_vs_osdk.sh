#!/usr/bin/env bash
# Compares `stackscope gdb` with the Asterinas OSDK's way of sampling a guest kernel (one
# `gdb -batch ... thread apply all bt` process per round) against the same QEMU guest in one
# run: the test kernel of crates/stackscope/tests/guest (two vCPUs spinning under software
# emulation). Reports rounds/s, stacks/s and the guest's pause per round, the last measured
# the same way for both from QEMU's own STOP/RESUME events (QMP), and stackscope's own figure.
#
# Usage: benches/gdb_vs_osdk.sh        (installs qemu-system-x86 and gdb if missing)
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N repetitions (default 3, medians reported); SECS=S per method and run (default 5);
#        KERNEL=cfi|fp (default cfi); OSDK_INTERVAL=S the OSDK's --interval (default 0.1, as
#        shipped; the OSDK back to back is measured too).
set -euo pipefail
trap 'echo "gdb_vs_osdk: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

RUNS=${RUNS:-3}
SECS=${SECS:-5}
KERNEL=${KERNEL:-cfi}
OSDK_INTERVAL=${OSDK_INTERVAL:-0.1}

need qemu-system-x86_64 qemu-system-x86
need gdb gdb
need gcc gcc
install_needed

build_unless_set STACKSCOPE stackscope

make_work_dir
qemu_pid=
cleanup() {
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

bash "$root/crates/stackscope/tests/guest/build.sh" "$work" >/dev/null
elf="$work/kernel-$KERNEL.elf"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
remote="127.0.0.1:$port"
qemu-system-x86_64 -accel tcg -smp 2 -m 64 -display none -nic none -no-reboot \
    -serial file:serial.log -kernel "$elf" -gdb "tcp:$remote" \
    -qmp unix:qmp.sock,server=on,wait=off 2>qemu.stderr &
qemu_pid=$!
for _ in $(seq 600); do
    grep -q "cpus running" serial.log 2>/dev/null && break
    kill -0 "$qemu_pid" 2>/dev/null || { cat qemu.stderr >&2; exit 1; }
    sleep 0.1
done
grep -q "cpus running" serial.log || { echo "the guest did not boot" >&2; exit 1; }

# Logs QEMU's STOP/RESUME events (QMP timestamps) to $1 until killed; started in the
# background, it is the python process itself (exec), so that killing it ends it.
qmp_log() {
    exec python3 - "$1" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("qmp.sock")
f = s.makefile("rw")
f.readline()
f.write('{"execute": "qmp_capabilities"}\n')
f.flush()
with open(sys.argv[1], "w") as out:
    for line in f:
        ev = json.loads(line)
        if ev.get("event") in ("STOP", "RESUME"):
            t = ev["timestamp"]
            out.write(f'{ev["event"]} {t["seconds"] + t["microseconds"] / 1e6:.6f}\n')
            out.flush()
EOF
}
# Median guest pause (ms) from a STOP/RESUME log: each STOP to the RESUME that follows.
qmp_pause_ms() {
    awk '$1 == "STOP" { s = $2 } $1 == "RESUME" && s { print ($2 - s) * 1000; s = 0 }' "$1" |
        sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int((NR + 1) / 2)]; else print "n/a" }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", v[int((NR + 1) / 2)] }'; }
calc() { awk "BEGIN { printf \"%.1f\", $* }"; }

# stackscope back to back for SECS: rounds/s, stacks/s, its own median pause, QMP's.
run_stackscope() {
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    "$STACKSCOPE" gdb --remote "$remote" --kernel "$elf" --interval 0 -d "$SECS" \
        -o stackscope.folded 2>stackscope.err
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    local line
    line=$(grep -E '[0-9]+ rounds, [0-9]+ stacks in' stackscope.err) ||
        { cat stackscope.err >&2; exit 1; }
    local rps sps pause
    rps=$(sed -E 's/.* ([0-9.]+) rounds\/s.*/\1/' <<<"$line")
    sps=$(sed -E 's/.* ([0-9.]+) stacks\/s.*/\1/' <<<"$line")
    pause=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$line")
    echo "$rps $sps $pause $(qmp_pause_ms qmp.log)"
}

# The OSDK's loop for SECS: one gdb per round, then sleep $1 seconds. Rounds/s, stacks/s
# (threads with a backtrace), QMP's median pause.
run_osdk() {
    local interval=$1
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    : >osdk.out
    local rounds=0 start end
    start=$(date +%s.%N)
    end=$(calc "$start + $SECS")
    while awk "BEGIN { exit !($(date +%s.%N) < $end) }"; do
        gdb -batch -ex "set pagination 0" -ex "file $elf" -ex "target remote $remote" \
            -ex "thread apply all bt -frame-arguments presence -frame-info short-location" \
            >>osdk.out 2>/dev/null </dev/null
        rounds=$((rounds + 1))
        [ "$interval" = 0 ] || sleep "$interval"
    done
    local took
    took=$(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $start }")
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    local stacks
    stacks=$(grep -c '^Thread .*CPU#' osdk.out || true)
    echo "$(calc "$rounds / $took") $(calc "$stacks / $took") n/a $(qmp_pause_ms qmp.log)"
}

printf 'guest: %s, 2 vCPUs (TCG); %s s per method, %s runs\n' "kernel-$KERNEL.elf" "$SECS" "$RUNS"
printf '%-4s %-26s %9s %9s %16s %13s\n' run method rounds/s stacks/s "pause(own) ms" "pause(QMP) ms"
: >results
for run in $(seq "$RUNS"); do
    for method in stackscope osdk osdk0; do
        case $method in
            stackscope) r=$(run_stackscope); label="stackscope gdb (back to back)" ;;
            osdk) r=$(run_osdk "$OSDK_INTERVAL"); label="OSDK (--interval $OSDK_INTERVAL)" ;;
            osdk0) r=$(run_osdk 0); label="OSDK (no interval)" ;;
        esac
        echo "$method $r" >>results
        read -r rps sps own qmp <<<"$r"
        printf '%-4s %-26s %9s %9s %16s %13s\n' "$run" "$label" "$rps" "$sps" "$own" "$qmp"
    done
done

col() { awk -v m="$1" -v c="$2" '$1 == m && $c != "n/a" { print $c }' results | median; }
echo
echo "medians of $RUNS runs:"
for method in stackscope osdk osdk0; do
    printf '  %-11s rounds/s %8s  stacks/s %8s  pause(QMP) %6s ms\n' "$method" \
        "$(col "$method" 2)" "$(col "$method" 3)" "$(col "$method" 5)"
done
printf '  stackscope pause per round as it reports it: %s ms\n' "$(col stackscope 4)"
s=$(col stackscope 2)
printf '  ratio of rounds/s: stackscope / OSDK as shipped = %sx, / OSDK back to back = %sx (goal >= 100x)\n' \
    "$(calc "$s / $(col osdk 2)")" "$(calc "$s / $(col osdk0 2)")"
