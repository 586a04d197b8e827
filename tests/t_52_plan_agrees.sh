#!/usr/bin/env bash
# One plan (issue 8 item 1): `--plan-only` (config.json alone) and a loaded run
# print the same memory plan, line for line, at the same budget, --max-context
# and worker count, on both committed models; and every expert server gets
# exactly the cache slots the plan printed as "experts per server" (also when
# --expert-cache-mb sets the cache: the plan takes it).
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/plan_agrees"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
# the plan block: from "memory plan" to the "total" line
plan_of() { awk '/^memory plan/{p=1} p{print} p&&/^  total/{exit}' "$1"; }

n=0 refused=0
for name in m13 m14b12; do
  M=tests/models/$name
  for w in 0 2 3; do
    # this configuration's floor, from the refusal of a tiny budget
    "$K3" "$M" --plan-only --workers $w --max-context 40 --mem-gb 0.001 > /dev/null 2> "$T/floor.err"
    floor=$(sed -n 's/.*floor of [0-9.]* GiB (\([0-9]*\) bytes).*/\1/p' "$T/floor.err")
    [ -n "$floor" ] || { cat "$T/floor.err"; fail "$name workers=$w: no floor in the refusal"; }
    gib() { $PY -c "import math; print('%.9f' % (math.ceil(($floor + $1) / 2**30 * 1e9) / 1e9))"; }
    # below the floor, at it, partly pinned trunk, trunk pinned with part of the
    # experts cached, everything, and the max preset
    for budget in "--mem-gb $(gib -4096)" "--mem-gb $(gib 0)" "--mem-gb $(gib 1000000)" "--mem-gb $(gib 3500000)" \
                  "--mem-gb $(gib 100000000)" "--preset max" "--mem-gb $(gib 1000000) --expert-cache-mb 0.05"; do
      for ctx in 40 300; do
        # the second context size only at one budget: short, and both sizes are seen per model
        [ "$ctx" = 300 ] && [ "$budget" != "--mem-gb $(gib 1000000)" ] && continue
        args="--workers $w $budget --max-context $ctx"
        "$K3" "$M" --plan-only $args > "$T/only.out" 2> "$T/only.err"
        rc_only=$?
        "$K3" "$M" --ids 1,2,3 --gen 1 $args > /dev/null 2> "$T/run.err"
        rc_run=$?
        if [ $rc_only = 2 ]; then # below this model's floor: both refuse with the same floor
          [ $rc_run = 2 ] || fail "$name $args: --plan-only refused, the run exited $rc_run"
          a=$(grep -o "floor of [0-9.]* GiB ([0-9]* bytes)" "$T/only.err"); b=$(grep -o "floor of [0-9.]* GiB ([0-9]* bytes)" "$T/run.err")
          [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name $args: floors differ: '$a' vs '$b'"
          refused=$((refused+1))
          echo "$name $args: both refused at the same floor"
          continue
        fi
        [ $rc_only = 0 ] || { cat "$T/only.err"; fail "$name $args: --plan-only exited $rc_only"; }
        [ $rc_run = 0 ] || { cat "$T/run.err"; fail "$name $args: the run exited $rc_run"; }
        plan_of "$T/only.out" > "$T/a.txt"
        plan_of "$T/run.err" > "$T/b.txt"
        [ -s "$T/a.txt" ] || fail "$name $args: no plan printed by --plan-only"
        diff "$T/a.txt" "$T/b.txt" > "$T/d.txt" || { cat "$T/d.txt"; fail "$name $args: --plan-only and the loaded run print different plans"; }
        per=$(sed -n 's/.*= \([0-9]*\) experts of .* per server.*/\1/p' "$T/a.txt")
        [ -n "$per" ] || fail "$name $args: no experts-per-server figure in the plan"
        if [ $w -gt 0 ]; then
          slots=$(sed -n 's/^k3: worker [0-9]* pid .*, \([0-9]*\) cache slots.*/\1/p' "$T/run.err")
          [ "$(echo "$slots" | wc -l)" = $w ] || { cat "$T/run.err"; fail "$name $args: expected $w worker lines"; }
          for s in $slots; do [ "$s" = "$per" ] || fail "$name $args: a server got $s cache slots, the plan printed $per"; done
        fi
        n=$((n+1))
        echo "$name $args: same plan; $(grep -o '[0-9]* of [0-9]* walk units' "$T/a.txt") pinned; $per experts per server"
      done
    done
  done
done
[ $n -ge 30 ] || fail "only $n comparisons ran"
# an --expert-cache-mb below one expert slot is refused by both, naming the slot's bytes
for mode in "--ids 1,2 --gen 1" "--plan-only"; do
  "$K3" tests/models/m13 $mode --expert-cache-mb 0.001 > /dev/null 2> "$T/small.err"
  rc=$?
  [ $rc = 2 ] && grep -q "below one expert" "$T/small.err" && grep -q "12288 bytes" "$T/small.err" \
    || { cat "$T/small.err"; fail "$mode: a cache below one slot: exit $rc"; }
done
[ $refused -ge 6 ] || fail "only $refused below-floor refusals compared"
echo ok
