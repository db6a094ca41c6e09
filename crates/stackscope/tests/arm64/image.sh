#!/usr/bin/env bash
# Makes the base of the arm64 test machine in DIR from Debian's own arm64 packages (the
# architecture is added to dpkg by scripts/install-deps.sh): DIR/Image, the kernel of
# linux-image-arm64, and DIR/base.cpio, an initramfs of busybox-static and the libraries the
# cross-built programs load (libc6, libelf1, zlib1g, libgcc-s1), unpacked with dpkg-deb, no
# debootstrap; and DIR/perf.cpio, Debian's arm64 perf (linux-perf) with the shared objects it
# loads that the base lacks, taken from the library packages of its dependency closure as apt
# resolves it (perf record needs none of the perl and python3 programs its scripting pulls in).
# The archives are left uncompressed: the kernel reads an archive appended to an uncompressed
# one, where after a compressed one it may lose its place. The packages' versions are the cache
# key: while DIR/key names the same versions, DIR is kept as it is.
# Usage: image.sh DIR
set -euo pipefail

dir=$1
packages=(linux-image-arm64 busybox-static libc6 libelf1 zlib1g libgcc-s1)

# linux-perf:arm64 and the library packages of its dependency closure, one a line.
perf_closure() {
    apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances linux-perf:arm64 2>/dev/null |
        grep -E '^(lib[^ ]*|linux-perf):arm64$' | sort -u
}

# DIR/perf.cpio: /usr/bin/perf and, following NEEDED entries from it, each shared object it
# loads that the base (DIR/root) does not hold, from the closure's packages unpacked aside.
perf_archive() {
    local dir=$1 staged=$1/perf-staged out=$1/perf-root
    mkdir -p "$dir/perf-debs" "$staged" "$out/usr/bin"
    (cd "$dir/perf-debs" && apt-get download "${perf_wanted[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || {
        echo "cannot download ${perf_wanted[*]} (apt-get download)" >&2
        exit 1
    }
    for deb in "$dir"/perf-debs/*.deb; do
        dpkg-deb -x "$deb" "$staged"
    done
    cp "$staged/usr/bin/perf" "$out/usr/bin/perf"
    local queue=("$staged/usr/bin/perf") seen=" " file soname found libdir
    while [ "${#queue[@]}" -gt 0 ]; do
        file=${queue[0]}
        queue=("${queue[@]:1}")
        for soname in $(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
            case "$seen" in *" $soname "*) continue ;; esac
            seen+="$soname "
            found=
            for libdir in lib/aarch64-linux-gnu usr/lib/aarch64-linux-gnu lib usr/lib; do
                if [ -e "$dir/root/$libdir/$soname" ]; then
                    found=base
                    break
                elif [ -e "$staged/$libdir/$soname" ]; then
                    found=$libdir/$soname
                    break
                fi
            done
            case "$found" in
                "") echo "perf needs $soname, which no package of its closure holds" >&2; exit 1 ;;
                base) ;;
                *)
                    mkdir -p "$out/$(dirname "$found")"
                    cp -L "$staged/$found" "$out/$found"
                    queue+=("$staged/$found")
                    ;;
            esac
        done
    done
    (cd "$out" && find . | cpio -o -H newc --quiet) >"$dir/perf.cpio"
    rm -rf "$dir/perf-debs" "$staged" "$out"
}

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
# perf's closure, but for what the base already holds.
mapfile -t perf_wanted < <(perf_closure | grep -vxF -f <(printf '%s\n' "${wanted[@]}"))
if [ "${#perf_wanted[@]}" -eq 0 ]; then
    echo "no arm64 linux-perf package known to apt: run scripts/install-deps.sh (it adds the arm64 architecture)" >&2
    exit 1
fi
# One apt-cache call for all: each takes seconds on a loaded machine.
key=$(apt-cache policy "${wanted[@]}" "${perf_wanted[@]}" |
    awk '/^[^ ].*:$/ { pkg = substr($1, 1, length($1) - 1) } /Candidate:/ { print pkg, $2 }')
if [ -f "$dir/key" ] && [ "$(cat "$dir/key")" = "$key" ] && [ -f "$dir/Image" ] && [ -f "$dir/base.cpio" ] && [ -f "$dir/perf.cpio" ]; then
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
perf_archive "$dir"
rm -rf "$dir/root"
printf '%s\n' "$key" >"$dir/key"
