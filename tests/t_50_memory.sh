#!/usr/bin/env bash
# Memory dial (issue 4): on both committed models, identical ids and bit-identical
# logits at the floor and at larger budgets (trunk streamed, partly pinned, all
# pinned), in-process and with expert servers, incremental and full recompute;
# measured peak RSS (all processes) within the budget; a budget below the floor
# refused naming the floor; prefill by expert (one chunk) equal to token by token;
# --plan-only from a config.json alone, including the real K3 config.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/memory"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
. tests/lib.sh # jget

for name in m13 m14b12; do
  M=tests/models/$name
  ids=$($PY -c "import json; print(','.join(map(str, json.load(open('tests/expected/$name.json'))['prompt_ids'])))")
  for w in 0 2; do
    "$K3" "$M" --ids "$ids" --gen 1 --workers $w --json "$T/p.json" > /dev/null 2>&1 || fail "$name: planning run"
    floor=$(jget "$T/p.json" memory.floor_bytes)
    walk=$(jget "$T/p.json" memory.trunk_walk_units)
    "$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers $w --preset max --dump-logits "$T/ref.f32" > "$T/ref.out" 2>/dev/null \
      || fail "$name: --preset max run"
    seen_stream=0 seen_partial=0
    for extra in 0 150000 600000 100000000; do
      gb=$($PY -c "import math; print('%.9f' % (math.ceil(($floor + $extra) / 2**30 * 1e9) / 1e9))")
      modes=""; [ "$extra" = 0 ] && modes="--full-recompute"
      for mode in "" $modes; do
        "$K3" "$M" --ids "$ids" --gen 8 --teacher-force --workers $w --mem-gb $gb $mode --dump-logits "$T/b.f32" \
          --json "$T/b.json" > "$T/b.out" 2> "$T/b.err" || { cat "$T/b.err"; fail "$name workers=$w --mem-gb $gb $mode: run failed"; }
        cmp -s "$T/ref.f32" "$T/b.f32" || fail "$name workers=$w --mem-gb $gb $mode: logits differ from --preset max"
        cmp -s "$T/ref.out" "$T/b.out" || fail "$name workers=$w --mem-gb $gb $mode: ids differ"
        rss=$(jget "$T/b.json" memory.peak_rss_total_bytes)
        budget=$(jget "$T/b.json" memory.budget_bytes)
        [ "$rss" -le "$budget" ] || fail "$name workers=$w: measured peak RSS $rss exceeds the budget $budget"
      done
      pinned=$(jget "$T/b.json" memory.trunk_pinned_units)
      slots=$(jget "$T/b.json" memory.trunk_slots)
      [ "$extra" = 0 ] && { [ "$pinned" = 0 ] && [ "$slots" -ge 2 ] || fail "$name: the floor should stream everything ($pinned pinned, $slots slots)"; }
      [ "$slots" -ge 2 ] && seen_stream=1
      [ "$pinned" -gt 0 ] && [ "$pinned" -lt "$walk" ] && seen_partial=1
      echo "$name workers=$w budget=$gb GiB: $pinned/$walk units pinned, $slots slots, peak RSS $rss: identical"
    done
    [ $seen_stream = 1 ] && [ $seen_partial = 1 ] || fail "$name: the ladder did not cover streaming and a partly pinned trunk"
  done
  # below the floor: refused, the floor named, exit 2
  "$K3" "$M" --ids "$ids" --gen 2 --workers 0 --mem-gb 0.001 > /dev/null 2> "$T/f.err"
  rc=$?
  [ $rc = 2 ] || fail "$name: a budget below the floor exited $rc, expected 2"
  grep -q "below this model's floor of" "$T/f.err" || { cat "$T/f.err"; fail "$name: refusal does not name the floor"; }
  # prefill by expert: one 64-token chunk (each expert read once per layer) == token by token
  "$K3" "$M" --ids "$ids" --gen 6 --teacher-force --workers 0 --chunk 64 --dump-logits "$T/c64.f32" > /dev/null 2>&1
  "$K3" "$M" --ids "$ids" --gen 6 --teacher-force --workers 0 --chunk 1 --dump-logits "$T/c1.f32" > /dev/null 2>&1
  cmp -s "$T/c64.f32" "$T/c1.f32" || fail "$name: prefill by expert differs from token by token"
  "$K3" "$M" --ids "$ids" --gen 6 --teacher-force --workers 2 --chunk 1 --dump-logits "$T/c1w.f32" > /dev/null 2>&1
  cmp -s "$T/c64.f32" "$T/c1w.f32" || fail "$name: token by token through 2 servers differs"
  echo "$name: below-floor refused; prefill by expert == token by token"
done

# --plan-only needs nothing but config.json (the real K3 config is in configs/)
"$K3" configs/kimi-k3 --plan-only --workers 1 --mem-gb 8 > "$T/plan.txt" 2>&1 || { cat "$T/plan.txt"; fail "--plan-only on configs/kimi-k3"; }
grep -q "floor" "$T/plan.txt" && grep -q "93 layers, 896 experts" "$T/plan.txt" || fail "--plan-only output"
"$K3" configs/kimi-k3 --plan-only --mem-gb 0.5 > /dev/null 2> "$T/plan.err"
[ $? = 2 ] && grep -q "floor" "$T/plan.err" || fail "--plan-only below the floor not refused"
"$K3" --list-presets | grep -q "^laptop" || fail "--list-presets"
"$K3" tests/models/m13 --ids 1,2 --preset nosuch > /dev/null 2>&1; [ $? = 2 ] || fail "unknown preset not refused"
echo ok
