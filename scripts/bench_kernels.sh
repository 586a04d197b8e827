#!/usr/bin/env bash
# scripts/bench_kernels.sh - kernel benchmark (run by `make bench` via scripts/bench.sh):
# runs bin/bench_kernels (memory read bandwidth, bf16 and MXFP4 matrix-vector at the
# selected SIMD level and at scalar, 1 thread and all threads), prints its table and
# records it in docs/PERFORMANCE.md under "## Kernels" (only that section is replaced).
# Extra arguments go to bin/bench_kernels (e.g. --simd avx2, --quick).
set -eu
cd "$(dirname "$0")/.."
[ -x bin/bench_kernels ] || make -s bin/bench_kernels
# Passive OpenMP waiting: on a shared machine spinning threads steal the CPU a
# preempted sibling needs, which turns an all-threads run into timeslice noise.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
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
       "(OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, OMP_WAIT_POLICY=$OMP_WAIT_POLICY). Date: $(date -u '+%Y-%m-%d %H:%M UTC')." \
       "Load average before the run: $load (other work on the machine skews the numbers)."
  echo "Command: \`scripts/bench_kernels.sh${*:+ $*}\` (runs \`$cmd\`; also run by \`make bench\`)."
  echo "Compiler: $(${CC:-gcc} --version | head -n1), flags from the Makefile (-O2, -ffp-contract=off)."
  echo
  printf '%s\n' "$out"
  echo
  echo "- The numerics contract fixes the work: every product is formed in double and each of the 8"
  echo "  lanes is one sequential chain of double adds, so a single row's dot cannot go faster than 8"
  echo "  elements per add latency. The drivers therefore interleave 8 rows at one token (AVX2: two 4-row halves; dense and"
  echo "  MXFP4) and, from 4 tokens on (AVX2 and AVX-512 levels), use the multi-token kernels"
  echo "  (common/kernels_gemm_avx2.c: 3 rows x 4 tokens of 4-wide FMA chains in registers, weights"
  echo "  decoded to double once per 16-token block, activations once per 24-row tile;"
  echo "  common/kernels_gemm_avx512.c: 4 rows x 6 tokens of 8-wide chains, 96-row panels whose"
  echo "  activations are converted once per 6-token group, 12-row weight sub-tiles decoded once per"
  echo "  block of up to 72 tokens, 256-column blocks (128 under 32 tokens); \`bin/bench_kernels --gemm\`"
  echo "  measures them at 16-512 tokens); the bits"
  echo "  are those of the single-row dot (tests/unit/test_kernels.c). FMA is exact here: every product"
  echo "  is exact in double."
  echo "- Rows are split with the OpenMP runtime schedule (the run's OMP_SCHEDULE; bin/k3 sets dynamic,4"
  echo "  on an unbound placement)."
  echo "- % of FMA peak: against the 12-chain FMA loop (widest vectors) measured in the same run with the same threads."
  echo "- MXFP4 decode (4-bit code -> E2M1 * 2^(s-127) in double) is the cost: at 1 token the expert"
  echo "  matmuls are compute-bound per core, while bf16 streaming is bound by the memory system."
  echo "- scalar is the reference path; it gives the same bits and is not tuned."
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
