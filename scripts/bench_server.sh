#!/usr/bin/env bash
# scripts/bench_server.sh - the server's batched decoding on a model, against the machine's read
# bandwidth measured in the same run. Holds $BENCH_LOCK for the whole measurement (ceilings,
# server, ceilings again), so no other benchmark lands in between.
#   scripts/bench_server.sh [MODEL] [-- extra bin/k3 flags]
# Environment: STREAMS (1,2,4,8), GEN (8 tokens per stream), PLEN (16 prompt ids per stream),
# REPS (1), K3 (bin/k3; copy bin/k3 and bin/k3-expertd elsewhere to keep building while it
# waits), BENCH_LOCK (/work/bench.lock if /work exists, else /tmp/k3-bench.lock), MD (append
# the table to this file). Default flags: --mem-gb 8 --workers 1 --max-context 256.
# Prints `uptime` and the ceilings on stderr, the markdown table on stdout.
set -eu
cd "$(dirname "$0")/.."
MODEL=${1:-}
[ $# -gt 0 ] && shift
if [ -z "$MODEL" ]; then
  if [ -f models-big/rw6/config.json ]; then MODEL=models-big/rw6; else MODEL=/work/models-big/rw6; fi
fi
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
[ ${#EXTRA[@]} -gt 0 ] || EXTRA=(--mem-gb 8 --workers 1 --max-context 256)
if [ -z "${BENCH_LOCK:-}" ]; then
  if [ -d /work ]; then BENCH_LOCK=/work/bench.lock; else BENCH_LOCK=/tmp/k3-bench.lock; fi
fi
K3=${K3:-bin/k3}
[ -x "$K3" ] && [ -x bin/bench_kernels ] || make -s bin/k3 bin/bench_kernels
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
echo "bench_server: waiting for $BENCH_LOCK" >&2
exec 9>> "$BENCH_LOCK"
flock 9
echo "bench_server: start: $(uptime)" >&2
c0=$(bin/bench_kernels --ceilings | awk '$1 == "read_bw_gbs" { if ($3 > m) m = $3 } END { print m }')
echo "bench_server: read bandwidth before: $c0 GB/s" >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
/usr/bin/python3 scripts/bench_server.py "$MODEL" --streams "${STREAMS:-1,2,4,8}" --gen "${GEN:-8}" \
  --prompt-len "${PLEN:-16}" --reps "${REPS:-1}" --ceiling-gbs "$c0" --k3 "$K3" -- "${EXTRA[@]}" > "$out"
c1=$(bin/bench_kernels --ceilings | awk '$1 == "read_bw_gbs" { if ($3 > m) m = $3 } END { print m }')
echo "bench_server: read bandwidth after: $c1 GB/s; end: $(uptime)" >&2
cat "$out"
echo "Read bandwidth (bin/bench_kernels --ceilings, all threads): $c0 GB/s before, $c1 GB/s after the server runs (the table's ratio uses the one before)."
if [ -n "${MD:-}" ]; then cat "$out" >> "$MD"; fi
