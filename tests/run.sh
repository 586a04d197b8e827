#!/usr/bin/env bash
# The test suite behind `make test`: every unit binary bin/test_*, then every
# tests/t_*.sh script, in name order. Any failure fails the suite.
# Scripts get K3_BIN (default bin/k3), PYTHON (/usr/bin/python3) and TMPDIR set.
set -u
cd "$(dirname "$0")/.."
export K3_BIN="${K3_BIN:-bin/k3}"
# idle OpenMP threads sleep (bin/k3 sets this itself; the unit binaries do not): spinning
# barriers on a loaded 2-core machine made test_trunk take 757 s instead of 8 s
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PYTHON="${PYTHON:-/usr/bin/python3}"
work=$(mktemp -d /tmp/k3test.XXXXXX)
export K3_TEST_TMP="$work"
trap 'rm -rf "$work"' EXIT
fail=0; n=0
for t in bin/test_*; do
  [ -x "$t" ] || continue
  n=$((n+1))
  if "$t" >"$work/out.txt" 2>&1; then echo "PASS $t"; else echo "FAIL $t"; tail -n 30 "$work/out.txt"; fail=$((fail+1)); fi
done
for t in tests/t_*.sh; do
  [ -f "$t" ] || continue
  n=$((n+1))
  start=$(date +%s)
  if bash "$t" >"$work/out.txt" 2>&1; then echo "PASS $t ($(( $(date +%s)-start ))s)"; else echo "FAIL $t"; tail -n 40 "$work/out.txt"; fail=$((fail+1)); fi
done
echo "$((n-fail))/$n passed"
[ "$fail" -eq 0 ]
