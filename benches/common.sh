# The set-up the benchmark scripts share; each sources it right after `set -euo pipefail`.
# It sets $root, the repository, and defines the steps below.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages to install, noted by `need` and installed by `install_needed`.
need_apt=()

# need COMMAND PACKAGE...: notes the packages that provide COMMAND (a name looked up on PATH,
# or a path) when it is missing.
need() {
    command -v "$1" >/dev/null || need_apt+=("${@:2}")
}

# Installs the packages `need` noted, if any. (Its steps, as those of `build_unless_set`,
# return their failure, so that the caller's ERR trap names the line that called them.)
install_needed() {
    [ ${#need_apt[@]} -gt 0 ] || return 0
    apt-get update -qq || return
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null || return
}

# build_unless_set VAR BIN: unless the variable VAR already names a binary, builds the release
# binary BIN of the stackscope package and sets VAR to its path.
build_unless_set() {
    [ -z "${!1:-}" ] || return 0
    (cd "$root" && cargo build --release -p stackscope --bin "$2" --quiet) || return
    printf -v "$1" '%s' "${CARGO_TARGET_DIR:-$root/target}/release/$2"
}

# Sets $work to a fresh directory, removed on exit unless KEEP is set (then its path is
# printed). A script with more to clean up replaces the EXIT trap and removes $work itself.
make_work_dir() {
    work=$(mktemp -d -t stackscope-bench.XXXXXX)
    if [ -z "${KEEP:-}" ]; then trap 'rm -rf "$work"' EXIT; else echo "work dir: $work"; fi
}

# What the scripts that run perf against stackscope on the C and Rust workloads need: perf,
# GNU time, gcc, and inferno's collapser and flamegraph (installed with cargo).
install_perf_tools() {
    need perf linux-perf
    need /usr/bin/time time
    need gcc gcc libc6-dev
    install_needed || return
    export PATH="$HOME/.cargo/bin:$PATH"
    if ! command -v inferno-collapse-perf >/dev/null || ! command -v inferno-flamegraph >/dev/null; then
        cargo install --locked inferno || return
    fi
}

# Timing arithmetic: seconds since the epoch, an awk expression to 3 decimals, and the median
# of the numbers on standard input, one a line.
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.3f\", $* }"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# What the scripts that run stackscope's eBPF side against bpftrace on a C program need:
# bpftrace, gcc, stackscope ($STACKSCOPE); then the work dir, entered.
set_up_against_bpftrace() {
    need bpftrace bpftrace
    need gcc gcc libc6-dev
    install_needed || return
    build_unless_set STACKSCOPE stackscope || return
    make_work_dir
    cd "$work" || return
}

# rate_table UNIT: the median of each tool's rates in the associative array `rates` (space-
# separated numbers under `none`, `stackscope` and `bpftrace`), as a table headed UNIT, then
# the ratios of each profiled rate to the unprofiled one and of stackscope's to bpftrace's.
rate_table() {
    declare -A med
    printf "%-11s %14s\n" tool "$1"
    for tool in none stackscope bpftrace; do
        # shellcheck disable=SC2086
        med[$tool]=$(printf "%s\n" ${rates[$tool]} | median)
        printf "%-11s %14.0f\n" "$tool" "${med[$tool]}"
    done
    echo "ratios: stackscope/none $(calc "${med[stackscope]} / ${med[none]}")," \
        "bpftrace/none $(calc "${med[bpftrace]} / ${med[none]}")," \
        "stackscope/bpftrace $(calc "${med[stackscope]} / ${med[bpftrace]}")"
}
