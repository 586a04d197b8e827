#!/usr/bin/env bash
# Job: conversations that survive, end to end through bin/k3 (docs/FORMATS.md "State files",
# README "Keep a conversation").
#  1. round trip: run 5 tokens + --save-state, then --load-state + 7 more == one run of 12 (ids,
#     and the --dump-logits bytes of both halves concatenated), saving and loading under
#     different --workers 0/2, --threads 1/2, --simd scalar/auto, --mem-gb at the floor vs
#     --preset max; on m13 and m14b12; ids appended with --ids after --gen 0 == one run;
#  2. --checkpoint + SIGKILL of the coordinator mid-run (self-inflicted after the 2nd checkpoint,
#     K3_TEST_KILL_AFTER_CHECKPOINT, and an external kill -9), then --resume: the whole run's ids
#     (and text, for a seeded --prompt run) equal the uninterrupted run's;
#  3. --chat: /save after turn 1, a new process with --load-state plays turns 2-3: the replies
#     equal one uninterrupted 3-turn chat (seeded sampling);
#  4. refusals, exit 2 with the reason: another model, another tokenizer (tiktoken.model,
#     tokenizer_config.json), a future version, truncated, a flipped bit in every section (named),
#     history + --gen beyond --max-context, a chat state resumed as a run;
#  5. atomic write: a failed save (K3_STATE_FAULT=fail:N) exits 1 and a crash mid-save
#     (crash:N) leaves the previous file byte-identical;
#  6. --state-dir: a prompt that extends a stored one starts from the snapshot (named on stderr)
#     with the ids and logits of a cold run; a corrupt snapshot is refused, removed, and the run
#     is still exact.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
TOOL=tests/state_file_tool.py
if [ -z "${K3_TEST_TMP:-}" ]; then K3_TEST_TMP=$(mktemp -d /tmp/k3state.XXXXXX); trap 'rm -rf "$K3_TEST_TMP"' EXIT; fi
T="$K3_TEST_TMP/t55"
rm -rf "$T" && mkdir -p "$T"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
ok() { echo "ok: $*"; }
. tests/lib.sh # jget
prompt_of() { $PY -c "import json; print(','.join(map(str, json.load(open('tests/expected/$1.json'))['prompt_ids'])))"; }
floor_gb() { $PY -c "import math; print('%.9f' % (math.ceil($1 / 2**30 * 1e9) / 1e9))"; }

# ---- 1. round trips
for name in m13 m14b12; do
  M=tests/models/$name
  P=$(prompt_of $name)
  "$K3" $M --ids "$P" --gen 12 --workers 0 --preset max --dump-logits "$T/u.f32" > "$T/u.ids" 2>/dev/null || fail "$name: uninterrupted run"
  if [ $name = m13 ]; then
    combos=("--workers 0 --threads 1 --simd scalar|--workers 2 --threads 2 --simd auto"
            "--workers 2 --threads 2|--workers 0 --threads 1 --simd scalar"
            "--workers 2 FLOOR|--workers 0 --preset max"
            "--workers 0 --preset max|--workers 2 FLOOR")
  else
    combos=("--workers 2 FLOOR --simd scalar|--workers 0 --preset max --threads 1")
  fi
  for c in "${combos[@]}"; do
    a=${c%%|*} b=${c##*|}
    for side in a b; do
      opts=${!side}
      if [[ $opts == *FLOOR* ]]; then
        w=$(echo "$opts" | sed 's/.*--workers \([0-9]*\).*/\1/')
        if [ $side = a ]; then "$K3" $M --ids "$P" --gen 5 --workers $w --json "$T/p.json" >/dev/null 2>&1
        else "$K3" $M --load-state "$T/s.k3state" --gen 7 --workers $w --json "$T/p.json" >/dev/null 2>&1; fi
        opts=${opts/FLOOR/--mem-gb $(floor_gb "$(jget "$T/p.json" memory.floor_bytes)")}
      fi
      eval "opts_$side=\"\$opts\""
    done
    rm -f "$T/s.k3state"
    "$K3" $M --ids "$P" --gen 5 $opts_a --save-state "$T/s.k3state" --dump-logits "$T/s1.f32" > "$T/s1.ids" 2>"$T/s1.err" \
      || { cat "$T/s1.err"; fail "$name [$opts_a]: save run"; }
    "$K3" $M --load-state "$T/s.k3state" --gen 7 $opts_b --dump-logits "$T/s2.f32" --json "$T/s2.json" > "$T/s2.ids" 2>"$T/s2.err" \
      || { cat "$T/s2.err"; fail "$name [$opts_b]: load run"; }
    [ "$(cat "$T/s1.ids" "$T/s2.ids" | tr '\n' ' ' | sed 's/ $//')" = "$(cat "$T/u.ids")" ] \
      || fail "$name: save [$opts_a] + load [$opts_b] ids $(cat "$T/s1.ids" "$T/s2.ids" | tr '\n' ' ') != $(cat "$T/u.ids")"
    cat "$T/s1.f32" "$T/s2.f32" | cmp -s - "$T/u.f32" || fail "$name: save [$opts_a] + load [$opts_b]: logits differ"
    [ "$(jget "$T/s2.json" state_loaded_ids)" = "$(( $(echo "$P" | tr ',' '\n' | wc -l) + 5 ))" ] || fail "$name: state_loaded_ids"
    ok "$name: save [$opts_a] + load [$opts_b] == uninterrupted (ids, logits)"
  done
  # appended ids after --gen 0
  Q=7,8,9,10
  "$K3" $M --ids "$P,$Q" --gen 6 --workers 0 --dump-logits "$T/u2.f32" > "$T/u2.ids" 2>/dev/null
  "$K3" $M --ids "$P" --gen 0 --workers 0 --save-state "$T/g0.k3state" > /dev/null 2>&1 || fail "$name: --gen 0 save"
  "$K3" $M --load-state "$T/g0.k3state" --ids "$Q" --gen 6 --workers 2 --dump-logits "$T/a2.f32" > "$T/a2.ids" 2>/dev/null \
    || fail "$name: load + appended ids"
  cmp -s "$T/u2.ids" "$T/a2.ids" && cmp -s "$T/u2.f32" "$T/a2.f32" && ok "$name: --gen 0 state + --ids appended == one run" \
    || fail "$name: appended ids differ"
  "$K3" $M --load-state "$T/g0.k3state" --gen 3 --workers 0 > /dev/null 2>"$T/np.err"; rc=$?
  [ $rc = 2 ] && grep -q "no pending id" "$T/np.err" || fail "$name: a state with nothing pending and no new ids: exit $rc"
done

# ---- 2. kill -9 and --resume
M=tests/models/m13
P=$(prompt_of m13)
"$K3" $M --ids "$P" --gen 14 --workers 0 > "$T/k.u" 2>/dev/null
rm -f "$T/c.k3state"
( K3_TEST_KILL_AFTER_CHECKPOINT=2 "$K3" $M --ids "$P" --gen 14 --workers 2 --checkpoint "$T/c.k3state" --checkpoint-every 3 \
  > /dev/null 2>&1; exit $? ) 2>/dev/null; rc=$?
[ $rc = 137 ] || fail "self-kill after the 2nd checkpoint: exit $rc, expected 137 (SIGKILL)"
[ "$($PY $TOOL ids "$T/c.k3state" | awk '{print $NF}')" = "pos=$(( $(echo "$P" | tr ',' '\n' | wc -l) + 5 ))" ] \
  || fail "the checkpoint after 6 tokens should have 5 of them fed"
"$K3" $M --resume "$T/c.k3state" --workers 0 --json "$T/r.json" > "$T/k.r" 2>"$T/r.err" || { cat "$T/r.err"; fail "--resume"; }
cmp -s "$T/k.u" "$T/k.r" && ok "--resume after SIGKILL == uninterrupted ($(cat "$T/k.r"))" || fail "--resume ids $(cat "$T/k.r") != $(cat "$T/k.u")"
[ "$(jget "$T/r.json" generated_ids | tr -d '[] ')" = "$(tr ' ' ',' < "$T/k.u")" ] || fail "--resume --json generated_ids is not the whole run"
"$K3" $M --resume "$T/c.k3state" --workers 0 > "$T/k.r2" 2>/dev/null
cmp -s "$T/k.u" "$T/k.r2" && ok "--resume of the finished run reports it whole" || fail "--resume of a finished run"
# seeded text run
S="--temperature 0.8 --top-k 40 --seed 11"
"$K3" $M --prompt "The expert servers" --gen 16 $S --workers 0 > "$T/t.u" 2>/dev/null
( K3_TEST_KILL_AFTER_CHECKPOINT=1 "$K3" $M --prompt "The expert servers" --gen 16 $S --workers 0 --checkpoint "$T/ct.k3state" \
  --checkpoint-every 4 > /dev/null 2>&1; exit $? ) 2>/dev/null
"$K3" $M --resume "$T/ct.k3state" --workers 2 > "$T/t.r" 2>/dev/null || fail "--resume (text)"
cmp -s "$T/t.u" "$T/t.r" && ok "--resume of a seeded --prompt run prints the uninterrupted text" || fail "--resume text differs"
# an external kill -9 while it runs
"$K3" $M --ids "$P" --gen 300 --workers 0 --threads 1 > "$T/x.u" 2>/dev/null
rm -f "$T/x.k3state"
"$K3" $M --ids "$P" --gen 300 --workers 0 --threads 1 --checkpoint "$T/x.k3state" --checkpoint-every 2 > /dev/null 2>&1 &
pid=$!
for _ in $(seq 1 400); do [ -f "$T/x.k3state" ] && break; sleep 0.02; done
sleep 0.3
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
done_ids=$($PY $TOOL ids "$T/x.k3state" | wc -w)
"$K3" $M --resume "$T/x.k3state" --workers 2 > "$T/x.r" 2>/dev/null || fail "--resume after kill -9"
cmp -s "$T/x.u" "$T/x.r" && ok "kill -9 (checkpoint had $((done_ids - 1)) ids) + --resume == uninterrupted" || fail "kill -9 + --resume differs"

# ---- 3. chat
C="--chat --max-tokens 6 --workers 0 --temperature 0.9 --seed 3"
printf 'Hello\nHow are you\nTell me more\n' | "$K3" $M $C > "$T/chA" 2>/dev/null
printf 'Hello\n/save %s\n' "$T/ch.k3state" | "$K3" $M $C > "$T/chB1" 2>"$T/chB1.err"
printf 'How are you\n/load %s\nTell me more\n' "$T/ch2.k3state" | "$K3" $M $C --workers 2 --load-state "$T/ch.k3state" \
  > "$T/chB2" 2>"$T/chB2.err" || fail "chat --load-state"
# /load of a missing file is reported and the conversation goes on
grep -q "cannot open the state file" "$T/chB2.err" || fail "chat /load of a missing file not reported"
head -n 2 "$T/chA" | tail -n 1 > "$T/chA2"
sed -n 3p "$T/chA" > "$T/chA3"
[ "$(cat "$T/chB1")" = "$(head -n 1 "$T/chA")" ] && [ "$(sed -n 1p "$T/chB2")" = "$(cat "$T/chA2")" ] \
  && [ "$(sed -n 2p "$T/chB2")" = "$(cat "$T/chA3")" ] && ok "chat: /save + --load-state == one conversation" \
  || { cat -v "$T/chA" "$T/chB1" "$T/chB2"; fail "chat replies differ after /save and --load-state"; }

# ---- 4. refusals
"$K3" $M --ids "$P" --gen 3 --workers 0 --save-state "$T/ok.k3state" > /dev/null 2>&1
"$K3" tests/models/m14b12 --ids 1,2,3 --gen 3 --workers 0 --save-state "$T/other.k3state" > /dev/null 2>&1
refuse() { # name, expected text, args...
  local what=$1 want=$2; shift 2
  "$K3" "$@" > /dev/null 2>"$T/ref.err"; local rc=$?
  if [ $rc = 2 ] && grep -q -- "$want" "$T/ref.err"; then ok "refused: $what"
  else fail "$what: exit $rc, wanted 2 with '$want': $(tail -n 1 "$T/ref.err")"; fi
}
refuse "another model" "another model: its config.json differs" $M --load-state "$T/other.k3state" --gen 2 --workers 0
mk_copy() { rm -rf "$T/$1" && mkdir "$T/$1" && for f in $M/*; do ln -s "$PWD/$f" "$T/$1/"; done; rm "$T/$1/$2" && cp "$M/$2" "$T/$1/$2"; }
mk_copy tokm tiktoken.model; printf 'ZZZ= 99999\n' >> "$T/tokm/tiktoken.model"
refuse "another tokenizer (tiktoken.model)" "another tokenizer: tiktoken.model differs" "$T/tokm" --load-state "$T/ok.k3state" --ids 5 --gen 2 --workers 0
mk_copy tokc tokenizer_config.json; printf ' ' >> "$T/tokc/tokenizer_config.json"
refuse "another tokenizer (tokenizer_config.json)" "tokenizer_config.json differs" "$T/tokc" --load-state "$T/ok.k3state" --ids 5 --gen 2 --workers 0
$PY $TOOL version "$T/ok.k3state" "$T/v.k3state" 2
refuse "a future version" "written by a newer k3 (state format version 2" $M --load-state "$T/v.k3state" --gen 2 --workers 0
size=$(stat -c %s "$T/ok.k3state")
for cut in 10 100 $((size / 2)) $((size - 1)); do
  head -c $cut "$T/ok.k3state" > "$T/tr.k3state"
  refuse "truncated at $cut of $size" "truncated" $M --load-state "$T/tr.k3state" --gen 2 --workers 0
done
nsec=$($PY $TOOL sections "$T/ok.k3state" | wc -l)
for k in $(seq 0 $((nsec - 1))); do
  sec=$($PY $TOOL flip "$T/ok.k3state" "$T/fl.k3state" $k)
  refuse "a bit flip in section '$sec'" "section '$sec' fails its checksum" $M --load-state "$T/fl.k3state" --gen 2 --workers 0
done
refuse "history + --gen beyond --max-context" "exceeds --max-context 30" $M --load-state "$T/ok.k3state" --gen 20 --max-context 30 --workers 0
refuse "a history alone beyond --max-context" "exceeds --max-context 5" $M --load-state "$T/ok.k3state" --gen 1 --max-context 5 --workers 0
refuse "a chat state resumed as a run" "not a run checkpoint" $M --resume "$T/ch.k3state" --workers 0
refuse "--resume with a prompt" "--resume continues" $M --resume "$T/ok.k3state" --ids 1
printf 'Hi\n' | "$K3" $M --chat --workers 0 --load-state "$T/other.k3state" > /dev/null 2>"$T/ref.err"; rc=$?
[ $rc = 2 ] && grep -q "another model" "$T/ref.err" && ok "refused: chat --load-state of another model's state" || fail "chat --load-state other model: exit $rc"

# ---- 5. atomic writes
cp "$T/ok.k3state" "$T/keep.k3state"
K3_STATE_FAULT=fail:3000 "$K3" $M --ids "$P" --gen 4 --workers 0 --save-state "$T/keep.k3state" > /dev/null 2>"$T/af.err"; rc=$?
[ $rc = 1 ] && grep -q "write failed" "$T/af.err" || fail "a failed save: exit $rc"
cmp -s "$T/ok.k3state" "$T/keep.k3state" && [ ! -e "$T/keep.k3state.k3tmp" ] && ok "a failed save leaves the previous file intact" \
  || fail "a failed save changed the previous file"
K3_STATE_FAULT=crash:3000 "$K3" $M --ids "$P" --gen 4 --workers 0 --save-state "$T/keep.k3state" > /dev/null 2>&1; rc=$?
[ $rc = 3 ] || fail "crash mid-save: exit $rc, expected 3"
cmp -s "$T/ok.k3state" "$T/keep.k3state" && ok "a crash mid-save leaves the previous file intact" || fail "a crash mid-save changed the previous file"
"$K3" $M --load-state "$T/keep.k3state" --gen 1 --workers 0 > /dev/null 2>&1 || fail "the kept file no longer loads"

# ---- 6. prefix snapshots on disk
D="$T/snaps"
"$K3" $M --ids "$P,7,8,9" --gen 5 --workers 0 --dump-logits "$T/cold.f32" > "$T/cold.ids" 2>/dev/null
"$K3" $M --ids "$P" --gen 3 --workers 0 --state-dir "$D" > /dev/null 2>&1 || fail "--state-dir first run"
[ "$(ls "$D" | grep -c '\.k3snap$')" -ge 2 ] || fail "--state-dir: snapshots not written"
"$K3" $M --ids "$P,7,8,9" --gen 5 --workers 2 --state-dir "$D" --dump-logits "$T/warm.f32" > "$T/warm.ids" 2>"$T/warm.err" \
  || fail "--state-dir second run"
grep -q "started from a snapshot" "$T/warm.err" || fail "the second prompt did not start from a snapshot"
cmp -s "$T/cold.ids" "$T/warm.ids" && cmp -s "$T/cold.f32" "$T/warm.f32" && ok "--state-dir: from a snapshot == cold (ids, logits)" \
  || fail "--state-dir: a snapshot changed the result"
for f in "$D"/*.k3snap; do $PY - "$f" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 1; open(p, 'wb').write(b)
EOF
done
"$K3" $M --ids "$P,7,8,9" --gen 5 --workers 0 --state-dir "$D" --dump-logits "$T/warm2.f32" > "$T/warm2.ids" 2>"$T/warm2.err"
grep -q "snapshot refused and removed" "$T/warm2.err" || fail "a corrupt snapshot was not refused"
cmp -s "$T/cold.ids" "$T/warm2.ids" && cmp -s "$T/cold.f32" "$T/warm2.f32" && ok "--state-dir: corrupt snapshots refused, result exact" \
  || fail "--state-dir: corrupt snapshot changed the result"

[ $fails -eq 0 ] && echo "t_55_state: all passed" || echo "t_55_state: $fails failure(s)"
[ $fails -eq 0 ]
