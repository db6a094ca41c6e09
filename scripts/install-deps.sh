#!/usr/bin/env bash
# Installs the Debian packages that building stackscope and running its tests need, if any is
# missing. Called by scripts/demo.sh and .ci/run; safe to run again.
set -euo pipefail

apt_packages=(
    gcc libc6-dev util-linux   # C test workloads, taskset/setpriv in tests
    gdbserver                  # stackscope gdb tested against a second real stub
    golang-go                  # `go tool pprof` reads the pprof writer's output in tests
)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} ..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
