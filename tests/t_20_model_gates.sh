#!/usr/bin/env bash
# Model gates: the C engine ($K3_BIN) against the committed fixtures (tests/expected/*.json,
# *.logits.f32 from the float64 reference scripts/k3ref.py), for each committed model and
# for the "heads" preset generated here (more heads than one attention job takes) and the
# "lanes" one (expert widths of whole 128-column groups: the lane layout of resident experts):
#  (a) teacher forcing: --teacher-force --gen 0 gives tf_pred == fixture (and its logits,
#      rows 0..n_prompt-1, are within the fixture tolerance of the reference)
#  (b) greedy with --full-recompute gives generated_ids == fixture
#  (c) greedy incremental (default mode) gives the same ids and a cmp-identical logits dump
#  (d) the incremental dump is within tolerance of the reference logits
#  (e) --threads 1, --threads 2, --simd scalar|avx2|avx512: same ids, cmp-identical dumps
#  and, for the C engine, (c)'s --json phase breakdown against the shapes (tests/phases_check.py)
#      (a SIMD level the CPU refuses makes the engine exit 2: skipped with a note)
# The CLI contract is in docs/REFERENCE.md.  K3_BIN may be a command line, e.g.
# K3_BIN="/usr/bin/python3 scripts/k3ref.py" runs these gates on the reference itself.
set -u
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
PYTHON="${PYTHON:-/usr/bin/python3}"
TIMEOUT="${K3_GATE_TIMEOUT:-300}"
base="${K3_TEST_TMP:-$(mktemp -d)}"
tmp="$base/t20"
rm -rf "$tmp"
mkdir -p "$tmp"
fail=0

# run NAME ARGS...: runs the engine, output in $tmp/NAME.log, returns its exit status
run() {
  local name=$1; shift
  # shellcheck disable=SC2086
  timeout "$TIMEOUT" $K3_BIN "$@" >"$tmp/$name.log" 2>&1
  local rc=$?
  echo "$rc" >"$tmp/$name.rc"
  return $rc
}

# same_ids FIXTURE RESULT FIELD [RESULT_FIELD]: compares one id list
same_ids() {
  "$PYTHON" - "$@" <<'EOF'
import json, sys
fx, got, key = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
rkey = sys.argv[4] if len(sys.argv) > 4 else key
try:
    res = json.load(open(got))
except (OSError, ValueError) as e:
    print("  cannot read %s: %s" % (got, e)); sys.exit(1)
if rkey not in res:
    print("  %s has no field %s" % (got, rkey)); sys.exit(1)
a, b = fx[key], res[rkey]
if a == b:
    sys.exit(0)
i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print("  %s differs at index %d:\n    expected %s\n    got      %s" % (rkey, i, a, b))
sys.exit(1)
EOF
}

bad() { echo "FAIL: $*"; fail=1; }

# logits A B ARGS...: scripts/compare_logits.py, output indented, its exit status returned
logits() {
  "$PYTHON" scripts/compare_logits.py "$@" >"$tmp/compare.out" 2>&1
  local rc=$?
  sed 's/^/    /' "$tmp/compare.out"
  return $rc
}

# "heads": more attention heads than one job takes (MLA 19 = 8 + 8 + 3, KDA 9), generated
# here by scripts/gen_model.py (not committed; about 2 s)
gen="$tmp/gen"
# "lanes": expert widths of whole 128-column groups, whose codes a resident run on Zen 4 keeps in
# the lane layout (tests/t_58_lanes.sh forces it on any CPU)
for g in heads lanes; do
  if ! "$PYTHON" scripts/gen_model.py --preset $g --out "$gen/models/$g" --expected-dir "$gen/expected" >"$tmp/gen.log" 2>&1; then
    bad "gen_model.py --preset $g failed"; cat "$tmp/gen.log"
  fi
done

for m in m13 m14b12 heads lanes; do
  model="tests/models/$m"
  fx="tests/expected/$m.json"
  if [ "$m" = heads ] || [ "$m" = lanes ]; then model="$gen/models/$m"; fx="$gen/expected/$m.json"; fi
  [ -f "$fx" ] || continue
  read -r P N TOL V NP < <("$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(",".join(map(str,d["prompt_ids"])), d["n_gen"], d["tolerance_abs"], d["vocab_size"], len(d["prompt_ids"]))' "$fx")
  ref="$(dirname "$fx")/$m.logits.f32"
  echo "== $m: prompt of $NP ids, $N generated, tolerance $TOL"

  # (a) teacher forcing
  if run "$m.tf" "$model" --ids "$P" --teacher-force --gen 0 --json "$tmp/$m.tf.json" --dump-logits "$tmp/$m.tf.f32"; then
    if same_ids "$fx" "$tmp/$m.tf.json" tf_pred; then echo "(a) $m teacher-forced predictions match"; else bad "(a) $m tf_pred"; fi
    if ! logits "$tmp/$m.tf.f32" "$ref" --vocab "$V" --tol "$TOL"; then
      bad "(a) $m teacher-forced logits outside tolerance"
    fi
    if [ -f "$tmp/$m.tf.f32" ] && [ "$(stat -c %s "$tmp/$m.tf.f32")" -ne $((NP * V * 4)) ]; then
      bad "(a) $m teacher-forced dump has $(stat -c %s "$tmp/$m.tf.f32") bytes, expected $((NP * V * 4)) ($NP rows)"
    fi
  else
    bad "(a) $m: engine exit $(cat "$tmp/$m.tf.rc")"; tail -n 5 "$tmp/$m.tf.log"
  fi

  # (b) greedy, full recompute
  if run "$m.full" "$model" --ids "$P" --gen "$N" --full-recompute --json "$tmp/$m.full.json" --dump-logits "$tmp/$m.full.f32"; then
    if same_ids "$fx" "$tmp/$m.full.json" generated_ids; then echo "(b) $m full-recompute greedy ids match"; else bad "(b) $m generated_ids (full recompute)"; fi
  else
    bad "(b) $m: engine exit $(cat "$tmp/$m.full.rc")"; tail -n 5 "$tmp/$m.full.log"
  fi

  # (c) greedy, incremental (default)
  if run "$m.inc" "$model" --ids "$P" --gen "$N" --json "$tmp/$m.inc.json" --dump-logits "$tmp/$m.inc.f32"; then
    if same_ids "$fx" "$tmp/$m.inc.json" generated_ids; then echo "(c) $m incremental greedy ids match"; else bad "(c) $m generated_ids (incremental)"; fi
    if [ "$(stat -c %s "$tmp/$m.inc.f32")" -ne $((N * V * 4)) ]; then
      bad "(c) $m incremental dump has $(stat -c %s "$tmp/$m.inc.f32") bytes, expected $((N * V * 4)) ($N rows)"
    fi
    if cmp "$tmp/$m.inc.f32" "$tmp/$m.full.f32"; then echo "(c) $m incremental logits bit-identical to full recompute"
    else bad "(c) $m incremental vs full-recompute logits not bit-identical"; fi
    # the run's phase breakdown (--json timing.*_phases: FLOP from the shapes, wall time inside
    # the span); the C engine only (the reference reports no timing)
    case "$K3_BIN" in
      *k3ref*) ;;
      *) if "$PYTHON" tests/phases_check.py "$model" "$tmp/$m.inc.json"; then echo "(c) $m phase breakdown: FLOP as the shapes give"
         else bad "(c) $m timing.prefill_phases / decode_phases"; fi ;;
    esac
    # (d) against the reference
    if logits "$tmp/$m.inc.f32" "$ref" --vocab "$V" --tol "$TOL" --b-start $((NP - 1)) --exact-rows; then
      echo "(d) $m logits within $TOL of the reference"
    else
      bad "(d) $m logits vs reference"
    fi
  else
    bad "(c) $m: engine exit $(cat "$tmp/$m.inc.rc")"; tail -n 5 "$tmp/$m.inc.log"
  fi

  # (e) threads and SIMD levels: identical ids and bits
  for variant in "--threads 1" "--threads 2" "--simd scalar" "--simd avx2" "--simd avx512"; do
    tag="$m.$(echo "$variant" | tr -d ' -')"
    # shellcheck disable=SC2086
    run "$tag" "$model" --ids "$P" --gen "$N" $variant --json "$tmp/$tag.json" --dump-logits "$tmp/$tag.f32"
    rc=$(cat "$tmp/$tag.rc")
    if [ "$rc" -eq 2 ] && [ "${variant#--simd}" != "$variant" ]; then
      echo "(e) $m $variant: refused by the engine (exit 2), skipped: $(tail -n 1 "$tmp/$tag.log")"
      continue
    fi
    if [ "$rc" -ne 0 ]; then bad "(e) $m $variant: engine exit $rc"; tail -n 5 "$tmp/$tag.log"; continue; fi
    ok=1
    same_ids "$fx" "$tmp/$tag.json" generated_ids || { bad "(e) $m $variant generated_ids"; ok=0; }
    if ! cmp "$tmp/$tag.f32" "$tmp/$m.inc.f32"; then
      bad "(e) $m $variant logits not bit-identical to the default run"
      logits "$tmp/$tag.f32" "$tmp/$m.inc.f32" --vocab "$V" --tol 0
      ok=0
    fi
    [ "$ok" -eq 1 ] && echo "(e) $m $variant: same ids, bit-identical logits"
  done
done
[ "$fail" -eq 0 ] && echo "OK: all model gates pass"
exit "$fail"
