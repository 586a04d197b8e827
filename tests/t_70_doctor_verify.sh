#!/usr/bin/env bash
# t_70_doctor_verify.sh - `bin/k3 --verify` and `bin/k3 --doctor`.
# --verify: the good model gives 0 (its SHA-256 digests equal sha256sum's, an --expect
# file of them passes); each damaged copy of tests/models/m13 (truncated shard, MXFP4
# scale byte 255, NaN in a BF16 trunk matrix, +Inf in an F32 vector, wrong digest with
# --expect, index/shard mismatch, a shard the index does not know, a wrong shape) gives
# exit 2 naming shard, tensor, element or offset; a copy with several damages names
# EVERY one; usage errors give 2. --doctor exits 0, prints the topology it sees, and names
# ulimit -n/-f/-v/-s and OMP_STACKSIZE below what k3 needs and a --mem-gb below the floor with their fixes.
# Env (from tests/run.sh): K3_BIN, PYTHON, K3_TEST_TMP.
set -u
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
PYTHON="${PYTHON:-/usr/bin/python3}"
MODEL=tests/models/m13
MUT="$PYTHON tests/mutate_checkpoint.py"
T="$(mktemp -d "${K3_TEST_TMP:-/tmp}/t70.XXXXXX")"
trap 'rm -rf "$T"' EXIT
[ -x "$K3_BIN" ] || { echo "t_70: $K3_BIN is not built"; exit 1; }

fail=0; n=0
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

P=language_model.model
S1=model-00001-of-00003.safetensors
S2=model-00002-of-00003.safetensors
S3=model-00003-of-00003.safetensors
SCALE=$P.layers.5.block_sparse_moe.experts.3.w2.weight_scale
QPROJ=$P.layers.0.self_attn.q_proj.weight      # BF16 trunk matrix [48, 46]
DTB=$P.layers.0.self_attn.dt_bias              # F32 vector

# verify LABEL CODE DIR [ARGS...]; every |-separated substring of $WANT must be in stdout.
verify() {
  local label=$1 code=$2 dir=$3; shift 3
  n=$((n+1))
  "$K3_BIN" --verify "$dir" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then bad "$label: exit $rc, expected $code; out: $(head -c 600 "$T/out") err: $(head -c 300 "$T/err")"; return; fi
  local IFS='|' w
  for w in $WANT; do
    grep -qF -- "$w" "$T/out" || bad "$label: stdout lacks '$w': $(head -c 800 "$T/out")"
  done
  echo "ok   $label: $(grep -m1 PROBLEM "$T/out" | cut -c1-170)"
}

# ---- the good model
WANT="k3 verify: OK"
verify "good model" 0 "$MODEL"
WANT="SHA-256 (sha256sum format)"
verify "good model, --sha256" 0 "$MODEL" --sha256
(cd "$MODEL" && sha256sum *.safetensors) >"$T/sums"
grep -E '^[0-9a-f]{64}  model-' "$T/out" >"$T/ours"
cmp -s "$T/sums" "$T/ours" || bad "--sha256 digests differ from sha256sum: $(diff "$T/sums" "$T/ours" | head -5)"
(cd "$MODEL" && sha256sum *.safetensors config.json) >"$T/expect.good"
WANT="every digest matches"
verify "good model, --expect" 0 "$MODEL" --expect "$T/expect.good" --json "$T/good.json"
$PYTHON - "$T/good.json" <<'EOF' || bad "--json of the good model"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ok"] is True and j["problems"] == [] and j["schema_checked"] is True, j
assert len(j["shards"]) == 3 and all(len(s["sha256"]) == 64 for s in j["shards"]), j["shards"]
assert j["bytes_read"] == sum(s["bytes"] for s in j["shards"]), j
EOF

# ---- damaged copies (one Python start-up for all of them)
cat >"$T/batch" <<EOF
trunc truncate $S2 1000
scale poke $SCALE 7 255
nan poke $QPROJ 10 192 $QPROJ 11 127
inf poke $DTB 4 0 $DTB 5 0 $DTB 6 128 $DTB 7 127
move index-move $P.layers.1.input_layernorm.weight $S3
shape shape $QPROJ 46,48
EOF
mkdir -p "$T/q"
$MUT --batch "$MODEL" "$T/q" "$T/batch" || { echo "t_70: mutations failed"; exit 1; }

WANT="PROBLEM|$S2|truncated"
verify "truncated shard" 2 "$T/q/trunc"
WANT="PROBLEM|$SCALE|scale byte(s) are 255|element 7 (row|offset"
verify "MXFP4 scale byte 255" 2 "$T/q/scale"
WANT="PROBLEM|$QPROJ|(BF16)|1 non-finite|element 5 (row 0, col 5|NaN"
verify "NaN in a BF16 trunk matrix" 2 "$T/q/nan"
WANT="PROBLEM|$DTB|(F32)|element 1 (offset|+Inf"
verify "+Inf in an F32 vector" 2 "$T/q/inf"
WANT="PROBLEM|index maps tensor '$P.layers.1.input_layernorm.weight' to $S3, but it is in"
verify "index/shard mismatch" 2 "$T/q/move"
WANT="PROBLEM|schema: tensor '$QPROJ': shape [46, 48], expected [48, 46]"
verify "shape against the config" 2 "$T/q/shape"

# several schema problems in one copy: each named (the loader would stop at the first)
cp -r "$T/q/shape" "$T/schema"
$MUT "$T/schema" remove "$P.layers.2.post_attention_layernorm.weight" >/dev/null &&
  $MUT "$T/schema" dtype "$P.layers.1.self_attn.k_proj.weight" F16 >/dev/null || bad "schema: mutation failed"
WANT="PROBLEM|schema: tensor '$QPROJ': shape [46, 48], expected [48, 46]|schema: missing tensor '$P.layers.2.post_attention_layernorm.weight'|schema: tensor '$P.layers.1.self_attn.k_proj.weight': dtype F16, expected F32 or BF16|3 problem(s) found"
verify "three schema problems, all named" 2 "$T/schema"

# a wrong digest with --expect (the good bytes, one listed digest changed)
sed "s/^[0-9a-f]\{8\}\(.*$S1\)\$/00000000\1/" "$T/expect.good" >"$T/expect.bad"
WANT="PROBLEM|shard $S1: SHA-256|expects 00000000"
verify "wrong digest with --expect" 2 "$MODEL" --expect "$T/expect.bad"
grep -v "$S3" "$T/expect.good" >"$T/expect.short"
WANT="PROBLEM|shard $S3 has no expected digest"
verify "shard missing from --expect" 2 "$MODEL" --expect "$T/expect.short"

# a shard the index does not name, and a shard the index names but that is gone
cp -r "$MODEL" "$T/extra"; cp "$T/extra/$S1" "$T/extra/model-stray.safetensors"
WANT="PROBLEM|model-stray.safetensors is in the directory but the index names none|is in two shards"
verify "stray shard" 2 "$T/extra"
cp -r "$MODEL" "$T/gone"; rm "$T/gone/$S3"
WANT="PROBLEM|shard $S3 is named by the index but missing"
verify "missing shard" 2 "$T/gone"

# several damages in one copy: every one is named, in one run
cp -r "$T/q/nan" "$T/multi"
$MUT "$T/multi" poke "$SCALE" 7 255 >/dev/null && $MUT "$T/multi" poke "$SCALE" 2 255 >/dev/null &&
  $MUT "$T/multi" poke "$DTB" 6 128 "$DTB" 7 127 >/dev/null || bad "multi: mutation failed"
WANT="PROBLEM|$QPROJ|$SCALE|2 MXFP4 scale byte(s) are 255|at element 2 (row 2|, 7 (row 7|$DTB|3 problem(s) found"
verify "three damages, all named" 2 "$T/multi" --json "$T/multi.json"
$PYTHON - "$T/multi.json" <<'EOF' || bad "--json of the damaged model"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ok"] is False and len(j["problems"]) == 3, j["problems"]
for p in j["problems"]:
    assert p["shard"].endswith(".safetensors") and p["tensor"] and p["element"] >= 0 and p["offset"] > 0, p
EOF

# ---- usage errors
for args in "--verify" "--verify $MODEL $MODEL" "--sha256 $MODEL" "--doctor --verify $MODEL"; do
  n=$((n+1))
  $K3_BIN $args >/dev/null 2>"$T/err"; rc=$?
  [ "$rc" -eq 2 ] && grep -q "k3 --verify MODEL_DIR" "$T/err" || bad "usage '$args': exit $rc: $(head -c 300 "$T/err")"
done
n=$((n+1))
echo "not a digest line" >"$T/expect.junk"
$K3_BIN --verify "$MODEL" --expect "$T/expect.junk" >/dev/null 2>"$T/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "sha256sum format" "$T/err" || bad "malformed --expect: exit $rc: $(cat "$T/err")"

# ---- doctor
n=$((n+1))
"$K3_BIN" --doctor >"$T/doc" 2>"$T/err"; rc=$?
if [ "$rc" -ne 0 ]; then bad "--doctor: exit $rc: $(cat "$T/err")"
else
  grep -q "topology: [0-9]* node" "$T/doc" && grep -q "node [0-9]*: cpus" "$T/doc" && grep -q "online cores" "$T/doc" &&
    grep -q "ulimit -n" "$T/doc" && grep -q "/dev/shm" "$T/doc" || bad "--doctor output lacks a section: $(cat "$T/doc")"
  echo "ok   --doctor: $(grep -A1 "topology:" "$T/doc" | tr "\n" " ")"
fi
n=$((n+1))
"$K3_BIN" --doctor "$MODEL" --json "$T/doc.json" >"$T/doc" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] || bad "--doctor MODEL: exit $rc: $(cat "$T/err")"
grep -q -- "--mem-gb" "$T/doc" && grep -q "s/token" "$T/doc" && grep -q "O_DIRECT" "$T/doc" || bad "--doctor MODEL lacks advice: $(cat "$T/doc")"
$PYTHON - "$T/doc.json" <<'EOF' || bad "--doctor --json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["numa_nodes"] and j["numa_nodes"][0]["n_cpus"] >= 1, j["numa_nodes"]
assert j["advice"]["threads"] >= 1 and j["advice"]["mem_gb"] > 0, j["advice"]
assert j["model"]["shards"] == 3 and "seconds_per_token" in j["expected"], j
assert isinstance(j["problems"], list)
EOF
n=$((n+1))
"$K3_BIN" --doctor "$MODEL" --mem-gb 0.001 >"$T/doc" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] && grep -q "PROBLEM: --mem-gb 0.00 is below the floor" "$T/doc" || bad "--doctor --mem-gb below the floor: exit $rc: $(tail -3 "$T/doc")"
# problems named with their fix: limits below what k3 needs
n=$((n+1))
(ulimit -n 40; ulimit -f 100000; "$K3_BIN" --doctor "$MODEL") >"$T/doc" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] && grep -q "PROBLEM: ulimit -n is 40 but .*Fix: ulimit -n 73" "$T/doc" && grep -q "PROBLEM: ulimit -f is 100000 KiB.*Fix: ulimit -f unlimited" "$T/doc" ||
  bad "--doctor with ulimit -n 40 -f 100000: exit $rc: $(grep PROBLEM "$T/doc") $(tail -2 "$T/err")"
# a stack too small (ulimit -s, OMP_STACKSIZE) is named with its fix; the 1 MiB / 256 KiB that the
# prefill kernels' 600 KiB stack tiles needed flagged before 2026-12-01 are fine now (their
# workspace is on the heap), and a prefill on them runs
(ulimit -s 256; OMP_STACKSIZE=128K "$K3_BIN" --doctor "$MODEL") >"$T/doc" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] && grep -q "PROBLEM: ulimit -s is 256 KiB.*Fix: ulimit -s 8192" "$T/doc" &&
  grep -q "PROBLEM: OMP_STACKSIZE=128K .*Fix:" "$T/doc" ||
  bad "--doctor with ulimit -s 256, OMP_STACKSIZE=128K: exit $rc: $(grep PROBLEM "$T/doc") $(tail -2 "$T/err")"
n=$((n+1))
(ulimit -s 1024; OMP_STACKSIZE=256K "$K3_BIN" --doctor "$MODEL") >"$T/doc" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] && ! grep -q "PROBLEM: ulimit -s\|PROBLEM: OMP_STACKSIZE" "$T/doc" ||
  bad "--doctor with ulimit -s 1024, OMP_STACKSIZE=256K: exit $rc: $(grep PROBLEM "$T/doc") $(tail -2 "$T/err")"
n=$((n+1))
ids=$(seq -s, 1 40)
(ulimit -s 1024; OMP_STACKSIZE=256K "$K3_BIN" "$MODEL" --ids "$ids" --gen 2 --workers 0 --threads 2) >"$T/run" 2>"$T/err"; rc=$?
[ "$rc" -eq 0 ] || bad "a 40-id prefill with ulimit -s 1024, OMP_STACKSIZE=256K: exit $rc: $(tail -2 "$T/err")"
if grep -q __asan_init "$K3_BIN" 2>/dev/null; then
  echo "skip --doctor under ulimit -v: $K3_BIN is built with AddressSanitizer (its shadow memory needs the address space)"
else
  n=$((n+1))
  (ulimit -v 1500000; "$K3_BIN" --doctor "$MODEL") >"$T/doc" 2>"$T/err"; rc=$?
  [ "$rc" -eq 0 ] && grep -q "PROBLEM: ulimit -v (1.4 GiB) leaves no room.*Fix: ulimit -v unlimited" "$T/doc" ||
    bad "--doctor with ulimit -v 1500000: exit $rc: $(grep PROBLEM "$T/doc") $(tail -2 "$T/err")"
fi
n=$((n+1))
"$K3_BIN" --doctor configs/kimi-k3 >"$T/doc" 2>"$T/err" && grep -q "floor is" "$T/doc" || bad "--doctor configs/kimi-k3: $(cat "$T/doc" "$T/err" | tail -5)"

echo "t_70: $((n-fail))/$n checks passed"
[ "$fail" -eq 0 ]
