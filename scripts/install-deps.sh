#!/usr/bin/env bash
# Installs what building stackscope (`build`: scripts/demo.sh) or building it and running its
# tests (`test`, the default: .ci/run) needs, when missing. Safe to run again.
set -euo pipefail

# What building stackscope needs: gcc for the C parts of dependencies, and clang, libelf and
# zlib for the eBPF program and the libbpf built with it.
build_packages=(
    gcc libc6-dev                                        # C compiler for -sys crates and test workloads
    clang llvm libelf-dev zlib1g-dev pkg-config make     # the eBPF program (clang -target bpf) and libbpf built from source
)
# What the tests and benchmarks use besides: the real tools whose files or places stackscope
# takes, so that each test runs the real consumer or peer.
test_packages=(
    util-linux                 # taskset/setpriv in tests
    procps                     # pgrep: the stop-signal tests check no launched program is left running
    golang-go                  # `go tool pprof` reads the pprof writer's output in tests
    strace                     # the test that no stack memory reaches stackscope (what it reads)
    qemu-system-x86 gdb        # guest-kernel tests (stackscope gdb) and the OSDK comparison bench
    qemu-system-misc qemu-system-arm  # riscv64 and aarch64 guest-kernel tests
    lld                        # links those test kernels (built by clang --target, so no cross gcc)
    qemu-user                  # a GDB stub that ignores interrupts (qemu-x86_64 -g), in the gdb tests
    gdbserver                  # stackscope gdb tested against a second real stub
    linux-perf                 # perf.data recordings read by `stackscope report`, and the benches
    libssl3                    # libcrypto's hand-written unwind rules, exercised by the BPF walker tests
    binutils xz-utils          # stripped test programs: strip, objcopy, nm, and xz for MiniDebugInfo
    debuginfod elfutils        # a real debuginfod server that the debug-info fetching tests read from
    systemtap-sdt-dev          # sys/sdt.h: the USDT probe of the probes workload (record --event usdt:...)
    bpftrace                   # the peer benches/probe_malloc.sh compares a malloc uprobe against
    cpio                       # the initramfs of the arm64 host test
    nodejs                     # node --perf-prof and --perf-basic-prof: JIT code named from a jitdump and a perf map
    tmux                       # drives `stackscope top`'s full-screen view in its tests (send-keys, capture-pane)
    gcc-mingw-w64-x86-64       # links the x86_64-pc-windows-gnu build (scripts/check.sh) and the Wine test's DLL and program;
                               # and the mingw program with DWARF inside its PE image of the symbolizer's PE tests
    wine64                     # runs that build (scripts/wine-smoke.sh)
    sccache                    # .ci/run's compiler cache, kept outside the clone (~/.cache/sccache)
)

mode=${1:-test}
case "$mode" in
    build) apt_packages=("${build_packages[@]}") ;;
    test) apt_packages=("${build_packages[@]}" "${test_packages[@]}") ;;
    *) echo "usage: $0 [build|test]" >&2; exit 2 ;;
esac
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} ..." >&2
    apt-get update -qq
    # Every QEMU package must be of one version: a qemu-utils installed from elsewhere (a
    # backport) breaks the distribution's qemu-system-*. The tests were measured against the
    # distribution's QEMU, so qemu-utils is brought to its version.
    pinned=()
    if [ "$mode" = test ]; then
        have=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
        want=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ { print $2 }')
        if [ -n "$have" ] && [ -n "$want" ] && [ "$have" != "$want" ]; then
            echo "qemu-utils $have does not match qemu-system-x86 $want: installing qemu-utils $want" >&2
            pinned=(--allow-downgrades "qemu-utils=$want")
        fi
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pinned[@]}" "${missing[@]}" >/dev/null
fi

if [ "$mode" = build ]; then
    exit 0
fi

# The aarch64 cross build (scripts/check.sh): Debian's cross compiler, and the arm64 libelf and
# zlib that libbpf links, from the arm64 architecture added to dpkg.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
fi
cross_missing=()
for pkg in gcc-aarch64-linux-gnu libc6-dev-arm64-cross libelf-dev:arm64 zlib1g-dev:arm64; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || cross_missing+=("$pkg")
done
if [ ${#cross_missing[@]} -gt 0 ]; then
    echo "installing ${cross_missing[*]} ..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${cross_missing[@]}" >/dev/null ||
        echo "warning: could not install ${cross_missing[*]}: the aarch64 cross build will fail" >&2
fi

# Tracepoints are found (and attached, by libbpf) through tracefs; some kernels boot without
# it mounted. The probe tests count at a syscall tracepoint.
if [ "$(id -u)" -eq 0 ] && [ ! -e /sys/kernel/tracing/available_events ] &&
    [ ! -e /sys/kernel/debug/tracing/available_events ]; then
    mount -t tracefs nodev /sys/kernel/tracing ||
        echo "warning: could not mount tracefs: the tracepoint probe test will fail" >&2
fi

# The Rust program of the symbolizer's PE tests is built for the MSVC target (its core library
# only; the Rust toolchain's rust-lld links it, no Windows SDK).
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-msvc; then
    rustup target add x86_64-pc-windows-msvc ||
        echo "warning: could not add the x86_64-pc-windows-msvc target: the Rust PE test will fail" >&2
fi

# cargo-flamegraph, driven with PERF=stackscope-perf by the shim tests.
if ! command -v cargo-flamegraph >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-flamegraph" ]; then
    echo "installing cargo-flamegraph ..." >&2
    # Its lockfile may name a crate version the registry no longer serves: resolve afresh then.
    cargo install flamegraph --locked --quiet || cargo install flamegraph --quiet
fi

# speedscope's file-format schema (MIT licensed, shipped in its npm package) and Python's
# jsonschema: the speedscope writer's test validates its output against them.
speedscope_schema="${XDG_CACHE_HOME:-$HOME/.cache}/stackscope/speedscope-file-format-schema.json"
if [ ! -s "$speedscope_schema" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    fi
    echo "fetching speedscope's file-format schema ..." >&2
    tmp=$(mktemp -d)
    # A failure here fails only the speedscope schema test, which says what is missing.
    if (cd "$tmp" && npm pack --silent speedscope@1.25.0 >/dev/null &&
        tar xzf speedscope-1.25.0.tgz package/dist/release/file-format-schema.json); then
        mkdir -p "$(dirname "$speedscope_schema")"
        cp "$tmp/package/dist/release/file-format-schema.json" "$speedscope_schema"
    else
        echo "warning: could not fetch speedscope's schema from the npm registry" >&2
    fi
    rm -rf "$tmp"
fi
if ! python3 -c 'import jsonschema' 2>/dev/null; then
    echo "installing Python jsonschema ..." >&2
    python3 -m pip install --quiet jsonschema 2>/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-jsonschema >/dev/null; } ||
        echo "warning: could not install Python jsonschema" >&2
fi
