#!/usr/bin/env bash
# Compares `stackscope gdb` with the Asterinas OSDK's way of sampling a guest kernel (one
# `gdb-multiarch -batch ... thread apply all bt` process per round) against the same QEMU guest
# in one run: the test kernel with two vCPUs spinning under software emulation, each about 30%
# of its time in spin_a and the rest in spin_b, measuring that time itself and reporting it on
# the serial port with its units of work done and its counter (which holds while the guest is
# stopped). Reports rounds/s, stacks/s (stackscope's are fresh ones: looks at a vCPU that ran
# since the round before), what the guest paid: the share of the time it was stopped
# (stackscope's own figure, and the guest's counter against the host's clock) and its own
# progress against an unprofiled stretch of the same run; the guest's pause per round (median
# and p95: stackscope's own figure, and QMP's STOP/RESUME events for every method) and the
# median against the floor's; where stackscope's pause goes step by step, and how far each
# method's split (spin_a's share of the looks that found spin_a or spin_b) is from the
# kernel's measure over the time that method sampled. The floor of a round on this host is a
# minimal client's pause that only stops the guest, reads the registers and resumes it: once
# 2 ms apart (the host's best case) and once as far apart as stackscope's rounds were in the
# same run (floor_gap), since a guest that ran longer is slower to stop on a busy host; that
# one is what stackscope's pause is weighed against.
#
# Usage: benches/gdb_vs_osdk.sh [ARCH]   ARCH: x86-64 (default), riscv64 or aarch64; each is a
#        guest_ARCH function below that builds its test kernel and sets the QEMU command.
#        Installs QEMU, gdb-multiarch and the kernel's compiler (gcc, or clang and lld) if
#        missing.
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N repetitions (default 3, medians reported); SECS=S per method and run (default 5);
#        KERNEL=cfi|fp (default cfi); RATE="--interval 0" stackscope's rate (default: as often
#        as its --max-slowdown, 5% by default, allows); OSDK_INTERVAL=S the OSDK's --interval
#        (default 0.1, as shipped; the OSDK back to back is measured too); LOAD=N busy loops
#        on the host while measuring (default 0).
set -euo pipefail
trap 'echo "gdb_vs_osdk: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

RUNS=${RUNS:-3}
SECS=${SECS:-5}
KERNEL=${KERNEL:-cfi}
RATE=${RATE:---interval 0}
OSDK_INTERVAL=${OSDK_INTERVAL:-0.1}
LOAD=${LOAD:-0}
ARCH=${1:-x86-64}

# guest_ARCH: notes the packages the guest needs (called before install_needed), and once
# called again with "build" builds the kernel into $work and sets $elf and the qemu array
# (without the -gdb, -qmp and -serial arguments).
guest_x86-64() {
    if [ "${1:-}" != build ]; then
        need qemu-system-x86_64 qemu-system-x86
        need gcc gcc
        return
    fi
    bash "$root/crates/stackscope/tests/guest/build.sh" x86_64 "$work" >/dev/null
    elf="$work/kernel-$KERNEL.elf"
    qemu=(qemu-system-x86_64 -accel tcg -smp 2 -m 64 -display none -nic none -no-reboot
        -kernel "$elf")
}
# The riscv64 and aarch64 guests: the same test kernel, built by clang --target and lld.
guest_multiarch() {
    local arch=$1 step=$2
    shift 2
    if [ "$step" != build ]; then
        need "qemu-system-$arch" "$1"
        need clang clang
        need ld.lld lld
        need llvm-objcopy llvm
        return
    fi
    bash "$root/crates/stackscope/tests/guest/build.sh" "$arch" "$work" >/dev/null
    elf="$work/kernel-$KERNEL.elf"
    qemu=("qemu-system-$arch" -accel tcg -smp 2 -m 64 -display none -nic none -no-reboot
        "${@:2}" -kernel "$elf")
}
guest_riscv64() { guest_multiarch riscv64 "${1:-}" qemu-system-misc -machine virt -bios none; }
guest_aarch64() {
    guest_multiarch aarch64 "${1:-}" qemu-system-arm -machine virt -cpu cortex-a57
}
declare -F "guest_$ARCH" >/dev/null ||
    { echo "gdb_vs_osdk: no guest for architecture $ARCH (known: x86-64, riscv64, aarch64)" >&2
      exit 2; }

"guest_$ARCH"
need gdb-multiarch gdb-multiarch
need python3 python3
install_needed

build_unless_set STACKSCOPE stackscope

make_work_dir
qemu_pid=
follower=
loads=()
cleanup() {
    for pid in "${loads[@]}" $follower; do kill "$pid" 2>/dev/null || true; done
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

"guest_$ARCH" build
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
remote="127.0.0.1:$port"
"${qemu[@]}" -serial file:serial.log -gdb "tcp:$remote" \
    -qmp unix:qmp.sock,server=on,wait=off 2>qemu.stderr &
qemu_pid=$!
for _ in $(seq 600); do
    grep -q "cpus running" serial.log 2>/dev/null && break
    kill -0 "$qemu_pid" 2>/dev/null || { cat qemu.stderr >&2; exit 1; }
    sleep 0.1
done
grep -q "cpus running" serial.log || { echo "the guest did not boot" >&2; exit 1; }

# Every report from now on, stamped with the host's clock as it arrives ("WALL CPU UNITS
# COUNTER", decimal), in reports.log: what the guest paid is read from it per method.
python3 - <<'EOF' &
import re, time
out = open("reports.log", "w")
log = open("serial.log")
log.seek(0, 2)
pending = ""
while True:
    pending += log.read()
    now = time.time()
    while "\n" in pending:
        line, pending = pending.split("\n", 1)
        m = re.match(r"stackscope-guest: cpu(\d+) a=\w+ b=\w+ u=(\w+) t=(\w+)$", line)
        if m:
            out.write(f"{now:.6f} {m[1]} {int(m[2], 16)} {int(m[3], 16)}\n")
            out.flush()
    time.sleep(0.002)
EOF
follower=$!
for _ in $(seq "$LOAD"); do
    sh -c 'while :; do :; done' &
    loads+=($!)
done

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
# Median and p95 guest pause (ms) from a STOP/RESUME log: each STOP to the RESUME after it.
qmp_pause_ms() {
    awk '$1 == "STOP" { s = $2 } $1 == "RESUME" && s { print ($2 - s) * 1000; s = 0 }' "$1" |
        sort -g | awk '{ v[NR] = $1 } END {
            if (NR) printf "%.3f %.3f", v[int((NR + 1) / 2)], v[int((NR * 95 + 99) / 100)]
            else print "n/a n/a" }'
}
# Each vCPU's last report of the time it spent in spin_a and spin_b, "cpuN A B" (counter
# ticks, decimal), from the kernel's "stackscope-guest: cpuN a=HEX b=HEX ..." lines.
kernel_reports() {
    local cpu a b
    grep -E '^stackscope-guest: cpu[0-9]+ a=[0-9a-f]+ b=[0-9a-f]+ ' serial.log |
        while read -r _ cpu a b _; do echo "$cpu $((16#${a#a=})) $((16#${b#b=}))"; done |
        awk '{ last[$1] = $0 } END { for (c in last) print last[c] }' | sort
}
# Waits (10 s at most) until every vCPU has reported since the reports $1 were read.
wait_reports_after() {
    for _ in $(seq 100); do
        [ -z "$(comm -12 <(echo "$1") <(kernel_reports))" ] && return
        sleep 0.1
    done
    echo "gdb_vs_osdk: the guest reported no times after sampling" >&2
    exit 1
}
# spin_a's share (percent) of the time both vCPUs spent in the two functions between the
# reports $1 and $2: the split a method should find.
measured_share() {
    join <(echo "$1") <(echo "$2") |
        awk '{ a += $4 - $2; b += $5 - $3 } END { if (a + b) printf "%.2f", a / (a + b) * 100; else print "n/a" }'
}
# Points spin_a's share of the looks at spin_a or spin_b is off the kernel's measure $1
# (percent), from counts "A B".
split_error() {
    awk -v m="$1" '{ if ($1 + $2 && m != "n/a") printf "%.2f", ($1 / ($1 + $2)) * 100 - m; else print "n/a" }'
}

# What the guest paid between the host times $1 and $2 against its unprofiled stretch $3..$4:
# the share of the time its counter stood still and its units of work per second as a share
# of the unprofiled rate (percent, mean of the vCPUs; least-squares rates of the reports).
guest_paid() {
    python3 - "$@" <<'EOF'
import sys
start, end, quiet_start, quiet_end = map(float, sys.argv[1:])
reports = [tuple(map(float, l.split())) for l in open("reports.log")]
def rate(lo, hi, cpu, k):
    pts = [(r[0], r[k]) for r in reports if lo <= r[0] <= hi and r[1] == cpu]
    if len(pts) < 4:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
stopped, progress = [], []
for cpu in sorted({int(r[1]) for r in reports}):
    rates = [rate(lo, hi, cpu, k) for k in (3, 2) for lo, hi in ((start, end), (quiet_start, quiet_end))]
    if None in rates or 0 in rates[1::2]:
        continue
    stopped.append((1 - rates[0] / rates[1]) * 100)
    progress.append(rates[2] / rates[3] * 100)
if stopped:
    print(f"{sum(stopped) / len(stopped):.2f} {sum(progress) / len(progress):.1f}")
else:
    print("n/a n/a")
EOF
}

# The guest unprofiled for SECS: the stretch every method's cost is weighed against.
run_none() {
    sleep "$SECS"
    echo "n/a n/a n/a n/a n/a n/a n/a n/a n/a"
}

# stackscope at $RATE for SECS: rounds/s, fresh stacks/s, its own slowdown (percent), its own
# median and p95 pause, its own pause against its floor rounds, QMP's median and p95, the
# split error; the pause by step goes to steps.log.
run_stackscope() {
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    local before
    before=$(kernel_reports)
    # shellcheck disable=SC2086 # RATE is flags
    "$STACKSCOPE" gdb --remote "$remote" --kernel "$elf" $RATE -d "$SECS" \
        -o stackscope.folded 2>stackscope.err
    wait_reports_after "$before"
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    local line paid
    line=$(grep -E '[0-9]+ rounds, [0-9]+ stacks in' stackscope.err) ||
        { cat stackscope.err >&2; exit 1; }
    paid=$(grep -E 'fresh stacks/s' stackscope.err)
    { grep -E 'pause by step' stackscope.err || true; } | sed 's/^stackscope: gdb: //' >>steps.log
    # How long the guest ran between rounds (median, ms): the floor_gap method's spacing.
    sed -nE 's/.*guest ran ([0-9.]+) ms between rounds.*/\1/p' stackscope.err >stackscope.gap
    local rps sps pause p95 split truth slowed ratio
    truth=$(measured_share "$before" "$(kernel_reports)")
    rps=$(sed -E 's/.* ([0-9.]+) rounds\/s.*/\1/' <<<"$line")
    sps=$(sed -E 's/.* ([0-9.]+) fresh stacks\/s.*/\1/' <<<"$paid")
    slowed=$(sed -E 's/.*guest slowed ([0-9.]+)%.*/\1/' <<<"$paid")
    ratio=n/a
    if grep -q "x the stub's floor" <<<"$paid"; then
        ratio=$(sed -E "s/.*pause ([0-9.]+)x the stub's floor.*/\1/" <<<"$paid")
    fi
    pause=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$line")
    p95=$(sed -E 's/.*p95 ([0-9.]+) ms.*/\1/' <<<"$line")
    split=$(awk '/;spin_a [0-9]+$/ { a += $NF } /;spin_b [0-9]+$/ { b += $NF }
        END { print a + 0, b + 0 }' stackscope.folded | split_error "$truth")
    echo "$rps $sps $slowed $pause $p95 $ratio $(qmp_pause_ms qmp.log) $split"
}

# The OSDK's loop for SECS: one gdb per round, then sleep $1 seconds. Rounds/s, stacks/s
# (threads with a backtrace), QMP's median and p95 pause, the split error.
run_osdk() {
    local interval=$1
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    : >osdk.out
    local rounds=0 start end before
    before=$(kernel_reports)
    start=$(date +%s.%N)
    end=$(calc "$start + $SECS")
    while awk "BEGIN { exit !($(date +%s.%N) < $end) }"; do
        gdb-multiarch -batch -ex "set pagination 0" -ex "file $elf" -ex "target remote $remote" \
            -ex "thread apply all bt -frame-arguments presence -frame-info short-location" \
            >>osdk.out 2>/dev/null </dev/null
        rounds=$((rounds + 1))
        [ "$interval" = 0 ] || sleep "$interval"
    done
    local took
    took=$(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $start }")
    wait_reports_after "$before"
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    local stacks split truth
    truth=$(measured_share "$before" "$(kernel_reports)")
    stacks=$(grep -c '^Thread .*CPU#' osdk.out || true)
    split=$(awk '/^#0 .*[ ]spin_a[ (]/ { a++ } /^#0 .*[ ]spin_b[ (]/ { b++ }
        END { print a + 0, b + 0 }' osdk.out | split_error "$truth")
    echo "$(calc "$rounds / $took") $(calc "$stacks / $took") n/a n/a n/a n/a $(qmp_pause_ms qmp.log) $split"
}

# The floor of a round on this host: a minimal client (Python, no stack reads, no walk) that
# stops the guest with the register reads in the same write, as stackscope does, and resumes
# it at once, letting the guest run $1 ms between rounds, for SECS. Rounds/s, its own median
# and p95 pause (from sending the interrupt to sending the resume, as stackscope measures
# its own) and QMP's; no stacks, no split. How long a stop takes depends on how long the
# guest ran before it (QEMU's threads that ran flat out wait longer for a CPU on a busy
# host), so the floor that weighs stackscope's pause is the one at its rounds' spacing.
run_floor() {
    local gap_ms=$1
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    local rps
    r=$(python3 - "$port" "$SECS" "$gap_ms" <<'EOF'
import socket, sys, time
port, secs, gap = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]) / 1000
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
def frame(d):
    return b"$" + d + b"#%02x" % (sum(d) % 256)
def replies(n):
    # The next n packets, acks skipped (the client acks them with its next write).
    global buf
    got = []
    while len(got) < n:
        buf = buf.lstrip(b"+")
        end = buf.find(b"#")
        if buf.startswith(b"$") and end >= 0 and len(buf) >= end + 3:
            got.append(buf[1:end])
            buf = buf[end + 3:]
        else:
            buf += s.recv(65536)
    return got
s.sendall(frame(b"qSupported"))
replies(1)
s.sendall(b"+" + frame(b"qfThreadInfo"))
threads = [t for t in replies(1)[0][1:].split(b",") if t]
s.sendall(b"+" + frame(b"c"))
time.sleep(0.05)
ask = b"".join(frame(b"Hg" + t) + frame(b"g") for t in threads)
rounds, start, pauses = 0, time.monotonic(), []
while time.monotonic() - start < secs:
    time.sleep(gap)
    stop = time.monotonic()
    s.sendall(b"\x03" + ask)
    replies(1 + 2 * len(threads))
    pauses.append((time.monotonic() - stop) * 1000)
    s.sendall(b"+" * (1 + 2 * len(threads)) + frame(b"c"))
    rounds += 1
pauses.sort()
print("%.3f %.3f %.3f" % (rounds / (time.monotonic() - start), pauses[(len(pauses) - 1) // 2],
                          pauses[(len(pauses) * 95 + 99) // 100 - 1]))
s.sendall(b"\x03")
replies(1)
s.sendall(b"+" + frame(b"D"))
replies(1)
EOF
)
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    read -r rps own own95 <<<"$r"
    echo "$rps n/a n/a $own $own95 n/a $(qmp_pause_ms qmp.log) n/a"
}

printf 'guest: %s (%s), 2 vCPUs (TCG); stackscope %s; %s s per method, %s runs; %s busy loops on the host\n' \
    "$(basename "$elf")" "$ARCH" "$RATE" "$SECS" "$RUNS" "$LOAD"
row='%-4s %-26s %9s %9s %8s %8s %9s %15s %5s %15s %9s\n'
# shellcheck disable=SC2059 # the format is $row
printf "$row" run method rounds/s stacks/s "stopped" "by guest" progress "own pause/p95" "/flr" \
    "QMP pause/p95" "split err"
: >results
: >steps.log
for run in $(seq "$RUNS"); do
    for method in none stackscope osdk osdk0 floor floor_gap; do
        start=$(now)
        case $method in
            none) r=$(run_none); label="unprofiled" ;;
            stackscope) r=$(run_stackscope); label="stackscope gdb ($RATE)" ;;
            osdk) r=$(run_osdk "$OSDK_INTERVAL"); label="OSDK (--interval $OSDK_INTERVAL)" ;;
            osdk0) r=$(run_osdk 0); label="OSDK (no interval)" ;;
            floor) r=$(run_floor 2); label="floor (stop, regs; 2 ms)" ;;
            floor_gap)
                gap=$(cat stackscope.gap 2>/dev/null || true)
                gap=${gap:-2}
                r=$(run_floor "$gap")
                label="floor ($gap ms apart)"
                ;;
        esac
        # The stretch sampled: past the QMP logger's start and the connection, before the end.
        if [ "$method" = none ]; then
            quiet=("$(calc "$start + 0.5")" "$(calc "$start + $SECS - 0.2")")
            paid="0.00 100.0"
        else
            paid=$(guest_paid "$(calc "$start + 1.0")" "$(calc "$start + 0.3 + $SECS - 0.2")" \
                "${quiet[@]}")
        fi
        echo "$method $r $paid" >>results
        read -r rps sps slowed own own95 ratio qmp qmp95 split <<<"$r"
        read -r stopped progress <<<"$paid"
        # shellcheck disable=SC2059
        printf "$row" "$run" "$label" "$rps" "$sps" "$slowed%" "$stopped%" "$progress%" \
            "$own/$own95" "$ratio" "$qmp/$qmp95" "$split"
    done
done

# The median of column $2 of method $1's results; n/a when the method has none.
col() {
    local values
    values=$(awk -v m="$1" -v c="$2" '$1 == m && $c != "n/a" { print $c }' results)
    if [ -n "$values" ]; then median <<<"$values"; else echo n/a; fi
}
abs_col() { awk -v m="$1" -v c="$2" '$1 == m && $c != "n/a" { print ($c < 0 ? -$c : $c) }' results | median; }
floor_qmp=$(col floor 8)
echo
echo "medians of $RUNS runs (stopped: share of the time the guest was stopped, as stackscope"
echo "measures it and by the guest's counter; progress: the guest's units of work a second"
echo "against the unprofiled stretch of the same run; split error: points spin_a's share is"
echo "off the kernel's measure, absolute):"
for method in stackscope osdk osdk0; do
    printf '  %-11s rounds/s %8s  stacks/s %8s  stopped %6s%% (by guest %6s%%)  progress %6s%%  pause(QMP) median %6s p95 %6s ms = %sx the floor  split error %5s\n' \
        "$method" "$(col "$method" 2)" "$(col "$method" 3)" "$(col "$method" 4)" \
        "$(col "$method" 11)" "$(col "$method" 12)" "$(col "$method" 8)" "$(col "$method" 9)" \
        "$(calc "$(col "$method" 8) / $floor_qmp")" "$(abs_col "$method" 10)"
done
for method in floor floor_gap; do
    printf '  %-11s rounds/s %8s  (stop, registers and resume only)  stopped by guest %6s%%  pause(QMP) median %6s p95 %6s ms, its own median %6s p95 %6s ms\n' \
        "$method" "$(col "$method" 2)" "$(col "$method" 11)" "$(col "$method" 8)" \
        "$(col "$method" 9)" "$(col "$method" 5)" "$(col "$method" 6)"
done
printf '  stackscope pause per round as it reports it: median %s ms, p95 %s ms, %sx its own floor rounds\n' \
    "$(col stackscope 5)" "$(col stackscope 6)" "$(col stackscope 7)"
printf '  stackscope against the floor at its own spacing (floor_gap): QMP median %sx, own median %sx\n' \
    "$(calc "$(col stackscope 8) / $(col floor_gap 8)")" "$(calc "$(col stackscope 5) / $(col floor_gap 5)")"
echo "  stackscope pause by step, each run:"
sed 's/^/    /' steps.log
s=$(col stackscope 3)
printf '  ratio of stacks/s: stackscope (fresh) / OSDK as shipped = %sx, / OSDK back to back = %sx\n' \
    "$(calc "$s / $(col osdk 3)")" "$(calc "$s / $(col osdk0 3)")"
printf '  goal: >= 400 fresh stacks/s at <= 5%% slowdown, pause <= 1.1x the floor, split error <= 2 points\n'
