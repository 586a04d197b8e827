#!/usr/bin/env bash
# Multi-node placement proven in QEMU guests (issue 11): Debian's kernel booted under
# QEMU (TCG, no KVM needed) with a described NUMA topology, an initramfs holding
# busybox, bin/k3, bin/k3-expertd, their libraries and tests/models/m13
# (tests/guest/mkinitramfs.sh), and tests/guest/numa_checks.sh as the payload:
#   control   1 node (2 cpus), m13: one unbound server, ids identical
#   2s1n      2 sockets x 1 node (2 cpus each): one server per node (the default)
#   2s2n      2 sockets x 2 nodes (1 cpu each, 4 nodes): --workers-per-node 2
# In the multi-node guests (on the generated "numa" model, whose trunk matrices span many
# pages): every server bound inside its node (Cpus_allowed_list = its placement) with most of
# its anonymous pages there (numa_maps); the coordinator has threads bound to every node's
# cpus, at least half a fair share of its anonymous pages on every node, and the trunk rows
# it placed on node N (prefer:N ranges) on node N; the last server, SIGKILLed, comes back on
# the same node; ids identical to the host's --workers 0 run. One boot per topology, one run.
# SKIP (exit 0) only when qemu-system-x86_64 is absent.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/numa"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "SKIP: qemu-system-x86_64 is not installed (Debian package qemu-system-x86): NUMA guests not run"
  exit 0
fi
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
[ -n "$kernel" ] && [ -r "$kernel" ] || fail "no readable /boot/vmlinuz-* (Debian package linux-image-amd64)"
command -v busybox >/dev/null 2>&1 || [ -x /bin/busybox ] || fail "no busybox (Debian package busybox-static)"
command -v cpio >/dev/null 2>&1 || fail "no cpio (Debian package cpio)"
[ -x "$(dirname "$K3")/k3-expertd" ] || fail "no $(dirname "$K3")/k3-expertd"
[ -x "$(dirname "$K3")/k3-expertd-faults" ] || fail "no $(dirname "$K3")/k3-expertd-faults"

ids=$($PY -c "import json; print(','.join(map(str, json.load(open('tests/expected/m13.json'))['prompt_ids'])))")
# a model whose trunk matrices span many pages (generated, not committed; ~6 s)
[ -f "$T/mn/config.json" ] || $PY scripts/gen_model.py --preset numa --out "$T/mn" --no-expected > /dev/null || fail "generating the numa model"
"$K3" tests/models/m13 --ids "$ids" --gen 6 --workers 0 > "$T/ref.txt" 2> "$T/ref.err" || { cat "$T/ref.err"; fail "host --workers 0 run (m13)"; }
"$K3" "$T/mn" --ids "$ids" --gen 6 --workers 0 > "$T/ref_mn.txt" 2> "$T/ref.err" || { cat "$T/ref.err"; fail "host --workers 0 run (numa model)"; }
echo "$ids" > "$T/ids.txt"
echo "host --workers 0 ids: m13 $(cat "$T/ref.txt"), numa model $(cat "$T/ref_mn.txt")"
tests/guest/mkinitramfs.sh "$T/initrd.gz" tests/guest/numa_checks.sh "$T/ids.txt" "$T/ref.txt" "$T/ref_mn.txt" "$T/mn" \
  || fail "building the initramfs"

accel=tcg  # TCG always: -cpu max under a nested KVM can refuse MSRs
boot() { # name smp-spec mem-per-node node-cpu-lists...
  local name=$1 smp=$2 mem=$3; shift 3
  local args=() i=0 total=0
  for cpus in "$@"; do
    args+=(-object "memory-backend-ram,id=m$i,size=${mem}M" -numa "node,nodeid=$i,cpus=$cpus,memdev=m$i")
    i=$((i + 1)); total=$((total + mem))
  done
  local start=$(date +%s)
  timeout 600 qemu-system-x86_64 -machine "q35,accel=$accel" -cpu max -smp "$smp" -m "${total}M" "${args[@]}" \
    -kernel "$kernel" -initrd "$T/initrd.gz" -append "console=ttyS0 quiet panic=-1 k3topo=$name" \
    -nographic -no-reboot -nodefaults -serial stdio < /dev/null > "$T/$name.log" 2>&1
  local rc=$?
  tr -d '\r' < "$T/$name.log" | grep -E '^(GUEST|guest |K3GUEST)' | sed "s/^/  /"
  echo "$name: $(( $(date +%s) - start )) s"
  grep -q '^K3GUEST-END rc=0' <(tr -d '\r' < "$T/$name.log") || {
    tr -d '\r' < "$T/$name.log" | tail -n 60
    fail "$name: the guest's checks failed (qemu exit $rc)"
  }
  grep -q 'GUEST FAIL' "$T/$name.log" && fail "$name: a check failed"
  grep -q 'GUEST PASS' "$T/$name.log" || fail "$name: no check ran"
  return 0
}
boot control 2 512 0-1
boot 2s1n 4,sockets=2,cores=2,threads=1 512 0-1 2-3
boot 2s2n 4,sockets=2,cores=2,threads=1 384 0 1 2 3
echo "NUMA guests: placement, restart on the same node, --workers-per-node 2, ids identical"
