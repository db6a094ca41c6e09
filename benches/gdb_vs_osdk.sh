#!/usr/bin/env bash
# Compares `stackscope gdb` with the Asterinas OSDK's way of sampling a guest kernel (one
# `gdb-multiarch -batch ... thread apply all bt` process per round) against the same QEMU guest
# in one run: the test kernel with two vCPUs spinning under software emulation, each about 30%
# of its time in spin_a and the rest in spin_b, measuring that time itself and reporting it on
# the serial port. Reports rounds/s, stacks/s, the guest's pause per round (median and p95:
# stackscope's own figure, and QMP's STOP/RESUME events for both methods), where stackscope's
# pause goes step by step, and how far each method's split (spin_a's share of the looks that
# found spin_a or spin_b) is from the kernel's measure over the time that method sampled; and
# the floor of a round on this host: a minimal client's pause that only stops the guest,
# reads the registers and resumes it.
#
# Usage: benches/gdb_vs_osdk.sh [ARCH]   ARCH: x86-64 (default), riscv64 or aarch64; each is a
#        guest_ARCH function below that builds its test kernel and sets the QEMU command.
#        Installs QEMU, gdb-multiarch and the kernel's compiler (gcc, or clang and lld) if
#        missing.
# Env:   STACKSCOPE=path/to/stackscope to skip building it; KEEP=1 to keep the work dir;
#        RUNS=N repetitions (default 3, medians reported); SECS=S per method and run (default 5);
#        KERNEL=cfi|fp (default cfi); RATE="--interval 0" stackscope's rate (default: the
#        highest); OSDK_INTERVAL=S the OSDK's --interval (default 0.1, as shipped; the OSDK
#        back to back is measured too).
set -euo pipefail
trap 'echo "gdb_vs_osdk: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
source "$(dirname "$0")/common.sh"

RUNS=${RUNS:-3}
SECS=${SECS:-5}
KERNEL=${KERNEL:-cfi}
RATE=${RATE:---interval 0}
OSDK_INTERVAL=${OSDK_INTERVAL:-0.1}
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
cleanup() {
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
# ticks, decimal), from the kernel's "stackscope-guest: cpuN a=HEX b=HEX" lines.
kernel_reports() {
    local cpu a b
    grep -E '^stackscope-guest: cpu[0-9]+ a=[0-9a-f]+ b=[0-9a-f]+$' serial.log |
        while read -r _ cpu a b; do echo "$cpu $((16#${a#a=})) $((16#${b#b=}))"; done |
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

# stackscope at $RATE for SECS: rounds/s, stacks/s, its own median and p95 pause, QMP's
# median and p95, the split error; the pause by step goes to steps.log.
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
    local line
    line=$(grep -E '[0-9]+ rounds, [0-9]+ stacks in' stackscope.err) ||
        { cat stackscope.err >&2; exit 1; }
    { grep -E 'pause by step' stackscope.err || true; } | sed 's/^stackscope: gdb: //' >>steps.log
    local rps sps pause p95 split truth
    truth=$(measured_share "$before" "$(kernel_reports)")
    rps=$(sed -E 's/.* ([0-9.]+) rounds\/s.*/\1/' <<<"$line")
    sps=$(sed -E 's/.* ([0-9.]+) stacks\/s.*/\1/' <<<"$line")
    pause=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$line")
    p95=$(sed -E 's/.*p95 ([0-9.]+) ms.*/\1/' <<<"$line")
    split=$(awk '/;spin_a [0-9]+$/ { a += $NF } /;spin_b [0-9]+$/ { b += $NF }
        END { print a + 0, b + 0 }' stackscope.folded | split_error "$truth")
    echo "$rps $sps $pause $p95 $(qmp_pause_ms qmp.log) $split"
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
    echo "$(calc "$rounds / $took") $(calc "$stacks / $took") n/a n/a $(qmp_pause_ms qmp.log) $split"
}

# The floor of a round on this host: a minimal client (Python, no stack reads, no walk) that
# stops the guest with the register reads in the same write, as stackscope does, and resumes
# it at once, 2 ms apart, for SECS. Rounds/s and QMP's median and p95 pause; no stacks, no
# split.
run_floor() {
    qmp_log qmp.log </dev/null >/dev/null 2>&1 &
    local qmp=$!
    sleep 0.3
    local rps
    rps=$(python3 - "$port" "$SECS" <<'EOF'
import socket, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
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
rounds, start = 0, time.monotonic()
while time.monotonic() - start < secs:
    time.sleep(0.002)
    s.sendall(b"\x03" + ask)
    replies(1 + 2 * len(threads))
    s.sendall(b"+" * (1 + 2 * len(threads)) + frame(b"c"))
    rounds += 1
print("%.3f" % (rounds / (time.monotonic() - start)))
s.sendall(b"\x03")
replies(1)
s.sendall(b"+" + frame(b"D"))
replies(1)
EOF
)
    sleep 0.2
    kill "$qmp"
    wait "$qmp" 2>/dev/null || true
    echo "$rps n/a n/a n/a $(qmp_pause_ms qmp.log) n/a"
}

printf 'guest: %s (%s), 2 vCPUs (TCG); stackscope %s; %s s per method, %s runs\n' \
    "$(basename "$elf")" "$ARCH" "$RATE" "$SECS" "$RUNS"
printf '%-4s %-26s %9s %9s %17s %17s %10s\n' run method rounds/s stacks/s \
    "own pause med/p95" "QMP pause med/p95" "split err"
: >results
: >steps.log
for run in $(seq "$RUNS"); do
    for method in stackscope osdk osdk0 floor; do
        case $method in
            stackscope) r=$(run_stackscope); label="stackscope gdb ($RATE)" ;;
            osdk) r=$(run_osdk "$OSDK_INTERVAL"); label="OSDK (--interval $OSDK_INTERVAL)" ;;
            osdk0) r=$(run_osdk 0); label="OSDK (no interval)" ;;
            floor) r=$(run_floor); label="floor (stop, registers)" ;;
        esac
        echo "$method $r" >>results
        read -r rps sps own own95 qmp qmp95 split <<<"$r"
        printf '%-4s %-26s %9s %9s %17s %17s %10s\n' "$run" "$label" "$rps" "$sps" \
            "$own/$own95" "$qmp/$qmp95" "$split"
    done
done

col() { awk -v m="$1" -v c="$2" '$1 == m && $c != "n/a" { print $c }' results | median; }
abs_col() { awk -v m="$1" -v c="$2" '$1 == m && $c != "n/a" { print ($c < 0 ? -$c : $c) }' results | median; }
echo
echo "medians of $RUNS runs (split error: points spin_a's share is off the kernel's measure, absolute):"
for method in stackscope osdk osdk0; do
    printf '  %-11s rounds/s %8s  stacks/s %8s  pause(QMP) median %6s p95 %6s ms  split error %5s\n' \
        "$method" "$(col "$method" 2)" "$(col "$method" 3)" "$(col "$method" 6)" \
        "$(col "$method" 7)" "$(abs_col "$method" 8)"
done
printf '  %-11s rounds/s %8s  (stop, registers and resume only)  pause(QMP) median %6s p95 %6s ms\n' \
    floor "$(col floor 2)" "$(col floor 6)" "$(col floor 7)"
printf '  stackscope pause per round as it reports it: median %s ms, p95 %s ms\n' \
    "$(col stackscope 4)" "$(col stackscope 5)"
echo "  stackscope pause by step, each run:"
sed 's/^/    /' steps.log
s=$(col stackscope 2)
printf '  ratio of rounds/s: stackscope / OSDK as shipped = %sx, / OSDK back to back = %sx (goal >= 100x)\n' \
    "$(calc "$s / $(col osdk 2)")" "$(calc "$s / $(col osdk0 2)")"
printf '  goal: >= 1000 rounds/s, median pause <= 0.25 ms, split error <= 2 points\n'
