#!/usr/bin/env bash
# bench_verify.sh [MODEL_DIR] - `bin/k3 --verify` read rate against the device's.
# In one run: load average, the device's sequential O_DIRECT read rate (fio, 8 MiB
# reads, 4 in flight, over the largest shard; dd iflag=direct when fio is absent),
# then --verify without and with --sha256, then --doctor's estimate. Results on
# stdout (docs/PERFORMANCE.md "Verify"). Default model: models-big/rw6 (make
# bench-model); skipped when it is absent. On a shared machine wrap it in the
# benchmark lock: flock /work/bench.lock scripts/bench_verify.sh /work/models-big/rw6
set -eu
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
M="${1:-models-big/rw6}"
[ -f "$M/config.json" ] || { echo "bench_verify: $M is absent (make bench-model); skipped"; exit 0; }
T="$(mktemp -d /tmp/bench_verify.XXXXXX)"
trap 'rm -rf "$T"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $M, $(du -sb "$M" | cut -f1) bytes in $(ls "$M"/*.safetensors | wc -l) shards"
big="$(ls -S "$M"/*.safetensors | head -1)"
if command -v fio >/dev/null; then
  fio --name=seqread --filename="$big" --readonly --rw=read --bs=8M --iodepth=4 --ioengine=libaio --direct=1 \
      --numjobs=1 --output-format=json --output="$T/fio.json" >/dev/null
  dev=$(/usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]['read']; print('%.2f' % (j['io_bytes']/(j['runtime']/1e3)/1e9))" "$T/fio.json")
  echo "device: fio O_DIRECT sequential read of $(basename "$big"), 8 MiB x 4 in flight: $dev GB/s"
else
  dev=$(dd if="$big" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1)
  echo "device: dd iflag=direct bs=8M: $dev"
fi
for mode in "" "--sha256"; do
  "$K3_BIN" --verify "$M" $mode --json "$T/v.json" >"$T/out" 2>/dev/null || { echo "verify $mode: exit $?"; tail -5 "$T/out"; }
  /usr/bin/python3 - "$T/v.json" "$mode" "${dev%% *}" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
dev = float(sys.argv[3]) if sys.argv[3].replace('.', '', 1).isdigit() else 0
r = j["gb_per_s"]
print("verify %-9s %.2f GB in %.1f s = %.2f GB/s (%s, %d threads)%s; ok=%s" % (
    sys.argv[2] or "(values)", j["bytes_read"] / 1e9, j["seconds"], r, j["read_mode"], j["threads"],
    (", %.0f%% of the device" % (100 * r / dev)) if dev else "", j["ok"]))
PY
done
echo "doctor on $M:"
"$K3_BIN" --doctor "$M" 2>/dev/null | grep -E "sequential read|DRAM read|--mem-gb|trunk:|experts:|expected:" | sed 's/^ */  /'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
