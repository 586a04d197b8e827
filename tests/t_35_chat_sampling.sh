#!/usr/bin/env bash
# Job: end-to-end checks of seeded sampling and the --chat REPL through bin/k3 (docs/CHAT.md).
#  1. seeded sampling (temperature, top-k, top-p, min-p) gives the same ids with --threads 1/2,
#     --workers 0/1/2, two --mem-gb budgets (one at the floor: trunk streamed, one expert cached),
#     --chunk 1 and --full-recompute; it differs from greedy and between seeds; --temperature 0 is
#     greedy; the same holds for a --prompt text;
#  2. a piped chat of 2 turns, /reset and the first turn again: exit 0, the output starts and ends
#     with the reply of a one-turn session (greedy and seeded), 3 turns in the stats, the same
#     transcript with 0 and 2 expert servers, and the first reply equals plain greedy generation
#     from the rendered K3 prompt ids (bin/k3 --tok --encode of the template text);
#  3. --stop-id reached ends a turn: the reply is exactly the text before that id;
#  4. refusals (exit 2): absurd sampling settings, a template the tokenizer cannot render, a
#     stop id outside the vocabulary, --chat with a prompt, bad adjustments and adjustments with
#     state files or --serve;
#  5. the adjustments (--logit-bias, --presence/--frequency/--repetition-penalty): a +100 bias
#     takes every pick, penalties change the ids and give the same ids with --draft ngram,
#     --threads 1 and 1-2 expert servers; a chat with a penalty runs two turns and refuses /save.
# Skips (exit 0, prints SKIP) while bin/k3 --help does not mention --chat (flags not wired yet).
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
M=tests/models/m13
if ! "$K3" --help 2>&1 | grep -q -- '--chat'; then
  echo "SKIP: $K3 --help does not mention --chat yet (main.c does not wire the chat/sampling flags)"
  exit 0
fi
if [ -z "${K3_TEST_TMP:-}" ]; then K3_TEST_TMP=$(mktemp -d /tmp/k3chat.XXXXXX); trap 'rm -rf "$K3_TEST_TMP"' EXIT; fi
T="$K3_TEST_TMP/t35"
rm -rf "$T" && mkdir -p "$T"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
ok() { echo "ok: $*"; }

# ---- 1. seeded sampling is a pure function of the logits
ids=1,2,3,4,5,6
S=(--temperature 0.9 --top-k 50 --top-p 0.95 --min-p 0.01 --seed 7)
run_ids() { "$K3" "$M" --ids "$ids" --gen 24 "$@" 2> "$T/err.txt" || { tail -3 "$T/err.txt"; echo "RUNFAIL"; }; }
floor=$("$K3" "$M" --plan-only --workers 0 --mem-gb 0.001 2>&1 | sed -n 's/.*(\([0-9]*\) bytes).*/\1/p' | head -1)
if [ -z "$floor" ]; then fail "cannot read the memory floor from --plan-only"; floor=100000000; fi
low=$("$PY" -c "print('%.6f' % (($floor + 4096) / 2**30))")
ref=$(run_ids "${S[@]}" --threads 1 --workers 0)
case "$ref" in *RUNFAIL*|"") fail "seeded run failed: $ref";; esac
for v in "--threads 2 --workers 0" "--threads 2 --workers 1" "--threads 2 --workers 2" \
         "--workers 0 --mem-gb $low" "--workers 0 --mem-gb 4" "--workers 0 --chunk 1" \
         "--workers 0 --full-recompute"; do
  # shellcheck disable=SC2086
  got=$(run_ids "${S[@]}" $v)
  if [ "$got" = "$ref" ]; then ok "seeded ids identical with $v"; else fail "seeded ids differ with $v: '$got' vs '$ref'"; fi
done
greedy=$(run_ids --workers 0)
zero=$(run_ids --workers 0 --temperature 0 --seed 99)
[ "$zero" = "$greedy" ] && ok "--temperature 0 is greedy" || fail "--temperature 0 '$zero' differs from greedy '$greedy'"
[ "$ref" != "$greedy" ] && ok "sampling differs from greedy" || fail "seeded sampling gave the greedy ids"
other=$(run_ids --workers 0 --temperature 0.9 --top-k 50 --top-p 0.95 --min-p 0.01 --seed 8)
[ "$other" != "$ref" ] && ok "seeds 7 and 8 differ" || fail "seeds 7 and 8 gave the same 24 ids"
k1=$(run_ids --workers 0 --temperature 1.3 --top-k 1 --seed 5)
[ "$k1" = "$greedy" ] && ok "--top-k 1 is greedy" || fail "--top-k 1 '$k1' differs from greedy"
p1=$("$K3" "$M" --prompt "Once upon a time" --gen 16 --temperature 0.8 --seed 3 --threads 1 --workers 0 2>/dev/null)
p2=$("$K3" "$M" --prompt "Once upon a time" --gen 16 --temperature 0.8 --seed 3 --threads 2 --workers 2 2>/dev/null)
[ -n "$p1" ] && [ "$p1" = "$p2" ] && ok "seeded --prompt text identical across threads/workers" \
  || fail "seeded --prompt text differs: '$p1' vs '$p2'"

# ---- 2. a piped chat (replies may contain newlines: compare whole outputs, not lines)
printf 'Hello there\nHow are you?\n/reset\nHello there\n/exit\nnot read\n' > "$T/in.txt"
printf 'Hello there\n' > "$T/in1.txt"
chat() { # $1 = input file, rest = flags; stdout -> out.txt, stderr -> log.txt
  local in=$1; shift
  "$K3" "$M" --chat --max-tokens 8 "$@" < "$in" > "$T/out.txt" 2> "$T/log.txt"
}
check_chat() { # $1 = label, $2 = the output of the first turn alone
  local n1 n
  n1=$(stat -c %s "$2"); n=$(stat -c %s "$T/out.txt")
  [ "$n1" -ge 2 ] || fail "$1: empty first reply"
  head -c "$n1" "$T/out.txt" | cmp -s - "$2" || fail "$1: the first reply differs from a one-turn session"
  tail -c "$n1" "$T/out.txt" | cmp -s - "$2" || fail "$1: the reply after /reset differs from the first one"
  [ "$n" -gt $((2 * n1)) ] || fail "$1: nothing printed for turn 2"
  [ "$(grep -c '\[turn ' "$T/log.txt")" -eq 3 ] || fail "$1: $(grep -c '\[turn ' "$T/log.txt") turns in the log, want 3"
  grep -q 'conversation reset' "$T/log.txt" || fail "$1: no reset in the log"
  ok "$1: 3 turns, /reset repeats the first reply"
}
chat "$T/in1.txt" --workers 0 || fail "one-turn chat exit status"
cp "$T/out.txt" "$T/greedy1.txt"
if chat "$T/in.txt" --workers 0; then check_chat "greedy chat" "$T/greedy1.txt"; else fail "greedy chat exit status"; tail -5 "$T/log.txt"; fi
SC=(--temperature 0.8 --top-p 0.9 --seed 11)
chat "$T/in1.txt" --workers 0 "${SC[@]}" || fail "one-turn seeded chat exit status"
cp "$T/out.txt" "$T/seeded1.txt"
if chat "$T/in.txt" --workers 0 "${SC[@]}"; then check_chat "seeded chat" "$T/seeded1.txt"; else fail "seeded chat exit status"; fi
cp "$T/out.txt" "$T/seeded0.txt"
if chat "$T/in.txt" --workers 2 --threads 2 "${SC[@]}"; then
  cmp -s "$T/out.txt" "$T/seeded0.txt" && ok "seeded chat identical with 2 expert servers" \
    || fail "seeded chat differs between --workers 0 and 2"
else fail "seeded chat with --workers 2 exit status"; fi

# the first reply == greedy generation from the rendered prompt ids
printf '%s' '<|open|>message role="user"<|sep|>Hello there<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>think<|sep|>' > "$T/prompt.txt"
pids=$("$K3" --tok "$M" --encode "$T/prompt.txt" | tr ' ' ',')
gen=$("$K3" "$M" --ids "$pids" --gen 8 --workers 0 2>/dev/null)
eos=$("$PY" -c "import json; d=json.load(open('$M/tokenizer_config.json'))['added_tokens_decoder']; print(' '.join(k for k,v in d.items() if v['content'] in ('[EOS]','<|end_of_msg|>')))")
# expected reply text: ids up to the first stop, decoded, ill-formed UTF-8 shown as U+FFFD
reply_of() { # $1 = space-separated ids, $2 = extra stop id (or empty)
  local cut
  cut=$("$PY" -c "
import sys
ids=sys.argv[1].split(); stops=set(sys.argv[2].split())
out=[]
for i in ids:
    if i in stops: break
    out.append(i)
print(' '.join(out))" "$1" "$eos $2")
  printf '%s' "$cut" > "$T/cut.txt"
  "$K3" --tok "$M" --decode "$T/cut.txt" | "$PY" -c "import sys; sys.stdout.write(sys.stdin.buffer.read().decode('utf-8','replace'))"
}
want=$(reply_of "$gen" "")
got=$(cat "$T/greedy1.txt")
[ "$got" = "$want" ] && ok "first chat reply == greedy generation from the rendered K3 prompt" \
  || fail "first chat reply '$got' differs from the --ids generation '$want'"

# ---- 3. a stop id ends the turn
set -- $gen
stop=""
if [ $# -ge 2 ]; then
  prev=" $1 "
  shift
  for id in "$@"; do
    case "$prev" in *" $id "*) prev="$prev$id "; continue;; esac
    stop=$id; break
  done
fi
if [ -n "$stop" ]; then
  want=$(reply_of "$gen" "$stop")
  printf 'Hello there\n' | "$K3" "$M" --chat --max-tokens 8 --workers 0 --stop-id "$stop" > "$T/out.txt" 2> "$T/log.txt"
  got=$(cat "$T/out.txt")
  if [ "$got" = "$want" ] && grep -q "ended by .*id $stop" "$T/log.txt"; then ok "--stop-id $stop ends the turn after '$want'"
  else fail "--stop-id $stop: reply '$got', want '$want'"; grep 'turn 1' "$T/log.txt"; fi
else
  echo "note: the greedy reply repeats one id; stop-id case not exercised"
fi

# ---- 4. refusals
refuse() { # $1 = expected word in the message, rest = args
  local word=$1; shift
  "$K3" "$M" "$@" < /dev/null > /dev/null 2> "$T/r.txt"
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$word" "$T/r.txt"; then ok "refused: $*"
  else fail "expected exit 2 mentioning '$word' for: $* (rc $rc: $(head -2 "$T/r.txt"))"; fi
}
refuse temperature --ids 1,2 --temperature -1
refuse temperature --ids 1,2 --temperature nan
refuse top-p --ids 1,2 --temperature 1 --top-p 0
refuse top-p --ids 1,2 --temperature 1 --top-p 1.5
refuse min-p --ids 1,2 --temperature 1 --min-p 2
refuse top-k --ids 1,2 --top-k -1
refuse seed --ids 1,2 --seed abc
refuse '<|im_user|>' --chat --template k2 --workers 0
refuse 764 --chat --stop-id 764 --workers 0
refuse chat --chat --ids 1,2
refuse presence_penalty --ids 1,2 --presence-penalty 3
refuse logit-bias --ids 1,2 --logit-bias 5=abc
refuse vocabulary --ids 1,2 --logit-bias 99999999=1 --workers 0
refuse 'state files' --ids 1,2 --frequency-penalty 1 --save-state "$T/s.k3s"
refuse 'state files' --ids 1,2 --logit-bias 5=1 --checkpoint "$T/c.k3s"
refuse 'request fields' --serve --repetition-penalty 1.2

# ---- 5. the adjustments (docs/CHAT.md "Adjustments"): a +100 bias takes every pick; negative
# penalties and a repetition penalty change the ids, and they are the same with --draft ngram,
# --threads 1 and --workers 2; a chat reply counts its own ids, /save is refused with them
got=$(run_ids --logit-bias 77=100 --workers 0 | tr ' ' '\n' | sort -u | tr '\n' ' ')
if [ "$got" = "77 " ]; then ok "--logit-bias 77=100: every id 77"; else fail "--logit-bias 77=100 gave '$got'"; fi
for pair in "|--frequency-penalty -2 --presence-penalty -1" "${S[*]}|--repetition-penalty 0.3 ${S[*]}"; do
  B=${pair%%|*} A=${pair#*|}
  # shellcheck disable=SC2086
  plain=$(run_ids $B --workers 0)
  # shellcheck disable=SC2086
  ref=$(run_ids $A --workers 0)
  case "$ref" in *RUNFAIL*|"") fail "$A: $ref";; esac
  [ "$ref" != "$plain" ] || fail "$A: the same ids as without"
  for v in "--draft ngram" "--threads 1" "--workers 2" "--draft ngram --workers 1"; do
    # shellcheck disable=SC2086
    got=$(run_ids $A $v)
    [ "$got" = "$ref" ] || fail "$A $v: $got vs $ref"
  done
  ok "$A: changes the ids; the same with --draft ngram, --threads 1, --workers 1/2"
done
printf 'hello\nhello again\n/save %s\n' "$T/chat.k3s" | "$K3" "$M" --chat --max-tokens 8 --workers 0 --frequency-penalty -1 \
  > "$T/out.txt" 2> "$T/log.txt"
if grep -q "turn 2:" "$T/log.txt" && grep -q "not kept in state files" "$T/log.txt" && [ ! -e "$T/chat.k3s" ]; then
  ok "--chat with a penalty: two turns, /save refused"
else fail "--chat with a penalty: $(tail -3 "$T/log.txt")"; fi

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
