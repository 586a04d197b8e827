#!/usr/bin/env bash
# t_15_hostile.sh - what a hostile or careless user tries (issue 15): non-finite weights,
# non-regular files, terminal escapes in quoted file bytes, a server that scribbles its ring
# control page or dies before it is ready, full /dev/shm, broken output paths, resource
# limits and unbounded input. Every case must end in a refusal or a message with the right
# exit status, or in the intact model's ids: never a wrong token, never a signal we did not
# send, never a hang (each run has a 60 s watchdog), never a leftover process or
# shared-memory object. The counts are printed at the end (docs/TESTING.md records them).
# Env (from tests/run.sh): K3_BIN, PYTHON, K3_TEST_TMP.
set -u
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
PYTHON="${PYTHON:-/usr/bin/python3}"
MODEL=tests/models/m13
MUT="$PYTHON tests/mutate_checkpoint.py"
T="$(mktemp -d "${K3_TEST_TMP:-/tmp}/t15.XXXXXX")"
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
[ -x "$K3_BIN" ] || { echo "t_15: $K3_BIN is not built"; exit 1; }

fail=0; n_in=0; n_fault=0; n_limit=0; n_wrong=0; n_sig=0; n_hang=0; n_leak=0
bad() { echo "FAIL: $*"; fail=$((fail+1)); }
P=language_model.model
S1=model-00001-of-00003.safetensors
S2=model-00002-of-00003.safetensors
IDS=1,2,3
REF=$("$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0 2>/dev/null) || { echo "t_15: the intact model fails"; exit 1; }
[ -n "$REF" ] || { echo "t_15: the intact model printed no ids"; exit 1; }

# processes started by this script carry K3_T15_MARK; none may outlive its run
export K3_T15_MARK=$$
leftovers() {
  local p
  for p in $(pgrep -x k3-expertd; pgrep -x sleep); do
    tr '\0' '\n' 2>/dev/null </proc/$p/environ | grep -qx "K3_T15_MARK=$$" && echo $p
  done
}

# check CLASS CODE LABEL [WANT...] -- CMD...: runs CMD (60 s watchdog, stdout to $T/out, stderr
# to $T/err); the exit status must be CODE (ok = 0 with the reference ids, or 0 / 1 / 2, or nz:
# 1 or 2) and stderr must hold every WANT. Counts the case under CLASS (in, fault, limit).
check() {
  local cls=$1 code=$2 label=$3; shift 3
  local want=()
  local IFS_=$IFS part
  while [ "$1" != -- ]; do IFS='|'; for part in $1; do want+=("$part"); done; IFS=$IFS_; shift; done; shift
  case $cls in in) n_in=$((n_in+1));; fault) n_fault=$((n_fault+1));; limit) n_limit=$((n_limit+1));; esac
  timeout -s KILL 60 "$@" >"$T/out" 2>"$T/err" </dev/null
  local rc=$?
  if [ $rc -eq 137 ] && ! grep -q . "$T/err"; then n_hang=$((n_hang+1)); bad "$label: hung (killed by the watchdog)"; return; fi
  if [ $rc -gt 128 ]; then n_sig=$((n_sig+1)); bad "$label: killed by signal $((rc-128)): $(head -c 300 "$T/err")"; return; fi
  case $code in
    ok) if [ $rc -ne 0 ]; then bad "$label: exit $rc, expected 0: $(head -c 300 "$T/err")"; return; fi
        if [ "$(cat "$T/out")" != "$REF" ]; then n_wrong=$((n_wrong+1)); bad "$label: WRONG IDS $(head -c 100 "$T/out") vs $REF"; return; fi ;;
    nz) if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then bad "$label: exit $rc, expected 1 or 2: $(head -c 300 "$T/err")"; return; fi ;;
    any) if [ $rc -eq 0 ] && [ "$(cat "$T/out")" != "$REF" ]; then n_wrong=$((n_wrong+1)); bad "$label: WRONG IDS"; return; fi
         if [ $rc -gt 2 ]; then bad "$label: exit $rc"; return; fi ;;
    *) if [ $rc -ne "$code" ]; then bad "$label: exit $rc, expected $code: $(head -c 300 "$T/err")"; return; fi ;;
  esac
  if [ "$code" != ok ] && [ "$code" != 0 ] && [ -s "$T/out" ] && [ "$(cat "$T/out")" != "$REF" ]; then
    n_wrong=$((n_wrong+1)); bad "$label: printed something other than the reference ids: $(head -c 100 "$T/out")"; return
  fi
  local w
  for w in "${want[@]}"; do grep -qF -- "$w" "$T/err" || { bad "$label: stderr lacks '$w': $(head -c 300 "$T/err")"; return; }; done
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$T/err"; then bad "$label: raw control bytes on stderr"; return; fi
  echo "ok   $label (exit $rc): $(tail -n 1 "$T/err" | cut -c1-150)"
}

# ---- 1. non-finite weights: every small tensor checked at load (named, with the element);
# big matrices on their first read; the embedding row when read.
nq=0
queue() { nq=$((nq+1)); QL[$nq]=$1; QW[$nq]=$2; QC[$nq]=$3; shift 3; printf '%q ' "c$nq" "$@" >>"$T/batch"; echo >>"$T/batch"; }
B=$P.layers.1.block_sparse_moe.gate.e_score_correction_bias
queue "NaN in one router bias element"   "$B|element 3|NaN"              2 setval $B 3 nan
queue "NaN in every router bias element" "$B|element 0"                  2 setval $B all nan
queue "+Inf in a router bias"            "$B|element 15|Inf"             2 setval $B 15 inf
queue "Inf in dt_bias"                   "$P.layers.0.self_attn.dt_bias|element 7" 2 setval $P.layers.0.self_attn.dt_bias 7 inf
queue "-Inf in A_log"                    "$P.layers.2.self_attn.A_log|element 1" 2 setval $P.layers.2.self_attn.A_log 1 -inf
queue "NaN in a conv kernel"             "$P.layers.4.self_attn.k_conv1d.weight|element 191" 2 setval $P.layers.4.self_attn.k_conv1d.weight 191 nan
queue "NaN in a norm weight (bf16)"      "$P.layers.5.input_layernorm.weight|element 0" 2 setval $P.layers.5.input_layernorm.weight 0 nan
queue "NaN in the final norm"            "$P.norm.weight|element 45"     2 setval $P.norm.weight 45 nan
queue "Inf in an MLA layernorm"          "$P.layers.3.self_attn.kv_a_layernorm.weight" 2 setval $P.layers.3.self_attn.kv_a_layernorm.weight 2 inf
queue "NaN in an AttnRes projection"     "$P.layers.6.mlp_res_proj.weight" 2 setval $P.layers.6.mlp_res_proj.weight 9 nan
queue "NaN in the output AttnRes norm"   "$P.output_attn_res_norm.weight" 2 setval $P.output_attn_res_norm.weight 4 nan
queue "NaN in the latent expert norm"    "$P.layers.2.block_sparse_moe.routed_expert_norm.weight" 2 setval $P.layers.2.block_sparse_moe.routed_expert_norm.weight 63 nan
queue "NaN in KDA o_norm"                "$P.layers.8.self_attn.o_norm.weight" 2 setval $P.layers.8.self_attn.o_norm.weight 3 nan
queue "Inf in a trunk matrix (q_b_proj)" "$P.layers.3.self_attn.q_b_proj.weight|element 100" 1 setval $P.layers.3.self_attn.q_b_proj.weight 100 inf
queue "NaN in the router matrix"         "$P.layers.1.block_sparse_moe.gate.weight|element 5" 1 setval $P.layers.1.block_sparse_moe.gate.weight 5 nan
queue "Inf in a KDA gate matrix"         "$P.layers.0.self_attn.g_proj.weight" 1 setval $P.layers.0.self_attn.g_proj.weight 77 inf
queue "-Inf in lm_head"                  "language_model.lm_head.weight|element 500" 1 setval language_model.lm_head.weight 500 -inf
queue "Inf in a used embedding row"      "$P.embed_tokens.weight|element 50" 1 setval $P.embed_tokens.weight 50 inf
queue "NaN in a shared-expert matrix"    "$P.layers.1.block_sparse_moe.shared_experts.down_proj.weight" 1 setval $P.layers.1.block_sparse_moe.shared_experts.down_proj.weight 3 nan
mkdir -p "$T/q"
if $MUT --batch "$MODEL" "$T/q" "$T/batch"; then
  for i in $(seq 1 $nq); do
    check in "${QC[$i]}" "${QL[$i]}" "${QW[$i]}" -- "$K3_BIN" "$T/q/c$i" --ids $IDS --gen 4 --workers 0
    rm -rf "$T/q/c$i"
  done
else bad "mutations failed"; fi
# a streamed matrix is checked on its first read too (budget at the floor: everything streams; --threads
# fixed: the plan holds scratch per coordinator thread, so the floor grows with the cpu count)
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"; $MUT "$T/m" setval $P.layers.9.self_attn.o_proj.weight 11 nan
check in 1 "NaN in a streamed matrix" "$P.layers.9.self_attn.o_proj.weight|element 11" -- "$K3_BIN" "$T/m" --ids $IDS --gen 4 --workers 0 --mem-gb 0.0192 --threads 2
# with --mmap the pinned units are the file's pages, checked all the same (in a matrix and in the lm head)
check in 1 "NaN in a mapped pinned matrix (--mmap)" "$P.layers.9.self_attn.o_proj.weight|element 11" -- "$K3_BIN" "$T/m" --ids $IDS --gen 4 --workers 0 --preset max --mmap
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"; $MUT "$T/m" setval language_model.lm_head.weight 30000 inf
check in 1 "Inf in a mapped lm head (--mmap)" "language_model.lm_head.weight|element 30000" -- "$K3_BIN" "$T/m" --ids $IDS --gen 4 --workers 0 --preset max --mmap
# a non-finite value in an embedding row the prompt does not use changes nothing
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"; $MUT "$T/m" setval $P.embed_tokens.weight $((700*46)) nan
check in ok "NaN in an unused embedding row: same ids" -- "$K3_BIN" "$T/m" --ids $IDS --gen 4 --workers 0

# ---- 2. non-regular files in place of inputs: refused by name, never a hang
nonreg() { # LABEL FILE KIND WANT ARGS...
  local label=$1 f=$2 kind=$3 want=$4; shift 4
  rm -rf "$T/m"; cp -r "$MODEL" "$T/m"; rm -f "$T/m/$f"
  case $kind in fifo) mkfifo "$T/m/$f";; dir) mkdir "$T/m/$f";; dev) ln -s /dev/zero "$T/m/$f";; null) ln -s /dev/null "$T/m/$f";; esac
  check in 2 "$label" "$f" "$want" -- "$K3_BIN" "$T/m" "$@"
}
for kind in fifo dir dev; do
  nonreg "$kind as a shard"            $S2 $kind "not a regular file" --ids 1 --gen 1
  nonreg "$kind as config.json"        config.json $kind "not a regular file" --ids 1 --gen 1
  nonreg "$kind as the index"          model.safetensors.index.json $kind "not a regular file" --ids 1 --gen 1
  nonreg "$kind as tiktoken.model"     tiktoken.model $kind "not a regular file" --prompt hi --gen 1
  nonreg "$kind as tokenizer_config"   tokenizer_config.json $kind "not a regular file" --prompt hi --gen 1
done
nonreg "/dev/null as a shard" $S1 null "" --ids 1 --gen 1
mkfifo "$T/fifo"
check in 2 "FIFO as the model directory" "fifo|Not a directory" -- "$K3_BIN" "$T/fifo" --ids 1 --gen 1
check in 2 "directory as --prompt-file" "$T|directory" -- "$K3_BIN" "$MODEL" --prompt-file "$T" --gen 1

# ---- 8. terminal escapes in quoted file bytes come out as \xHH
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"
"$PYTHON" - "$T/m/model.safetensors.index.json" <<'EOF'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
d["weight_map"]["evil\u001b]0;pwned\u0007\u001b[31mred\u009b2J"] = "model-00001-of-00003.safetensors"
json.dump(d, open(p, "w"))
EOF
check in 2 "ESC/BEL/CSI in an index tensor name" 'evil\x1b]0;pwned\x07\x1b[31mred' -- "$K3_BIN" "$T/m" --ids 1 --gen 1
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"
printf 'QQ== 1\x1b[2J\x07\n' >"$T/m/tiktoken.model"
check in 2 "ESC in a tiktoken.model line" 'tiktoken.model:1|\x1b[2J\x07' -- "$K3_BIN" "$T/m" --prompt hi --gen 1
rm -rf "$T/m"; cp -r "$MODEL" "$T/m"
"$PYTHON" - "$T/m/$S2" <<'EOF'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
k = next(k for k in h if k != "__metadata__"); v = h.pop(k); v["dtype"] = "Q\u001b[5m\u0007"; h["x\u001bP\u0007" + k] = v
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
EOF
check in 2 "ESC in a shard header name and dtype" 'x\x1bP\x07' -- "$K3_BIN" "$T/m" --ids 1 --gen 1

# ---- 3-5. hostile and dying expert servers, full /dev/shm: the intact ids or a message, never
# a signal in the coordinator; no process or shared-memory object left behind.
shm_before=$(ls /dev/shm | grep -c '^k3\.')
fault() { # LABEL CODE WANT K3_FAULT [ARGS...]
  local label=$1 code=$2 want=$3 f=$4; shift 4
  check fault "$code" "$label" "$want" -- env K3_EXPERTD="$(dirname "$K3_BIN")/k3-expertd-faults" K3_FAULT="$f" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 "$@"
}
for at in 1 2 3 5 8; do
  fault "server scribbles its control page at request $at" ok "corrupted its ring control page" scribble:$at:0 --workers 2
done
fault "scribble on worker 1, two lives" ok "restarting (2/3)" scribble:2:1:2 --workers 2
for wk in 1 2; do for at in 1 3; do
  fault "3 servers: worker $wk scribbles at request $at" ok "corrupted its ring control page" scribble:$at:$wk --workers 3
done; done
fault "scribble with --gen 0 (prefill only)" 0 "corrupted" scribble:1:0 --workers 2 --gen 0
fault "scribble, one server owning every expert" ok "restarting (1/3)" scribble:2:0:1 --workers 1
fault "scribble with the whole prompt in one chunk" ok "corrupted" scribble:1:1 --workers 2 --chunk 1
fault "scribble in every life: restarts run out" 1 "giving up" scribble:1:0:9 --workers 1
for at in 1 4; do fault "semaphore word set to 2^32-1 at request $at" ok "restarting (1/3)" semjunk:$at:0 --workers 2; done
fault "semjunk in every life" 1 "giving up" semjunk:1:1:9 --workers 3
fault "killed before ready, first start" ok "did not report ready|restarting (1/3)" noready:0:0:1 --workers 2
fault "killed before ready, three starts" ok "restarting (3/3)" noready:0:1:3 --workers 2
fault "killed before ready in every life" 1 "giving up" noready:0:0:9 --workers 1
fault "killed before ready right after a restart" ok "restarting (2/3)" noready:0:0:2 --workers 1
fault "crash, then killed before ready" ok "restarting" crash:2:0:1 --workers 2
fault "never ready: --worker-timeout-ms bounds the wait" ok "within --worker-timeout-ms 700" hangready:0:0:1 --workers 2 --worker-timeout-ms 700
fault "never ready in any life" 1 "giving up" hangready:0:0:9 --workers 1 --worker-timeout-ms 300 --max-restarts 2
printf '#!/bin/sh\nexec sleep 600\n' >"$T/hang.sh"; chmod +x "$T/hang.sh"
start=$(date +%s)
check fault 1 "a hanging K3_EXPERTD replacement" "within --worker-timeout-ms 400|giving up" -- env K3_EXPERTD="$T/hang.sh" "$K3_BIN" "$MODEL" --ids $IDS --gen 1 --workers 1 --worker-timeout-ms 400 --max-restarts 1
[ $(( $(date +%s) - start )) -lt 30 ] || bad "a hanging K3_EXPERTD replacement was waited for $(( $(date +%s) - start )) s"
printf '#!/bin/sh\nexit 0\n' >"$T/quit.sh"; chmod +x "$T/quit.sh"
check fault 1 "a K3_EXPERTD replacement that exits at once" "did not report ready|giving up" -- env K3_EXPERTD="$T/quit.sh" "$K3_BIN" "$MODEL" --ids $IDS --gen 1 --workers 1
if unshare -m true 2>/dev/null; then
  for sz in 16k 200k; do
    check limit 1 "/dev/shm of $sz (full)" "/dev/shm|bytes" -- unshare -m sh -c "mount -t tmpfs -o size=$sz tmpfs /dev/shm && exec \"\$0\" \"\$@\"" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 2
  done
  check limit ok "/dev/shm of 2 MiB is enough" -- unshare -m sh -c "mount -t tmpfs -o size=2m tmpfs /dev/shm && exec \"\$0\" \"\$@\"" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 2
else echo "skip /dev/shm cases: no mount namespace here"; fi
sleep 0.5
shm_after=$(ls /dev/shm | grep -c '^k3\.')
if [ "$shm_after" -gt "$shm_before" ]; then n_leak=$((n_leak+1)); bad "shared-memory objects left behind: $(ls /dev/shm | grep '^k3\.')"; fi
left=$(leftovers)
if [ -n "$left" ]; then n_leak=$((n_leak+1)); bad "processes left behind: $left"; kill -9 $left 2>/dev/null; fi

# ---- 6. output paths checked before the model is loaded (exit 2, nothing on stdout); write
# errors after the run are exit 1 with a message, and the ids still reach stdout.
mkdir -p "$T/ro"; chmod 555 "$T/ro"
for flag in --json --dump-logits --dump-expert-trace; do
  check in 2 "$flag to a directory" "$flag|is a directory" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 $flag "$T"
  check in 2 "$flag into a missing directory" "$flag|$T/none" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 $flag "$T/none/x"
  check in 2 "$flag to an empty path" "$flag" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 $flag ""
  if [ "$(id -u)" != 0 ]; then check in 2 "$flag into a read-only directory" "$flag" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 $flag "$T/ro/x"; fi
  check in 1 "$flag to /dev/full: ids kept" "cannot write /dev/full" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 $flag /dev/full
done
check in 2 "--json to a directory with --plan-only" "--json" -- "$K3_BIN" "$MODEL" --plan-only --json "$T"
check in 1 "stdout on /dev/full" "stdout|No space left" -- sh -c 'exec "$0" "$@" >/dev/full' "$K3_BIN" "$MODEL" --ids $IDS --gen 4
check in 1 "stdout closed" "stdout is closed" -- sh -c 'exec "$0" "$@" >&-' "$K3_BIN" "$MODEL" --ids $IDS --gen 4
check in 1 "stdout closed, --json given" "stdout is closed" -- sh -c 'exec "$0" "$@" >&-' "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --json "$T/j.json"
check in 1 "prompt text to /dev/full" "stdout" -- sh -c 'exec "$0" "$@" >/dev/full' "$K3_BIN" "$MODEL" --prompt hello --gen 4
check in 1 "--plan-only to /dev/full" "stdout" -- sh -c 'exec "$0" "$@" >/dev/full' "$K3_BIN" "$MODEL" --plan-only
check in 1 "--encode to /dev/full" "stdout" -- sh -c 'exec "$0" "$@" >/dev/full' "$K3_BIN" --tok "$MODEL" --encode "$MODEL/config.json"
check in ok "--json and --dump-logits on good paths" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0 --json "$T/j.json" --dump-logits "$T/l.f32"
[ -s "$T/j.json" ] && [ -s "$T/l.f32" ] || bad "--json / --dump-logits files not written"

# ---- 7. resource limits
# limited LIMIT CMD...: runs CMD under `ulimit LIMIT`, its stdout and stderr passed through pipes
# (a file-size limit applies to the test's own capture files too)
cat >"$T/limited.sh" <<'EOF'
#!/usr/bin/env bash
set -o pipefail
lim=$1; shift
{ { ulimit $lim || exit 99; exec "$@"; } 2>&1 1>&3 3>&- | cat >&2; } 3>&1 | cat
EOF
chmod +x "$T/limited.sh"
check limit 2 "--workers beyond the experts' spread" "--workers 40|own no expert" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 40
check limit 2 "--workers 256" "--workers 256" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 256
check limit ok "--workers 16 (each owns something)" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 16
for mb in 0.001 0.01; do
  check limit 2 "--expert-cache-mb $mb (below one expert)" "--expert-cache-mb|below one expert" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --expert-cache-mb $mb
  check limit 2 "--expert-cache-mb $mb in-process" "below one expert" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --expert-cache-mb $mb --workers 0
done
check limit ok "--expert-cache-mb of one expert" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --expert-cache-mb 0.012 --workers 2
for nf in 101 64 32 20; do
  check limit ok "ulimit -n $nf with expert servers" -- sh -c "ulimit -n $nf && exec \"\$0\" \"\$@\"" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 2
done
check limit ok "ulimit -n 20, three servers" -- sh -c 'ulimit -n 20 && exec "$0" "$@"' "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 3
check limit 1 "ulimit -f 1 with servers (ring)" "ulimit -f" -- "$T/limited.sh" "-f 1" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 2
check limit 1 "ulimit -f 1, --dump-logits: ids kept" "File too large" -- "$T/limited.sh" "-f 1" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0 --dump-logits "$T/big.f32"
check limit 1 "ulimit -f 0, --json: ids kept" "$T/j0.json" -- "$T/limited.sh" "-f 0" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0 --json "$T/j0.json"
check limit 1 "ulimit -f 0, --dump-expert-trace: ids kept" "$T/tr.txt" -- "$T/limited.sh" "-f 0" "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0 --dump-expert-trace "$T/tr.txt"
check limit any "ulimit -v 64 MB" "" -- sh -c 'ulimit -v 65536 && exec "$0" "$@"' "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0
check limit ok "ulimit -s 256 KB" -- sh -c 'ulimit -s 256 && exec "$0" "$@"' "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --workers 0

# ---- 9. unbounded input: --max-context (default: what the plan was sized for) everywhere
"$PYTHON" -c "import sys; sys.stdout.write('hello\\n' + 'ab ' * 350000 + '\\n' + 'hi again\\n')" >"$T/long.txt"
check in 0 "a 1 MB line in --chat is refused, the chat goes on" "context full|limit 4096|turn 2" -- sh -c 'exec "$0" "$@" <"'"$T"'/long.txt"' "$K3_BIN" "$MODEL" --chat --max-tokens 4 --workers 0
check in 0 "a 1 MB line with --max-context 100" "context full|limit 100" -- sh -c 'exec "$0" "$@" <"'"$T"'/long.txt"' "$K3_BIN" "$MODEL" --chat --max-tokens 4 --max-context 100 --workers 2
head -c 3000000 /dev/urandom | tr -d '\n' >"$T/noise.txt"; echo >>"$T/noise.txt"
check in 0 "3 MB of random bytes on one chat line" "" -- sh -c 'exec "$0" "$@" <"'"$T"'/noise.txt"' "$K3_BIN" "$MODEL" --chat --max-tokens 4 --workers 0
check in 2 "--ids longer than --max-context" "--max-context 8" -- "$K3_BIN" "$MODEL" --ids 1,2,3,4,5,6,7,8,9 --gen 1 --max-context 8
check in 2 "prompt + --gen past --max-context" "--max-context 8" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 10 --max-context 8
check in ok "prompt + --gen exactly --max-context" -- "$K3_BIN" "$MODEL" --ids $IDS --gen 4 --max-context 7 --workers 0
"$PYTHON" -c "print('word ' * 200000)" >"$T/bigprompt.txt"
check in 2 "a 1 MB --prompt-file with --max-context 64" "--max-context 64" -- "$K3_BIN" "$MODEL" --prompt-file "$T/bigprompt.txt" --gen 1 --max-context 64

echo "t_15: bad inputs $n_in, faults injected $n_fault, resource limits $n_limit;" \
     "wrong tokens $n_wrong, signals we did not send $n_sig, hangs $n_hang, leaks $n_leak; failures $fail"
[ "$fail" -eq 0 ]
