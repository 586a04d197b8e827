#!/usr/bin/env bash
# t_65_speculation.sh - exact speculative decoding: with every draft source (ids, ngram, a
# draft model: m13 for itself, m14b12 for m13), at 100 %,
# partial and 0 % acceptance, greedy and seeded sampling, in-process and with expert
# servers, at the memory floor, with both rollbacks (per-position states, snapshot +
# re-feed), the ids AND the logits rows are those of plain decoding; the speculation
# buffers are a plan line (--plan-only == a loaded run; auto falls back to re-feed when
# the budget does not hold the states; a draft model is a plan line too, and one with another
# tokenizer is refused);
# stop ids and --gen are respected inside an accepted run; a server killed during a
# verification pass changes nothing.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
T="${K3_TEST_TMP:-/tmp}/t65.$$"
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
M=tests/models/m13
P="5,17,300,42,7,99,256,1,5,17,300,42"
run() { "$K3" $M --ids $P --gen 14 "$@" 2>"$T/err" || { cat "$T/err"; return 1; }; }

for mode in "--workers 0" "--workers 2" "--workers 0 --mem-gb 0.0192 --threads 2" "--workers 0 --temperature 0.8 --top-p 0.9 --seed 7"; do
  run $mode --dump-logits "$T/base.f32" > "$T/base.ids" || bad "plain run ($mode)"
  tr ' ' '\n' < "$T/base.ids" > "$T/good.ids"
  # partial: the right ids with every third one wrong
  awk '{ if (NR % 3 == 0) print ($1 + 1) % 600; else print $1 }' "$T/good.ids" > "$T/part.ids"
  seq 600 620 > "$T/wrong.ids"
  for d in "ids --draft-ids $T/good.ids" "ids --draft-ids $T/part.ids" "ids --draft-ids $T/wrong.ids" "ngram" \
           "model --draft-model tests/models/m13" "model --draft-model tests/models/m14b12"; do
    # a draft model is a plan line: the 0.0192 GiB budget holds the target alone (a budget with one below)
    case "$mode $d" in *mem-gb*model*) continue;; esac
    # rollback from per-position states (the default) at k 1, 4, 9; snapshot + re-feed at k 4
    for kr in "1 states" "4 states" "9 states" "4 refeed"; do
      set -- $kr; k=$1; rb=$2
      run $mode --draft $d --draft-max $k --draft-rollback $rb --dump-logits "$T/s.f32" --json "$T/s.json" > "$T/s.ids" || { bad "run ($mode, --draft $d, k $k, $rb)"; continue; }
      cmp -s "$T/s.ids" "$T/base.ids" || bad "ids differ ($mode, --draft $d, k $k, $rb)"
      cmp -s "$T/s.f32" "$T/base.f32" || bad "logits differ ($mode, --draft $d, k $k, $rb)"
    done
  done
  # 100 % acceptance really skips passes; 0 % accepts nothing
  run $mode --draft ids --draft-ids "$T/good.ids" --draft-max 4 --json "$T/g.json" > /dev/null
  run $mode --draft ids --draft-ids "$T/wrong.ids" --draft-max 4 --json "$T/w.json" > /dev/null
  # partial acceptance: per-position states restore without a pass; re-feed makes one
  run $mode --draft ids --draft-ids "$T/part.ids" --draft-max 4 --json "$T/ps.json" > /dev/null
  run $mode --draft ids --draft-ids "$T/part.ids" --draft-max 4 --draft-rollback refeed --json "$T/pr.json" > /dev/null
  "${PYTHON:-/usr/bin/python3}" - "$T/g.json" "$T/w.json" "$T/ps.json" "$T/pr.json" <<'PY' || bad "acceptance counters ($mode)"
import json, sys
g, w, ps, pr = (json.load(open(a))["speculation"] for a in sys.argv[1:])
assert g["accepted"] == g["proposed"] > 0 and g["passes_per_token"] < 0.5, g
assert w["accepted"] == 0 and w["proposed"] > 0, w
assert ps["rollback"] == "states" and ps["refeeds"] == 0 and ps["restores"] > 0, ps
assert ps["decode_passes"] < pr["decode_passes"], (ps, pr)
assert pr["rollback"] == "refeed" and pr["refeeds"] > 0 and pr["restores"] == 0, pr
PY
done

# --draft-model: m13 drafting for itself accepts everything greedy and part seeded; m14b12 (same
# tokenizer, other weights) proposes and is refused; at a budget that streams the target with
# the draft resident; the draft's passes and bytes are in --json
S="--temperature 0.8 --top-p 0.9 --seed 7"
run --workers 0 --draft-model tests/models/m13 --json "$T/dm.json" > /dev/null || bad "--draft-model m13"
run --workers 0 $S --draft-model tests/models/m13 --json "$T/dms.json" > /dev/null || bad "--draft-model m13 seeded"
run --workers 0 --draft-model tests/models/m14b12 --json "$T/dmo.json" > /dev/null || bad "--draft-model m14b12"
"${PYTHON:-/usr/bin/python3}" - "$T/dm.json" "$T/dms.json" "$T/dmo.json" <<'PY' || bad "--draft-model counters"
import json, sys
a, s, o = (json.load(open(x))["speculation"] for x in sys.argv[1:])
assert a["draft"] == "model" and a["accepted"] == a["proposed"] > 0 and a["draft_passes"] > 0, a
assert 0 < s["accepted"] < s["proposed"], s
assert o["accepted"] < o["proposed"] and o["draft_passes"] > 0, o
for x in (a, s, o):
    assert x["bytes_per_token"] > x["trunk_bytes_per_token"], x
PY
run --workers 0 > "$T/b0.ids"
run --workers 0 --mem-gb 0.0257 --threads 2 --draft-model tests/models/m13 --dump-logits "$T/dmb.f32" > "$T/dmb.ids" 2> /dev/null || bad "--draft-model at a small budget"
cmp -s "$T/dmb.ids" "$T/b0.ids" || bad "--draft-model at a small budget: ids differ"
mkdir -p "$T/othertok"
for f in tests/models/m13/*; do ln -s "$PWD/$f" "$T/othertok/"; done
rm "$T/othertok/tokenizer_config.json"; { cat tests/models/m13/tokenizer_config.json; echo " "; } > "$T/othertok/tokenizer_config.json"
"$K3" $M --ids $P --gen 3 --draft-model "$T/othertok" 2> "$T/ot.err" > /dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "tokenizer_config.json differs" "$T/ot.err" || { cat "$T/ot.err"; bad "a draft model with another tokenizer must exit 2 naming the file (rc $rc)"; }
"$K3" $M --ids $P --gen 3 --draft ngram --draft-model tests/models/m13 2>/dev/null; [ $? -eq 2 ] || bad "--draft ngram with --draft-model must exit 2"
"$K3" $M --ids $P --gen 3 --draft model 2>/dev/null; [ $? -eq 2 ] || bad "--draft model without --draft-model must exit 2"

# --chat: the replies (two turns, a /reset, another turn) are those without speculation, greedy
# and seeded, with n-gram and a draft model, both rollbacks; the stats line counts acceptances
printf 'ab ab ab ab ab ab ab ab ab\nhello hello hello\n/reset\nab ab ab ab ab ab ab ab ab\n' > "$T/chat.in"
for s in "" "--temperature 0.8 --seed 3"; do
  "$K3" $M --chat --max-tokens 20 $s < "$T/chat.in" > "$T/chat0.out" 2>/dev/null || bad "chat ($s)"
  for d in "--draft ngram" "--draft-model tests/models/m13" "--draft-model tests/models/m13 --draft-rollback refeed" "--draft-model tests/models/m14b12"; do
    "$K3" $M --chat --max-tokens 20 $s $d < "$T/chat.in" > "$T/chat1.out" 2> "$T/chat1.err" || bad "chat ($s $d)"
    cmp -s "$T/chat0.out" "$T/chat1.out" || bad "chat replies differ ($s $d)"
  done
done
"$K3" $M --chat --max-tokens 20 --draft-model tests/models/m13 < "$T/chat.in" 2>&1 > /dev/null | grep -q "speculation: [1-9][0-9]* of" \
  || bad "chat with a self-draft: no accepted proposal in the stats"

# --serve --draft ngram: greedy and seeded requests (3 at once over 2 slots) give the same
# completions, logprobs and finish reasons as a server without speculation
serve_run() { # NAME ARGS...: starts, sends the requests, stops; bodies in $T/NAME.*.json
  local name=$1; shift
  "$K3" $M --serve --port 0 --parallel 2 --max-context 256 "$@" > /dev/null 2> "$T/$name.err" &
  local pid=$! url=""
  for _ in $(seq 1 200); do url=$(sed -n 's/.*serving on \(http:[^ ]*\).*/\1/p' "$T/$name.err"); [ -n "$url" ] && break; sleep 0.1; done
  [ -n "$url" ] || { cat "$T/$name.err"; bad "$name: server did not start"; kill $pid; return; }
  for i in 1 2 3; do
    body='{"prompt":"ab ab ab ab ab ab ab ab ab","max_tokens":24,"logprobs":2'
    [ $i = 2 ] && body="$body"',"temperature":0.8,"seed":5'
    [ $i = 3 ] && body="$body"',"temperature":0'
    curl -s "$url/v1/completions" -H 'Content-Type: application/json' -d "$body}" > "$T/$name.$i.json" &
  done
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null
  curl -s "$url/metrics" > "$T/$name.metrics"
  kill -TERM $pid; wait $pid
}
serve_run plain
serve_run spec --draft ngram --draft-max 4
for i in 1 2 3; do
  "${PYTHON:-/usr/bin/python3}" - "$T/plain.$i.json" "$T/spec.$i.json" <<'PY' || bad "--serve --draft ngram: request $i differs"
import json, sys
a, b = (json.load(open(x))["choices"][0] for x in sys.argv[1:])
assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"] and a.get("logprobs") == b.get("logprobs"), (a, b)
PY
done
grep -q "^k3_spec_passes_total [1-9]" "$T/spec.metrics" || bad "--serve --draft ngram: no verification pass in /metrics"
"$K3" $M --serve --port 0 --draft ids --draft-ids "$T/good.ids" 2>/dev/null; [ $? -eq 2 ] || bad "--serve --draft ids must exit 2"

# a stop id inside an accepted run ends it there; --gen bounds it
run --workers 0 > "$T/base.ids"
tr ' ' '\n' < "$T/base.ids" > "$T/good.ids"
stop=$(awk '{print $6}' "$T/base.ids")
want=$(awk -v s="$stop" '{ out=""; for (i = 1; i <= NF; i++) { out = out (i > 1 ? " " : "") $i; if ($i == s) break } print out }' "$T/base.ids")
got=$(run --workers 0 --stop-id "$stop" --draft ids --draft-ids "$T/good.ids" --draft-max 8)
[ "$got" = "$want" ] || bad "stop id inside an accepted run: got '$got' want '$want'"
got=$("$K3" $M --ids $P --gen 5 --workers 0 --draft ids --draft-ids "$T/good.ids" --draft-max 8 2>/dev/null)
[ "$got" = "$(awk '{print $1, $2, $3, $4, $5}' "$T/base.ids")" ] || bad "--gen 5 with 8 proposals: got '$got'"

# an expert server SIGKILLed during verification passes: same ids
K3_EXPERTD="$(dirname "$K3")/k3-expertd-faults" K3_FAULT=crash:4:1 "$K3" $M --ids $P --gen 14 --workers 2 --draft ids --draft-ids "$T/good.ids" --draft-max 4 \
  > "$T/k.ids" 2> "$T/k.err" || bad "run with a crashing server"
grep -q "killed by signal 9" "$T/k.err" || bad "the server crash was not injected"
cmp -s "$T/k.ids" "$T/base.ids" || bad "ids differ after a server crash during verification"

# the speculation buffers are in the plan: --plan-only and a loaded run agree; --draft-rollback
# auto takes per-position states when the budget holds them, else one copy and re-feed
plan_of() { awk '/^memory plan/{p=1} p{print} p&&/^  total/{exit}' "$1"; }
for a in "--draft ngram --draft-max 4 --preset max" "--draft ngram --draft-max 6 --draft-rollback refeed --mem-gb 1" "--draft ngram --mem-gb 0.05" \
         "--draft-model tests/models/m14b12 --mem-gb 1"; do
  "$K3" $M --plan-only --max-context 26 $a > "$T/po.out" 2>&1 || bad "--plan-only $a"
  "$K3" $M --ids $P --gen 14 --max-context 26 $a > /dev/null 2> "$T/pr.err" || bad "run $a"
  plan_of "$T/po.out" > "$T/pa"; plan_of "$T/pr.err" > "$T/pb"
  grep -q "^  speculation" "$T/pa" || bad "no speculation line in the plan ($a)"
  case "$a" in *draft-model*) grep -q "^  draft model" "$T/pa" || bad "no draft model line in the plan ($a)";; esac
  diff "$T/pa" "$T/pb" > /dev/null || { diff "$T/pa" "$T/pb"; bad "--plan-only and the run print different plans ($a)"; }
done
floor_of() { "$K3" $M --plan-only --max-context 26 --mem-gb 0.0001 "$@" 2>&1 | sed -n 's/.*floor of [0-9.]* GiB (\([0-9]*\) bytes).*/\1/p'; }
fs=$(floor_of --draft ngram --draft-rollback states); fr=$(floor_of --draft ngram --draft-rollback refeed)
if [ -n "$fs" ] && [ -n "$fr" ] && [ "$fs" -gt "$fr" ]; then
  gb=$("${PYTHON:-/usr/bin/python3}" -c "print('%.9f' % (($fr + $fs) / 2 / 2**30))")
  "$K3" $M --plan-only --max-context 26 --draft ngram --mem-gb "$gb" 2>&1 | grep -q "re-feeds the accepted" || bad "auto: no fallback to re-feed between the floors"
  "$K3" $M --plan-only --max-context 26 --draft ngram --draft-rollback states --mem-gb "$gb" > /dev/null 2>&1 && bad "states below its floor must be refused"
  "$K3" $M --ids $P --gen 14 --max-context 26 --draft ngram --mem-gb "$gb" --json "$T/fb.json" > "$T/fb.ids" 2>/dev/null || bad "auto run between the floors"
  grep -q '"rollback": *"refeed"' "$T/fb.json" || bad "auto between the floors: not re-feed"
else
  bad "no floors for states ($fs) and refeed ($fr)"
fi

# refusals
"$K3" $M --ids $P --draft ngram --draft-rollback sometimes 2>/dev/null; [ $? -eq 2 ] || bad "--draft-rollback sometimes must exit 2"
"$K3" $M --ids $P --draft ids 2>/dev/null; [ $? -eq 2 ] || bad "--draft ids without --draft-ids must exit 2"
"$K3" $M --ids $P --draft bogus 2>/dev/null; [ $? -eq 2 ] || bad "--draft bogus must exit 2"
echo "1 x 2" > "$T/junk.ids"
"$K3" $M --ids $P --draft ids --draft-ids "$T/junk.ids" 2>/dev/null; [ $? -eq 2 ] || bad "a junk --draft-ids file must exit 2"
[ $fail -eq 0 ] && echo "t_65_speculation: ok"
exit $fail
