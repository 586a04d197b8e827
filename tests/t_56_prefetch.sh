#!/usr/bin/env bash
# Streaming (issue 13 item 4): router-score prefetch of the next MoE layer's experts and
# several reads in flight never change a bit. On both committed models: ids and teacher-forced
# logits identical to the resident reference with --expert-prefetch off/predict/on, at
# --read-threads 0, 1 and 4, at the floor, a partly pinned trunk and a tiny expert cache
# (hints evicted and wasted), in-process and with 2 expert servers (the hint travels in the
# request of the layer before: wire.h); measured peak RSS within the budget (the router copies
# are a plan line); --json `prefetch`: the prediction scored on every MoE layer after the
# first, recall within [0, 1], hinted reads counted and used (a hint that is used is a hit), the
# servers' counters summed through the ring's stats page. --preload-experts: the same bits, nothing
# read after a resident load, a bad expert refused at load. --expert-prefetch on keeps 2 x top-k
# expert slots per cache in the plan.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/prefetch"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
. tests/lib.sh # jget

for name in m13 m14b12; do
  M=tests/models/$name
  rm -f "$T/b.json.hinted" "$T/b.json.hinted_servers"
  ids=$($PY -c "import json; print(','.join(map(str, json.load(open('tests/expected/$name.json'))['prompt_ids'])))")
  "$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers 0 --preset max --expert-prefetch off --dump-logits "$T/ref.f32" \
    > "$T/ref.out" 2>/dev/null || fail "$name: reference run"
  for w in 0 2; do
    "$K3" "$M" --ids "$ids" --gen 1 --workers $w --expert-prefetch on --json "$T/p.json" > /dev/null 2>&1 || fail "$name: planning run"
    floor=$(jget "$T/p.json" memory.floor_bytes)
    for extra in 0 600000; do
      gb=$($PY -c "import math; print('%.9f' % (math.ceil(($floor + $extra) / 2**30 * 1e9) / 1e9))")
      for cache in "" "--expert-cache-mb 0.05"; do
        for pf in predict on; do
          for rt in 0 1 4; do
            [ "$pf" = predict ] && [ "$rt" != 4 ] && continue
            [ "$w" = 2 ] && { [ "$pf" = predict ] || [ "$rt" = 1 ]; } && continue # servers: no hints
            what="$name workers=$w --mem-gb $gb $cache --expert-prefetch $pf --read-threads $rt"
            "$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers $w --mem-gb $gb $cache --expert-prefetch $pf \
              --read-threads $rt --dump-logits "$T/b.f32" --json "$T/b.json" > "$T/b.out" 2> "$T/b.err" \
              || { cat "$T/b.err"; fail "$what: run failed"; }
            cmp -s "$T/ref.f32" "$T/b.f32" || fail "$what: logits differ from the reference"
            cmp -s "$T/ref.out" "$T/b.out" || fail "$what: ids differ"
            grep -q "expert predictor" "$T/b.err" || fail "$what: the plan has no expert predictor line"
            $PY - "$T/b.json" "$w" "$pf" "$rt" "$what" << 'PYEOF' || fail "$what: --json prefetch"
import json, sys
j = json.load(open(sys.argv[1])); w, pf, rt, what = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
p, m = j["prefetch"], j["memory"]
assert m["peak_rss_total_bytes"] <= m["budget_bytes"], ("peak RSS above the budget", m["peak_rss_total_bytes"], m["budget_bytes"])
assert p["mode"] == pf, p
assert p["layers_scored"] > 0 and p["actual_experts"] > 0, p
assert 0 <= p["correct"] <= min(p["actual_experts"], p["predicted_experts"]), p
assert 0.0 <= p["recall"] <= 1.0, p
if pf == "on":  # hinted: handed to the cache(s); hint_reads: reads they started (readers, 2+ slots); servers: summed
    assert p["hint_reads"] <= p["hinted"], p
    assert rt > 0 or p["hint_reads"] == 0, p
    assert p["hint_hits"] <= p["hint_reads"] and p["hint_hits"] <= m["expert_hits"], (p, m)
    assert p["hint_wasted"] + p["hint_hits"] <= p["hint_reads"], p
    if p["hint_reads"] > 0:
        open(sys.argv[1] + (".hinted" if w == 0 else ".hinted_servers"), "a").write("%d %d\n" % (p["hint_reads"], p["hint_hits"]))
elif pf == "predict":
    assert p["hinted"] == 0, p
print("%s: recall %.3f, hinted %d, used %s" % (what, p["recall"], p["hinted"], p.get("hint_hits", "-")))
PYEOF
          done
        done
      done
    done
  done
  for f in hinted hinted_servers; do
    [ -s "$T/b.json.$f" ] || fail "$name: no run started a hinted read ($f)"
    $PY -c "import sys; r=[tuple(map(int,l.split())) for l in open(sys.argv[1])]; assert sum(u for h,u in r) > 0" "$T/b.json.$f" \
      || fail "$name: no hinted read was ever used ($f)"
  done
done
# --expert-prefetch on keeps 2 x top-k expert slots (m13: 8) before the trunk is pinned, when the
# budget allows: at the floor + 600 kB the plan without prefetching gives the cache one slot
M=tests/models/m13
"$K3" "$M" --ids 1 --gen 1 --workers 0 --expert-prefetch on --json "$T/p.json" > /dev/null 2>&1 || fail "prefetch slots: planning run"
gb=$($PY -c "import math; print('%.9f' % (math.ceil(($(jget "$T/p.json" memory.floor_bytes) + 600000) / 2**30 * 1e9) / 1e9))")
for pf in off on; do
  "$K3" "$M" --ids 1 --gen 1 --workers 0 --mem-gb "$gb" --expert-prefetch $pf > /dev/null 2> "$T/ps.$pf" || fail "prefetch slots: $pf run"
done
slots() { sed -n 's/.*expert cache .*= \([0-9]*\) experts of.*/\1/p' "$1" | head -n 1; }
[ "$(slots "$T/ps.on")" -ge 8 ] && [ "$(slots "$T/ps.off")" -lt 8 ] && grep -q "prefetch slots" "$T/ps.on" \
  || fail "prefetch slots: on $(slots "$T/ps.on"), off $(slots "$T/ps.off") (want >= 8 with on, the plan naming them)"
# a reader refused: --read-threads out of range is a usage error
"$K3" tests/models/m13 --ids 1 --gen 1 --read-threads 300 > /dev/null 2> "$T/u.err"
[ $? = 2 ] || fail "--read-threads 300 should be refused"
"$K3" tests/models/m13 --ids 1 --gen 1 --expert-prefetch maybe > /dev/null 2> "$T/u.err"
[ $? = 2 ] && grep -q "off|predict|on" "$T/u.err" || fail "--expert-prefetch maybe should be refused naming the choices"
# --preload-experts: every expert the caches hold is read at load (in-process and in each server),
# the ids and logits are the reference's, and a resident run then reads nothing more; a bad
# expert (scale byte 255) that no request would touch fails the load, naming the tensor.
M=tests/models/m13
ids=$($PY -c "import json; print(','.join(map(str, json.load(open('tests/expected/m13.json'))['prompt_ids'])))")
"$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers 0 --preset max --dump-logits "$T/ref.f32" > "$T/ref.out" 2>/dev/null \
  || fail "preload: reference run"
for w in 0 2; do
  for mem in "--preset max" "--mem-gb 0.0515 --threads 2"; do
    what="--preload-experts --workers $w $mem"
    "$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers $w $mem --preload-experts --dump-logits "$T/b.f32" \
      --json "$T/b.json" > "$T/b.out" 2> "$T/b.err" || { cat "$T/b.err"; fail "$what: run failed"; }
    cmp -s "$T/ref.f32" "$T/b.f32" || fail "$what: logits differ from the reference"
    cmp -s "$T/ref.out" "$T/b.out" || fail "$what: ids differ"
    grep -q "preloading experts" "$T/b.err" || fail "$what: no preload progress on stderr"
    $PY - "$T/b.json" "$mem" "$what" << 'PYEOF' || fail "$what: --json memory"
import json, sys
j = json.load(open(sys.argv[1])); m = j["memory"]; resident = "max" in sys.argv[2]
assert m["experts_preloaded"] > 0, m
if resident:  # 12 MoE layers x 16 experts, all read at load, none after
    assert m["experts_preloaded"] == 192 and m["expert_misses"] == 192, m
print("%s: preloaded %d, misses %d, hits %d" % (sys.argv[3], m["experts_preloaded"], m["expert_misses"], m["expert_hits"]))
PYEOF
  done
done
P=language_model.model
rm -rf "$T/bad" && cp -r "$M" "$T/bad" && $PY tests/mutate_checkpoint.py "$T/bad" poke "$P.layers.12.block_sparse_moe.experts.15.w1.weight_scale" 3 255 \
  || fail "preload: poke failed"
for w in 0 2; do
  "$K3" "$T/bad" --ids 1 --gen 1 --workers $w --preset max --preload-experts > /dev/null 2> "$T/u.err"
  rc=$?
  [ $rc != 0 ] && [ $rc != 2 ] && grep -q "layers.12.block_sparse_moe.experts.15.w1.weight_scale" "$T/u.err" \
    || { cat "$T/u.err"; fail "--preload-experts --workers $w: a bad expert must fail the load naming it (exit $rc)"; }
done
"$K3" "$M" --ids 1 --gen 1 --mpi --preload-experts > /dev/null 2> "$T/u.err"
[ $? = 2 ] && grep -q "preload-experts" "$T/u.err" || fail "--mpi --preload-experts should be a usage error"
echo "t_56_prefetch: ok"
