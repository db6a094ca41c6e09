#!/usr/bin/env bash
# Makes the base of the arm64 test machine in DIR from Debian's own arm64 packages (the
# architecture is added to dpkg by scripts/install-deps.sh): DIR/Image, the kernel of
# linux-image-arm64, and DIR/base.cpio, an initramfs of busybox-static and the libraries the
# cross-built programs load (libc6, libelf1, zlib1g, libgcc-s1), unpacked with dpkg-deb, no
# debootstrap. It is left uncompressed: the kernel reads a second archive appended to an
# uncompressed one, where after a compressed one it may lose its place. The packages' versions are the cache key: while DIR/key names the same
# versions, DIR is kept as it is.
# Usage: image.sh DIR
set -euo pipefail

dir=$1
packages=(linux-image-arm64 busybox-static libc6 libelf1 zlib1g libgcc-s1)

# The kernel metapackage names the versioned image package it depends on.
kernel=$(apt-cache depends linux-image-arm64:arm64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
if [ -z "$kernel" ]; then
    echo "no arm64 kernel package known to apt: run scripts/install-deps.sh (it adds the arm64 architecture)" >&2
    exit 1
fi
wanted=("${kernel%:arm64}:arm64")
for pkg in "${packages[@]:1}"; do
    wanted+=("$pkg:arm64")
done
key=$(for pkg in "${wanted[@]}"; do
    printf '%s %s\n' "$pkg" "$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2 }')"
done)
if [ -f "$dir/key" ] && [ "$(cat "$dir/key")" = "$key" ] && [ -f "$dir/Image" ] && [ -f "$dir/base.cpio" ]; then
    exit 0
fi

rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && apt-get download "${wanted[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || {
    echo "cannot download ${wanted[*]} (apt-get download)" >&2
    exit 1
}
for deb in "$dir"/debs/*.deb; do
    case "$deb" in
        */linux-image-*)
            # The kernel only: its modules are not needed (the virt machine's serial port,
            # perf events and BPF are built in).
            dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir" --wildcards './boot/vmlinuz-*'
            mv "$dir"/boot/vmlinuz-* "$dir/Image"
            rmdir "$dir/boot"
            ;;
        *) dpkg-deb -x "$deb" "$dir/root" ;;
    esac
done
rm -rf "$dir/debs" "$dir/root/usr/share"
mkdir -p "$dir"/root/{proc,sys,dev,tmp}
(cd "$dir/root" && find . | cpio -o -H newc --quiet) >"$dir/base.cpio"
rm -rf "$dir/root"
printf '%s\n' "$key" >"$dir/key"
