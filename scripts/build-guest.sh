#!/usr/bin/env bash
# Builds the Linux guest the interoperability tests boot under QEMU: Debian's own kernel
# (the package linux-image-amd64 depends on) with the modules for NVMe/TCP (host and
# target) and the qdiscs this machine's kernel lacks (fq, etf, tbf), busybox, and nvme-cli
# with its libraries, in an initramfs. Nothing of it is
# committed: everything comes from Debian's packages at build time.
#
#   scripts/build-guest.sh [OUTDIR]     (default: target/guest)
#
# Writes OUTDIR/vmlinux (the uncompressed kernel: QEMU boots it through its PVH entry,
# seconds faster under TCG than vmlinuz), OUTDIR/base.cpio.gz and OUTDIR/kernel (the
# package it came from). A test puts a second archive with its /test.sh in front; the base
# /init runs it and powers off. Does nothing when OUTDIR is up to date.
set -euo pipefail
out=${1:-target/guest}
mkdir -p "$out"
out=$(cd "$out" && pwd)

kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
kpkg=$(kernel_package)
if [[ -z "$kpkg" && $EUID -eq 0 ]]; then
  apt-get update -qq && kpkg=$(kernel_package)
fi
if [[ -z "$kpkg" ]]; then
  echo "build-guest: no kernel package behind linux-image-amd64 (run apt-get update)" >&2
  exit 1
fi
# Up to date when built from this kernel package by this very script.
stamp="$kpkg $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && -f "$out/vmlinux" && -f "$out/base.cpio.gz" ]]; then
  exit 0
fi

work=$(mktemp -d)
chmod 0755 "$work"  # apt-get download runs as _apt where it can
trap 'rm -rf "$work"' EXIT
cd "$work"
# nvme-cli's libraries, resolved once on Debian 12 (readelf NEEDED, recursively).
libs=(libnvme1 libjson-c5 zlib1g libuuid1 libc6 libssl3 libdbus-1-3 libsystemd0 libcap2 libgcrypt20
      liblzma5 libzstd1 liblz4-1 libgpg-error0)
echo "build-guest: downloading $kpkg, busybox-static, nvme-cli and ${#libs[@]} libraries"
apt-get download -q "$kpkg" busybox-static nvme-cli "${libs[@]}" >/dev/null
mkdir root
for d in *.deb; do dpkg-deb -x "$d" root; done

kver=${kpkg#linux-image-}
moddir=root/lib/modules/$kver
[[ -d "$moddir" ]] || { echo "build-guest: $kpkg has no modules for $kver" >&2; exit 1; }
bb=root/bin/busybox
"$bb" depmod -b root "$kver"

# The kernel, uncompressed: the ELF behind the xz stream inside vmlinuz.
vmlinuz=root/boot/vmlinuz-$kver
off=$(grep -abo $'\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
tail -c "+$((off + 1))" "$vmlinuz" | xz -dc > "$out/vmlinux" 2>/dev/null || true
if ! head -c 4 "$out/vmlinux" | grep -q $'\x7fELF'; then
  echo "build-guest: could not extract vmlinux from $vmlinuz" >&2
  exit 1
fi

# The initramfs tree.
ir=$work/ir
mkdir -p "$ir"/{bin,sbin,dev,proc,sys,tmp,etc,mnt,lib64,usr/sbin,lib/x86_64-linux-gnu,sys/kernel/config}
cp root/bin/busybox "$ir/bin/"
for app in $("$ir/bin/busybox" --list); do
  [[ -e "$ir/bin/$app" ]] || ln -s busybox "$ir/bin/$app"
done
cp root/usr/sbin/nvme "$ir/usr/sbin/"
cp -a root/lib/x86_64-linux-gnu/. "$ir/lib/x86_64-linux-gnu/" 2>/dev/null || true
cp -a root/usr/lib/x86_64-linux-gnu/. "$ir/lib/x86_64-linux-gnu/" 2>/dev/null || true
ln -sf /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$ir/lib64/ld-linux-x86-64.so.2"
mkdir -p "$ir/etc/nvme"

# The wanted modules and everything they depend on (modules.dep lists paths).
wanted=(virtio_pci virtio_net nvme_tcp nvme_fabrics nvme_core nvmet nvmet_tcp brd null_blk configfs sch_fq sch_etf sch_tbf
        crc32c_generic crc32c_intel)
declare -A take=()
add() {
  local rel=$1
  [[ -n "${take[$rel]:-}" ]] && return
  take[$rel]=1
  local deps
  deps=$(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$moddir/modules.dep")
  for d in $deps; do add "$d"; done
}
for m in "${wanted[@]}"; do
  rel=$(awk -F: -v m="$m" '{ n = $1; sub(".*/", "", n); sub("\\.ko.*", "", n); gsub("-", "_", n) } n == m { print $1; exit }' "$moddir/modules.dep")
  if [[ -n "$rel" ]]; then add "$rel"; fi  # built in when absent
done
for rel in "${!take[@]}"; do
  mkdir -p "$ir/lib/modules/$kver/$(dirname "$rel")"
  cp "$moddir/$rel" "$ir/lib/modules/$kver/$rel"
done
cp "$moddir"/modules.{order,builtin} "$ir/lib/modules/$kver/" 2>/dev/null || true
"$bb" depmod -b "$ir" "$kver"

cat > "$ir/init" <<'EOF'
#!/bin/sh
# netlane test guest: mount, load modules, bring up the network, run /test.sh, power off.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

mount -t tmpfs tmpfs /tmp
for m in virtio_pci virtio_net crc32c_intel crc32c_generic configfs nvme_tcp nvmet_tcp; do
  modprobe "$m" 2>/dev/null
done
mount -t configfs configfs /sys/kernel/config
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
echo "NETLANE-GUEST: up $(uname -r)"
if [ -x /test.sh ]; then
  /test.sh
  echo "NETLANE-GUEST: test exited $?"
fi
echo "NETLANE-GUEST: done"
poweroff -f
EOF
chmod +x "$ir/init"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/base.cpio.gz"
echo "$kpkg" > "$out/kernel"
echo "$stamp" > "$out/stamp"
echo "build-guest: $kpkg, $(du -h "$out/base.cpio.gz" | cut -f1) initramfs in $out"
