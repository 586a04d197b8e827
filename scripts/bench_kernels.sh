#!/usr/bin/env bash
# scripts/bench_kernels.sh - kernel benchmark (run by `make bench` via scripts/bench.sh):
# runs bin/bench_kernels (memory read bandwidth, bf16 and MXFP4 matrix-vector at the
# selected SIMD level and at scalar, 1 thread and all threads), prints its table and
# records it in docs/PERFORMANCE.md under "## Kernels" (only that section is replaced).
# Extra arguments go to bin/bench_kernels (e.g. --simd avx2, --quick).
set -eu
cd "$(dirname "$0")/.."
[ -x bin/bench_kernels ] || make -s bin/bench_kernels
cmd="bin/bench_kernels${*:+ $*}"
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
out=$(bin/bench_kernels "$@")
printf '%s\n' "$out"

model=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
sockets=$(lscpu | sed -n 's/^Socket(s):[[:space:]]*//p' | head -n1)
cores=$(lscpu | sed -n 's/^Core(s) per socket:[[:space:]]*//p' | head -n1)
threads=$(nproc)
doc=docs/PERFORMANCE.md
section=$(mktemp)
trap 'rm -f "$section" "$section.new"' EXIT
{
  echo "## Kernels"
  echo
  echo "Machine: ${model:-unknown CPU}, ${sockets:-?} socket(s) x ${cores:-?} cores, $threads hardware threads" \
       "(OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}). Date: $(date -u '+%Y-%m-%d %H:%M UTC')." \
       "Load average before the run: $load (other work on the machine skews the numbers)."
  echo "Command: \`scripts/bench_kernels.sh${*:+ $*}\` (runs \`$cmd\`; also run by \`make bench\`)."
  echo "Compiler: $(${CC:-gcc} --version | head -n1), flags from the Makefile (-O2, -ffp-contract=off)."
  echo
  printf '%s\n' "$out"
  echo
} >"$section"

mkdir -p docs
[ -f "$doc" ] || printf '# Performance\n\n' >"$doc"
# Replace the "## Kernels" section (up to the next "## " heading) or append it.
awk -v sec="$section" '
  function emit() { while ((getline l < sec) > 0) print l; close(sec); done = 1 }
  /^## / { if (skip) skip = 0; if ($0 == "## Kernels") { emit(); skip = 1; next } }
  !skip { print; last = $0 }
  END { if (!done) { if (last != "") print ""; emit() } }
' "$doc" >"$section.new"
mv "$section.new" "$doc"
echo "(recorded in $doc, section \"## Kernels\")"
