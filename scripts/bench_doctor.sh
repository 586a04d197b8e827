#!/usr/bin/env bash
# bench_doctor.sh [MODEL_DIR] [BUDGET_GIB ...] - `bin/k3 --doctor`'s s/token estimate
# against a measured run, at each budget (default: 2.245 and everything resident), in
# one run: the doctor's estimate (disk and kernel rates measured just before), then
# `bin/k3 MODEL --ids 1,2,3,4 --gen 6 --workers 1` at that budget: decode s/token
# (tokens after the first; the expert caches start cold). Results on stdout
# (docs/PERFORMANCE.md "Doctor's estimate"). Default model models-big/rw6; skipped when
# absent. Shared machine: flock /work/bench.lock scripts/bench_doctor.sh /work/models-big/rw6
set -eu
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
M="${1:-models-big/rw6}"
shift || true
[ -f "$M/config.json" ] || { echo "bench_doctor: $M is absent (make bench-model); skipped"; exit 0; }
budgets="${*:-2.245 max}"
T="$(mktemp -d /tmp/bench_doctor.XXXXXX)"
trap 'rm -rf "$T"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| budget GiB | disk GB/s | BF16 GB/s | MXFP4 GB/s | disk s | compute s | estimate s/token | measured s/token | load |"
echo "|---|---|---|---|---|---|---|---|---|"
for b in $budgets; do
  if [ "$b" = max ]; then run=(--preset max); doc=(); else run=(--mem-gb "$b"); doc=(--mem-gb "$b"); fi
  "$K3_BIN" --doctor "$M" "${doc[@]}" --json "$T/d.json" >/dev/null 2>&1
  "$K3_BIN" "$M" --ids 1,2,3,4 --gen 6 --workers 1 "${run[@]}" --json "$T/r.json" >/dev/null 2>"$T/r.err" || { echo "run at $b failed:"; tail -3 "$T/r.err"; continue; }
  /usr/bin/python3 - "$T/d.json" "$T/r.json" "$b" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
d, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
e, t = d["expected"], r["timing"]
n = t.get("decode_tokens") or max(1, len(r["generated_ids"]) - 1)
print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f to %.2f | %.2f | %s |" % (
    sys.argv[3] if sys.argv[3] != "max" else "max (%.2f)" % e["mem_gb"], d["model"]["read_gb_per_s"],
    d["kernel_bf16_gb_per_s"], d["kernel_mxfp4_gb_per_s"], e["disk_seconds_per_token"], e["compute_seconds_per_token"],
    e["seconds_per_token_min"], e["seconds_per_token"], t["decode_s"] / n, sys.argv[4]))
PY
done
