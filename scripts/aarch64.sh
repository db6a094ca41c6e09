#!/usr/bin/env bash
# The aarch64-unknown-linux-gnu cross build, with Debian's cross compiler as linker and C
# compiler (libbpf and the -sys crates) and the arm64 libelf and zlib that libbpf links (all
# installed by scripts/install-deps.sh). `build` makes the release stackscope binary that the
# arm64 host test boots (target/aarch64-unknown-linux-gnu/release/stackscope; .ci/run builds it
# before the tests); `clippy` lints the workspace for the target (scripts/check.sh).
# Usage: aarch64.sh build|clippy
set -euo pipefail

cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_PATH=/usr/lib/aarch64-linux-gnu/pkgconfig

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target"
fi
case "${1:-}" in
    build) cargo build --release --target "$target" -p stackscope --bin stackscope ;;
    clippy) cargo clippy --workspace --all-targets --target "$target" -- -D warnings ;;
    *) echo "usage: $0 build|clippy" >&2; exit 2 ;;
esac
