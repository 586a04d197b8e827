#!/usr/bin/env bash
# Builds the initramfs of the NUMA test guests (tests/t_60_numa_guests.sh):
#   tests/guest/mkinitramfs.sh OUT.cpio.gz GUEST_SCRIPT [FILE...]
# It holds busybox (installed as /bin/* at boot), bin/k3, bin/k3-expertd and the test
# build bin/k3-expertd-faults (fault injection: numa_checks.sh stops a server with K3_FAULT)
# under /k3/bin, every shared library `ldd` lists at the same path,
# tests/models/m13 under /k3/m13, GUEST_SCRIPT as /k3/guest.sh, the extra FILEs
# under /k3/, and an /init that mounts proc, sysfs, devtmpfs, a tmpfs on /dev/shm
# and /tmp, runs `sh /k3/guest.sh` (its output goes to the serial console),
# prints "K3GUEST-END rc=N" and powers off. Run from the repository root.
set -euo pipefail
out=$1; script=$2; shift 2
BUSYBOX=${BUSYBOX:-$(command -v busybox || echo /bin/busybox)}
stage=$(mktemp -d "${TMPDIR:-/tmp}/k3initrd.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,proc,sys,dev,tmp,k3/bin,etc}
cp "$BUSYBOX" "$stage/bin/busybox"
bindir=$(dirname "${K3_BIN:-bin/k3}")
cp "$bindir/k3" "$bindir/k3-expertd" "$bindir/k3-expertd-faults" "$stage/k3/bin/"
for lib in $(ldd "$bindir/k3" "$bindir/k3-expertd" "$bindir/k3-expertd-faults" | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\// {print $1}' | sort -u); do
  mkdir -p "$stage$(dirname "$lib")"
  cp -L "$lib" "$stage$lib"
done
cp -r tests/models/m13 "$stage/k3/m13"
cp "$script" "$stage/k3/guest.sh"
for f in "$@"; do cp -r "$f" "$stage/k3/"; done
cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp
cd /k3
sh /k3/guest.sh
echo "K3GUEST-END rc=$?"
poweroff -f
INIT
chmod +x "$stage/init"
(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) > "$out"
