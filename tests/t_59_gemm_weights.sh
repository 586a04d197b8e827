#!/usr/bin/env bash
# The AVX-512 gemm's two ways of giving its micro-kernels their weights (k3_gemm_weights,
# common/kernels_impl.h; docs/PERFORMANCE.md "Twelfth session"): widened in the micro-kernel
# (chosen on Zen 4 and Zen 5) or every sub-tile decoded into doubles once per token block (chosen
# elsewhere). A CPU's drivers use one; K3_GEMM_WEIGHTS=widen|double forces either, so here both
# run on any CPU with AVX-512: the whole kernel battery (bin/test_kernels) through the drivers
# in each way, and the engine's ids and teacher-forced logits on a generated model, in-process
# and through 2 expert servers (they inherit the environment), prefill chunks of 64 and 5 tokens
# (the panels: 4+ tokens), identical between the two ways (--json kernel_choice shows the way used).
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/gemm_weights"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
. tests/lib.sh # jget, gen_preset

M="$T/models/lanes"
gen_preset lanes "$M" || fail "generating the test model"
if ! "$K3" "$M" --ids 1 --gen 1 --simd avx512 > /dev/null 2> "$T/probe.err"; then
  grep -q "is not supported by this CPU" "$T/probe.err" || { cat "$T/probe.err"; fail "the --simd avx512 probe failed"; }
  echo "SKIP: --simd avx512 not on this CPU (the gemm's two ways are AVX-512 kernels)"
  exit 0
fi
for how in widen double; do
  K3_GEMM_WEIGHTS=$how OMP_WAIT_POLICY=PASSIVE bin/test_kernels > "$T/unit_$how.out" 2>&1 \
    || { grep FAIL "$T/unit_$how.out" | head -5; fail "bin/test_kernels with K3_GEMM_WEIGHTS=$how"; }
  echo "bin/test_kernels with K3_GEMM_WEIGHTS=$how: $(tail -n1 "$T/unit_$how.out" | head -c 80)"
done

ids=306,326,470,469,258,466,460,265,300,301,302,303,304
for w in 0 2; do
  for chunk in 64 5; do
    for how in widen double; do
      K3_GEMM_WEIGHTS=$how "$K3" "$M" --ids "$ids" --gen 6 --teacher-force --workers $w --preset max --chunk $chunk \
        --simd avx512 --dump-logits "$T/$how.f32" --json "$T/$how.json" > "$T/$how.out" 2> "$T/$how.err" \
        || { cat "$T/$how.err"; fail "workers=$w chunk=$chunk K3_GEMM_WEIGHTS=$how: run failed"; }
      kc=$(jget "$T/$how.json" kernel_choice)
      case "$kc" in *"gemm=$how"*) ;; *) fail "K3_GEMM_WEIGHTS=$how: --json kernel_choice says '$kc'" ;; esac
    done
    cmp -s "$T/widen.f32" "$T/double.f32" || fail "workers=$w chunk=$chunk: logits differ between widen and double"
    cmp -s "$T/widen.out" "$T/double.out" || fail "workers=$w chunk=$chunk: ids differ between widen and double"
    echo "workers=$w chunk=$chunk: widen and double give identical ids and logits"
  done
done
echo "OK: both ways of the gemm's weights give the same bits"
