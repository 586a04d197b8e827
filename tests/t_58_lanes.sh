#!/usr/bin/env bash
# The lane layout of MXFP4 codes (issue 13, docs/PERFORMANCE.md "Eleventh session"): a resident
# expert cache rewrites each expert's codes once into the layout the Zen 4 one-token kernel reads
# with one load per row and 128 columns; every consumer reads it with the same bits. On the
# "lanes" preset (expert widths of whole 128-column groups, generated here), with the layout
# forced on (K3_MXFP4_LANES=1, any CPU) against forced off: ids and teacher-forced logits
# identical in-process and through 2 expert servers, prefill chunks of 64, 3, 2 and 1 tokens
# (the panel kernels, the lane kernel token by token, one token), --simd scalar / avx2 (the
# scalar lane dot) and --preload-experts; --json memory.experts_lane_layout counts the rewritten
# experts: all of them in a resident in-process run, none when forced off, none when the cache
# streams (there an expert is used about once per read). Long runs show the repack's time too.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/lanes"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
. tests/lib.sh # jget, gen_preset

M="$T/models/lanes"
gen_preset lanes "$M" || fail "generating the lanes model"
ids=306,326,470,469,258,466,460,265
common=(--ids "$ids" --gen 8 --teacher-force)

K3_MXFP4_LANES=0 "$K3" "$M" "${common[@]}" --workers 0 --preset max --dump-logits "$T/ref.f32" --json "$T/ref.json" \
  > "$T/ref.out" 2> "$T/ref.err" || { cat "$T/ref.err"; fail "the release-layout reference run"; }
[ "$(jget "$T/ref.json" memory.experts_lane_layout)" = 0 ] || fail "K3_MXFP4_LANES=0 still repacked experts"

check() { # tag, then the engine's arguments after the common ones; K3_MXFP4_LANES=1
  local tag=$1; shift
  K3_MXFP4_LANES=1 "$K3" "$M" "${common[@]}" "$@" --dump-logits "$T/$tag.f32" --json "$T/$tag.json" > "$T/$tag.out" 2> "$T/$tag.err" \
    || { cat "$T/$tag.err"; fail "$tag: run failed"; }
  cmp -s "$T/ref.f32" "$T/$tag.f32" || fail "$tag: logits differ from the release layout's"
  cmp -s "$T/ref.out" "$T/$tag.out" || fail "$tag: ids differ from the release layout's"
}

moe_experts=$($PY -c "import json; c=json.load(open('$M/config.json'))['text_config']; print((c['num_hidden_layers'] - c['first_k_dense_replace']) * c['num_experts'])")
for w in 0 2; do
  for chunk in 64 3 2 1; do
    check "w${w}_c$chunk" --workers $w --preset max --chunk $chunk
    if [ $w = 0 ]; then
      n=$(jget "$T/w${w}_c$chunk.json" memory.experts_lane_layout)
      [ "$n" -gt 0 ] || fail "w0 chunk $chunk: a resident in-process run repacked no expert"
    fi
    echo "workers=$w chunk=$chunk: lane layout, identical ids and logits"
  done
done
check pre --workers 0 --preset max --preload-experts
n=$(jget "$T/pre.json" memory.experts_lane_layout)
loaded=$(jget "$T/pre.json" memory.experts_preloaded)
[ "$n" = "$loaded" ] && [ "$n" -gt 0 ] || fail "--preload-experts: $n experts repacked of $loaded preloaded"
[ "$n" = "$moe_experts" ] || fail "--preload-experts: $n experts repacked, the model has $moe_experts"
echo "--preload-experts: all $n experts repacked, identical"
for lvl in scalar avx2 avx512; do
  K3_MXFP4_LANES=1 "$K3" "$M" --ids 1 --gen 1 --simd $lvl > /dev/null 2>&1 || { echo "--simd $lvl: not on this CPU, skipped"; continue; }
  check "simd_$lvl" --workers 0 --preset max --simd $lvl
  echo "--simd $lvl: lane layout, identical"
done
# a streamed cache (the floor) keeps the release layout
K3_MXFP4_LANES=1 "$K3" "$M" --ids "$ids" --gen 1 --workers 0 --json "$T/p.json" > /dev/null 2>&1 || fail "planning run"
floor=$(jget "$T/p.json" memory.floor_bytes)
gb=$($PY -c "import math; print('%.9f' % (math.ceil($floor / 2**30 * 1e9) / 1e9))")
check floor --workers 0 --mem-gb "$gb"
[ "$(jget "$T/floor.json" memory.experts_lane_layout)" = 0 ] || fail "a streamed cache repacked experts"
echo "streamed at the floor ($gb GiB): release layout kept, identical"
echo "OK: the lane layout gives the release layout's bits"
