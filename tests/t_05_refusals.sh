#!/usr/bin/env bash
# t_05_refusals.sh - bin/k3 refuses damaged models and bad arguments with exit 2 and a
# message naming the culprit; a poisoned MXFP4 scale in a used expert ends the run
# with a message naming the tensor; experts that are not back to back still work.
# Each case damages a fresh copy of tests/models/m13 in one way (tests/mutate_checkpoint.py).
# Env (from tests/run.sh): K3_BIN, PYTHON, K3_TEST_TMP.
set -u
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
PYTHON="${PYTHON:-/usr/bin/python3}"
MODEL="${K3_REFUSAL_MODEL:-tests/models/m13}"
MUT="$PYTHON tests/mutate_checkpoint.py"
T="$(mktemp -d "${K3_TEST_TMP:-/tmp}/t05.XXXXXX")"
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

[ -x "$K3_BIN" ] || { echo "t_05: $K3_BIN is not built"; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "t_05: $MODEL is missing (make models)"; exit 1; }

fail=0; n=0
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

P=language_model.model
L0=$P.layers.0.self_attn       # KDA layer, dense MLP
L3=$P.layers.3.self_attn       # MLA layer (one-based 4)
EXP=$P.layers.5.block_sparse_moe.experts
S1=model-00001-of-00003.safetensors
S2=model-00002-of-00003.safetensors
S3=model-00003-of-00003.safetensors

fresh() { rm -rf "$T/m"; cp -r "$MODEL" "$T/m"; }

# expect_exit CODE LABEL ARGS... (CODE nz = any failure status but a signal); the substrings
# stderr must contain are in $WANT (|-separated).
# Runs $K3_BIN ARGS, checks the exit code, that stdout is empty and stderr holds every wanted substring.
expect_exit() {
  local code=$1 label=$2; shift 2
  n=$((n+1))
  "$K3_BIN" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$code" = nz ]; then  # any failure status, but not a signal
    if [ "$rc" -eq 0 ] || [ "$rc" -gt 125 ]; then bad "$label: exit $rc, expected a failure status; stderr: $(head -c 400 "$T/err")"; return; fi
  elif [ "$rc" -ne "$code" ]; then bad "$label: exit $rc, expected $code; stderr: $(head -c 400 "$T/err")"; return; fi
  if [ -s "$T/out" ]; then bad "$label: printed ids on stdout: $(head -c 200 "$T/out")"; fi
  if [ ! -s "$T/err" ]; then bad "$label: no message on stderr"; return; fi
  local IFS='|' w
  for w in $WANT; do
    grep -qF -- "$w" "$T/err" || bad "$label: stderr lacks '$w': $(head -c 400 "$T/err")"
  done
  echo "ok   $label: $(tail -n 1 "$T/err" | cut -c1-160)"
}

# refuse LABEL WANT OP ARGS... : queues one mutation of a fresh copy of the model; run_refusals
# then applies them all (one Python start-up) and requires k3 to refuse each copy with exit 2
# and a message holding every |-separated substring of WANT.
nq=0
refuse() {
  nq=$((nq+1)); QLABEL[$nq]=$1; QWANT[$nq]=$2; shift 2
  printf '%q ' "c$nq" "$@" >>"$T/batch"; echo >>"$T/batch"
}
run_refusals() {
  mkdir -p "$T/q"
  if ! $MUT --batch "$MODEL" "$T/q" "$T/batch"; then bad "mutations failed"; return; fi
  local i
  for i in $(seq 1 $nq); do
    WANT="k3: refusing model:|${QWANT[$i]}"
    expect_exit 2 "${QLABEL[$i]}" "$T/q/c$i" --ids 1,2,3 --gen 1
    rm -rf "$T/q/c$i"
  done
}

# ---- the unmodified model runs (otherwise every refusal below proves nothing)
fresh
"$K3_BIN" "$T/m" --ids 1,2,3 --gen 4 --workers 0 >"$T/ref.out" 2>"$T/ref.err" || { echo "t_05: the unmodified model fails:"; cat "$T/ref.err"; exit 1; }
[ -s "$T/ref.out" ] || { echo "t_05: the unmodified model printed no ids"; exit 1; }

# ---- checkpoint damage
refuse "missing trunk tensor"        "missing tensor '$L0.q_proj.weight'"        remove $L0.q_proj.weight
refuse "missing tensor, stale index" "$L0.k_proj.weight|no shard contains it"    remove $L0.k_proj.weight --keep-index
refuse "missing lm_head"             "language_model.lm_head.weight"             remove language_model.lm_head.weight
refuse "missing final norm"          "$P.norm.weight"                            remove $P.norm.weight
refuse "missing MLA tensor"          "missing tensor '$L3.kv_b_proj.weight'"     remove $L3.kv_b_proj.weight
refuse "wrong shape (transposed)"    "$L0.q_proj.weight|shape [46, 48], expected [48, 46]" shape $L0.q_proj.weight 46,48
refuse "wrong shape (MLA q_b_proj)"  "$L3.q_b_proj.weight|shape"                 shape $L3.q_b_proj.weight 48,25
refuse "wrong rank (norm as 2-D)"    "$P.layers.2.input_layernorm.weight|shape"  shape $P.layers.2.input_layernorm.weight 1,46
refuse "dtype F16 for BF16"          "$L0.q_proj.weight|F16"                     dtype $L0.q_proj.weight F16
refuse "dtype I32 for BF16"          "$P.embed_tokens.weight|I32"                dtype $P.embed_tokens.weight I32
refuse "dtype F64 for a norm"        "$P.layers.1.post_attention_layernorm.weight|F64" dtype $P.layers.1.post_attention_layernorm.weight F64
refuse "missing expert tensor"       "missing tensor '$EXP.7.w2.weight_packed'"  remove $EXP.7.w2.weight_packed
refuse "missing last expert scale"   "$P.layers.12.block_sparse_moe.experts.15.w3.weight_scale" remove $P.layers.12.block_sparse_moe.experts.15.w3.weight_scale
refuse "expert scale, wrong columns" "$EXP.3.w1.weight_scale|expected [32, 2]"   shape $EXP.3.w1.weight_scale 32,4
refuse "expert scale, group 64"      "$EXP.3.w2.weight_scale|expected [64, 1]"   shape $EXP.3.w2.weight_scale 64,2
refuse "expert packed, wrong shape"  "$EXP.4.w3.weight_packed|expected [32, 32]" shape $EXP.4.w3.weight_packed 32,33
refuse "expert packed as I8"         "$EXP.4.w1.weight_packed|I8"                dtype $EXP.4.w1.weight_packed I8
refuse "truncated shard"             "$S3|truncated"                             truncate $S3 5
refuse "truncated shard (1 byte)"    "$S2|truncated"                             truncate $S2 1
refuse "index points at wrong shard" "$L0.v_proj.weight|$S2|$S1"                 index-move $L0.v_proj.weight $S2
refuse "tensor in two shards"        "$L0.g_proj.weight|two shards"              duplicate $L0.g_proj.weight $S3
refuse "garbage shard header"        "$S2|not valid JSON"                        garbage-header $S2
# config damage
refuse "config: num_heads missing"   "num_heads"                                 config-del num_heads
refuse "config: full_attn_layers missing" "full_attn_layers"                     config-del full_attn_layers
refuse "config: hidden_act silu"     "hidden_act|silu"                           config hidden_act '"silu"'
refuse "config: zero-based layers"   "full_attn_layers"                          config full_attn_layers '[0, 3, 7, 10, 12]'
refuse "config: hidden_size string"  "hidden_size"                               config hidden_size '"46"'
refuse "config: num_expert_group 8"  "num_expert_group"                          config num_expert_group 8
refuse "config: tied embeddings"     "tie_word_embeddings"                       config tie_word_embeddings true
refuse "config vs tensors: width"    "$P.embed_tokens.weight|shape [764, 46], expected [764, 48]" config hidden_size 48
refuse "config vs tensors: experts"  "$P.layers.1.block_sparse_moe.gate.weight|expected [15, 46]" config num_experts 15
refuse "config vs tensors: kda heads" "$L0.q_proj.weight|expected [64, 46]"      config num_heads 4
refuse "shard cut inside its header" "$S1|header length|past the end"           truncate $S1 $(( $(stat -c %s "$MODEL/$S1") - 100 ))
refuse "shard cut to 4 bytes"        "$S3|8-byte"                                truncate $S3 $(( $(stat -c %s "$MODEL/$S3") - 4 ))
run_refusals

fresh
rm "$T/m/$S2"
WANT="k3: refusing model:|$S2|cannot open"; expect_exit 2 "shard file missing" "$T/m" --ids 1 --gen 1
fresh
sed -i 's/"hidden_size": 46/"hidden_size": 46,,/' "$T/m/config.json" 2>/dev/null
WANT="k3: refusing model:|config.json|invalid JSON"; expect_exit 2 "config with a syntax error" "$T/m" --ids 1 --gen 1
rm -f "$T/m/config.json"
WANT="k3: refusing model:|config.json"; expect_exit 2 "config.json absent" "$T/m" --ids 1 --gen 1
WANT="k3: refusing model:|$T/nonexistent"; expect_exit 2 "model dir absent" "$T/nonexistent" --ids 1 --gen 1

# ---- bad arguments (on the intact model)
fresh
M="$T/m"
WANT="--ids";    expect_exit 2 "--ids non-numeric"  "$M" --ids 1,x,3 --gen 1
WANT="--ids";    expect_exit 2 "--ids negative"     "$M" --ids -1 --gen 1
WANT="--ids";    expect_exit 2 "--ids empty"        "$M" --ids "" --gen 1
WANT="--ids";    expect_exit 2 "--ids double comma" "$M" --ids 1,,2 --gen 1
WANT="--ids";    expect_exit 2 "--ids trailing comma" "$M" --ids 1,2, --gen 1
WANT="--ids";    expect_exit 2 "--ids overflow"     "$M" --ids 99999999999999999999 --gen 1
WANT="764|vocabulary"; expect_exit 2 "--ids out of vocab (=V)" "$M" --ids 1,764 --gen 1
WANT="100000|vocabulary"; expect_exit 2 "--ids out of vocab" "$M" --ids 100000 --gen 1
WANT="--threads"; expect_exit 2 "--threads 0"       "$M" --ids 1 --gen 1 --threads 0
WANT="--threads"; expect_exit 2 "--threads abc"     "$M" --ids 1 --gen 1 --threads abc
WANT="--gen";    expect_exit 2 "--gen -1"           "$M" --ids 1 --gen -1
WANT="--gen";    expect_exit 2 "--gen 1.5"          "$M" --ids 1 --gen 1.5
WANT="--simd";   expect_exit 2 "--simd foo"         "$M" --ids 1 --gen 1 --simd foo
WANT="--chunk";  expect_exit 2 "--chunk 0"          "$M" --ids 1 --gen 1 --chunk 0
WANT="--workers"; expect_exit 2 "--workers -1"      "$M" --ids 1 --gen 1 --workers -1
WANT="--frobnicate"; expect_exit 2 "unknown flag"   "$M" --ids 1 --gen 1 --frobnicate
WANT="--gen";    expect_exit 2 "flag without value" "$M" --ids 1 --gen
WANT="MODEL_DIR"; expect_exit 2 "no model dir"      --ids 1 --gen 1
WANT="MODEL_DIR"; expect_exit 2 "two model dirs"    "$M" "$M" --ids 1 --gen 1
WANT="--ids";    expect_exit 2 "no prompt"          "$M" --gen 1
WANT="--ids";    expect_exit 2 "--ids and --prompt" "$M" --ids 1 --prompt hi --gen 1

# ---- a scale byte 255 (NaN) in an expert that the run uses: the run ends naming the tensor.
# First poison every expert of the first MoE layer (some of them must be used) and read
# which one the engine names; then poison only that one and require the same tensor.
fresh
pokes=()
for e in $(seq 0 15); do pokes+=("$P.layers.1.block_sparse_moe.experts.$e.w2.weight_scale" 17 255); done
$MUT "$T/m" poke "${pokes[@]}" || bad "poke failed"
WANT="$P.layers.1.block_sparse_moe.experts.|w2.weight_scale|255"
expect_exit nz "scale byte 255 in every expert of layer 1" "$T/m" --ids 1,2,3 --gen 1
used=$(grep -o "$P\.layers\.1\.block_sparse_moe\.experts\.[0-9]*\.w2\.weight_scale" "$T/err" | head -n 1)
if [ -n "$used" ]; then
  fresh
  $MUT "$T/m" poke "$used" 40 255 || bad "poke failed"
  WANT="'$used'|255"
  expect_exit nz "scale byte 255 in one used expert" "$T/m" --ids 1,2,3 --gen 1
  # with --gen 0 the run still needs the prompt's logits, so it must fail too
  WANT="'$used'"
  expect_exit nz "scale byte 255, --gen 0" "$T/m" --ids 1,2,3 --gen 0
  # and the same with the experts computed in-process
  WANT="'$used'|255"
  expect_exit nz "scale byte 255, --workers 0" "$T/m" --ids 1,2,3 --gen 1 --workers 0
else
  bad "could not read the poisoned expert's name"
fi

# ---- experts scattered (not back to back) give the same ids, with expert servers and in-process
fresh
if $MUT "$T/m" scatter-experts; then
  for wk in default 0; do
    n=$((n+1))
    wflag=(); [ "$wk" = default ] || wflag=(--workers "$wk")
    if "$K3_BIN" "$T/m" --ids 1,2,3 --gen 4 "${wflag[@]}" >"$T/scat.out" 2>"$T/scat.err"; then
      if cmp -s "$T/ref.out" "$T/scat.out"; then echo "ok   scattered experts (workers $wk): same ids ($(cat "$T/ref.out"))"
      else bad "scattered experts (workers $wk): ids differ: $(cat "$T/scat.out") vs $(cat "$T/ref.out")"; fi
    else
      bad "scattered experts (workers $wk): refused or failed: $(head -c 400 "$T/scat.err")"
    fi
  done
else
  bad "scatter-experts mutation failed"
fi

echo "t_05: $((n-fail))/$n cases passed"
[ "$fail" -eq 0 ]
