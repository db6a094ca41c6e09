#!/usr/bin/env bash
# The checks CI runs besides the test suite (.ci/run calls this after the tests), so that no
# code rots unseen, the Windows code included, which this Linux machine cannot run:
#   - formatting (cargo fmt --check) and clippy with -D warnings for Linux;
#   - the symbolizer's `symbol-server` feature (off by default): its clippy and the PE tests
#     with it, which download a PDB from a symbol server on this machine;
#   - clippy with -D warnings for x86_64-pc-windows-msvc and x86_64-pc-windows-gnu (type
#     checking needs no Windows linker);
#   - a full build of the Windows binaries for x86_64-pc-windows-gnu (linked by mingw-w64's
#     gcc, Rust's default linker for that target), into target/x86_64-pc-windows-gnu/debug;
#   - scripts/wine-smoke.sh: that build run under Wine;
#   - clippy with -D warnings for aarch64-unknown-linux-gnu (scripts/aarch64.sh, which also
#     makes the cross build that .ci/run makes before the tests).
# Every check runs even when one before failed; the last lines say each one's result, and the
# exit status is 1 when any failed. The apt packages (mingw-w64, wine64, the aarch64 cross
# compiler and arm64 libraries) come from
# scripts/install-deps.sh; the Rust targets and components are added here when missing.
set -uo pipefail

cd "$(dirname "$0")/.."

windows_targets=(x86_64-pc-windows-msvc x86_64-pc-windows-gnu)

results=()
failed=0
# check NAME COMMAND...: runs COMMAND, records NAME's result and time.
check() {
    local name=$1 start=$SECONDS status=0
    shift
    echo "== check: $name: $*"
    "$@" || status=$?
    if [ "$status" -eq 0 ]; then
        results+=("check $name: ok ($((SECONDS - start)) s)")
    else
        results+=("check $name: FAILED (exit status $status, $((SECONDS - start)) s)")
        failed=$((failed + 1))
    fi
    return "$status"
}

# rustup's minimal profile leaves out clippy and rustfmt.
components() {
    cargo clippy --version >/dev/null 2>&1 || rustup component add clippy || return
    cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt || return
    local installed missing=()
    installed=$(rustup target list --installed) || return
    for target in "${windows_targets[@]}"; do
        grep -qx "$target" <<<"$installed" || missing+=("$target")
    done
    [ ${#missing[@]} -eq 0 ] || rustup target add "${missing[@]}"
}

check toolchain components
check fmt cargo fmt --all --check
check clippy-linux cargo clippy --workspace --all-targets -- -D warnings
# The symbol-server feature is off by default, so the suite ran its PE test without it.
check clippy-symbol-server \
    cargo clippy -p stackscope-symbols --all-targets --features symbol-server -- -D warnings
check test-symbol-server \
    cargo test --release -p stackscope-symbols --features symbol-server --test pe
for target in "${windows_targets[@]}"; do
    check "clippy-${target#x86_64-pc-}" \
        cargo clippy --workspace --all-targets --target "$target" -- -D warnings
done
if check build-windows-gnu cargo build --workspace --target x86_64-pc-windows-gnu; then
    check wine-smoke scripts/wine-smoke.sh
else
    # Older binaries may be there from an earlier build: do not run those.
    results+=("check wine-smoke: FAILED (not run: the windows-gnu build failed)")
    failed=$((failed + 1))
fi

check clippy-aarch64 scripts/aarch64.sh clippy

echo
printf '%s\n' "${results[@]}"
[ "$failed" -eq 0 ]
