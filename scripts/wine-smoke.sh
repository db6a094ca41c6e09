#!/usr/bin/env bash
# Runs the Windows build of stackscope (x86_64-pc-windows-gnu, as scripts/check.sh builds it)
# under Wine, in a Wine prefix made for the run and removed after, headless. Wine stubs ETW's
# kernel tracing, so this checks what can be checked there: `--help` prints the help;
# `record` and `stackscope-dtrace` (cargo-flamegraph's command line) stop with one line saying
# that kernel tracing is not available, exit status 1, and end the command they launched
# suspended before it ran (its marker file absent, no process of it left); `profile`,
# `doctor`, a Linux-only flag and stackscope-perf are refused in one line. Nothing here
# samples: that needs real Windows.
#
#     scripts/wine-smoke.sh [DIR]    # DIR holds the .exe files (default: target/x86_64-pc-windows-gnu/debug)
#
# Fails, saying what is missing, without wine, the mingw compiler or the built programs.
set -euo pipefail

cd "$(dirname "$0")/.."
exe_dir=${1:-${CARGO_TARGET_DIR:-target}/x86_64-pc-windows-gnu/debug}

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

missing=()
command -v wine >/dev/null || missing+=("wine (apt wine64)")
command -v wineserver >/dev/null || missing+=("wineserver (apt wine64)")
command -v x86_64-w64-mingw32-gcc >/dev/null || missing+=("x86_64-w64-mingw32-gcc (apt gcc-mingw-w64-x86-64)")
for exe in stackscope.exe stackscope-dtrace.exe stackscope-perf.exe; do
    [ -f "$exe_dir/$exe" ] || missing+=("$exe_dir/$exe (cargo build --workspace --target x86_64-pc-windows-gnu)")
done
if [ ${#missing[@]} -gt 0 ]; then
    printf 'FAIL: the Wine smoke test cannot run without %s\n' "${missing[@]}" >&2
    exit 1
fi

work=$(mktemp -d)
export WINEPREFIX="$work/prefix"
cleanup() {
    # This prefix's server and the services it started, then the files.
    [ -d "$WINEPREFIX" ] && wineserver -k 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# No debug channels, no X display (no window may open), no Mono or Gecko installer.
export WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
unset DISPLAY WAYLAND_DISPLAY

run="$work/run"
mkdir "$run"
cp "$exe_dir/stackscope.exe" "$exe_dir/stackscope-dtrace.exe" "$exe_dir/stackscope-perf.exe" "$run/"
x86_64-w64-mingw32-gcc -O2 -shared -o "$run/bcryptprimitives.dll" scripts/wine/bcryptprimitives.c -ladvapi32
x86_64-w64-mingw32-gcc -O2 -o "$run/launched.exe" scripts/wine/launched.c
cd "$run"

# One server for the whole run, started before the prefix is made and killed by cleanup: by
# default it exits a few seconds after its last program, and a program started just then fails
# with "wine client error: recvmsg: Connection reset by peer" (seen once on a loaded machine,
# after the control run below).
mkdir "$WINEPREFIX"
wineserver -p
start=$SECONDS
wineboot --init >/dev/null 2>&1 || { echo "FAIL: wineboot could not make a Wine prefix" >&2; exit 1; }
echo "$(wine --version), prefix made in $((SECONDS - start)) s"

# Runs a Windows program; its stdout, stderr and exit status go to out, err and status.
win() {
    local status=0 arg line="\$ wine"
    for arg in "$@"; do
        case $arg in
            *[!A-Za-z0-9_./=:-]*) line+=" '$arg'" ;;
            *) line+=" $arg" ;;
        esac
    done
    echo "$line"
    wine "$@" >out 2>err || status=$?
    echo "$status" >status
    sed 's/^/  | /' out err
    echo "  exit status $status"
}

# The live (not zombie) processes of launched.exe, as `pid args` lines. (The name is split in
# awk's program, which is itself among the processes.)
launched_processes() {
    ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/ && index($0, "launched" ".exe") { print $1, $3, $4, $5, $6 }'
}

# Checks the last run: exit status $1, standard error one line that starts with $2.
one_line_error() {
    local what=$1 status=$2 start=$3
    [ "$(cat status)" = "$status" ] || fail "$what: exit status $(cat status), not $status"
    [ "$(wc -l <err)" -eq 1 ] || fail "$what: $(wc -l <err) lines on stderr, not one"
    case "$(head -n 1 err)" in
        "$start"*) ;;
        *) fail "$what: stderr does not start with '$start'" ;;
    esac
}

# Checks that the command launched with marker file $1 never ran and is gone.
launched_ended_unrun() {
    local what=$1 marker=$2 left
    [ ! -e "$marker" ] || fail "$what: the launched command ran ($marker exists)"
    # Wine ends a terminated process asynchronously: give it up to 10 s (a loaded machine).
    for _ in $(seq 100); do
        left=$(launched_processes)
        [ -z "$left" ] && break
        sleep 0.1
    done
    [ -z "$left" ] || fail "$what: the launched command is still there: $left"
}

etw="stackscope: error: ETW kernel tracing is not available on this system"

win stackscope.exe --help
[ "$(cat status)" = 0 ] || fail "stackscope --help: exit status $(cat status)"
grep -q "^Usage: stackscope.exe <COMMAND>" out || fail "stackscope --help: no usage line"
grep -q "^  record " out || fail "stackscope --help: no record command"

# The checks below see a launched command that runs: here one does, for 5 seconds (looked
# for during up to 30 s, as Wine may start slowly on a loaded machine).
echo "\$ wine launched.exe control 5 &"
wine launched.exe control 5 &
control=$!
for _ in $(seq 300); do
    [ -e control ] && [ -n "$(launched_processes)" ] && break
    sleep 0.1
done
[ -e control ] || fail "a launched.exe run by itself did not create its marker file"
[ -n "$(launched_processes)" ] || fail "a launched.exe run by itself is not seen among the processes"
wait "$control" || fail "launched.exe run by itself: exit status $?"

win stackscope.exe record -o out.svg -- launched.exe record.ran 30
one_line_error "stackscope record" 1 "$etw"
launched_ended_unrun "stackscope record" record.ran
[ ! -e out.svg ] || fail "stackscope record: wrote out.svg"

win stackscope-dtrace.exe --help
[ "$(cat status)" = 0 ] || fail "stackscope-dtrace --help: exit status $(cat status)"
grep -q "^usage: stackscope-dtrace" out || fail "stackscope-dtrace --help: no usage line"

# cargo-flamegraph's dtrace command line, as it runs DTRACE on Windows.
win stackscope-dtrace.exe -x ustackframes=100 -n 'profile-997 /pid == $target/ { @[ustack(100)] = count(); }' \
    -o cargo-flamegraph.stacks -c 'launched.exe dtrace.ran 30'
one_line_error "stackscope-dtrace" 1 "$etw"
launched_ended_unrun "stackscope-dtrace" dtrace.ran
[ ! -e cargo-flamegraph.stacks ] || fail "stackscope-dtrace: wrote cargo-flamegraph.stacks"

win stackscope.exe profile -F 99 5
one_line_error "stackscope profile" 1 "stackscope: error: stackscope profile (bcc's profile, on eBPF) is Linux-only"

win stackscope.exe doctor
one_line_error "stackscope doctor" 1 "stackscope: error: stackscope doctor (it checks what perf_event and eBPF need) is Linux-only"

win stackscope.exe record --backend bpf -o out.svg -- launched.exe bpf.ran 30
one_line_error "stackscope record --backend bpf" 1 "stackscope: error: --backend is Linux-only"
launched_ended_unrun "stackscope record --backend bpf" bpf.ran

win stackscope-perf.exe record -F 997 -g -o perf.data -- launched.exe perf.ran 30
one_line_error "stackscope-perf" 1 "stackscope: error: stackscope-perf stands in for Linux's perf and is Linux-only"
launched_ended_unrun "stackscope-perf" perf.ran

if [ "$failures" -gt 0 ]; then
    echo "wine smoke test: $failures check(s) failed" >&2
    exit 1
fi
echo "wine smoke test: ok"
