#!/usr/bin/env bash
# t_90_mpi.sh - expert ranks over Open MPI (--mpi): the ids and logits of an in-process run
# with 2, 3 and 5 ranks over TCP and over shared memory; a rank whose checkpoint differs is
# refused naming its host; a rank that stops answering is named (rank and host), the run
# fails without a wrong token and no rank is left behind; expert ranks with local servers
# behind them (--mpi --workers N), mixed with TCP and shared memory, a local restart, a slow
# request kept alive by heartbeats under a short timeout; --json "mpi" counters
# (per rank and per decode token) present and consistent with the message format; rank 0's
# memory plan (no in-process expert cache; --plan-only --mpi prints the same); a
# SIGKILLed mpirun leaves no rank and no local server; two hosts in network namespaces
# joined by a veth pair (when `ip netns` works here, else SKIP for that part).
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
T="${K3_TEST_TMP:-/tmp}/t90.$$"
mkdir -p "$T"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
if ! command -v mpirun > /dev/null; then echo "SKIP: mpirun not installed"; exit 0; fi
MPI="mpirun --allow-run-as-root --oversubscribe"
K3ABS=$(readlink -f "$K3")
M=tests/models/m13
P="5,17,300,42,7,99,256,1"
cleanup() {
  rm -rf "$T"
  ip netns del k3hA 2>/dev/null; ip netns del k3hB 2>/dev/null
  sed -i '/ k3hostA$/d; / k3hostB$/d' /etc/hosts 2>/dev/null
}
trap cleanup EXIT

"$K3" $M --ids $P --gen 10 --workers 0 --dump-logits "$T/ref.f32" > "$T/ref.ids" 2>/dev/null || bad "in-process run"
# --json "mpi": every field there; per decode token (batch 1, no speculation) one exchange per
# MoE layer, and the bytes exactly those of the message format (experts_mpi.h)
cat > "$T/check.py" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); R = int(sys.argv[2]); S = int(sys.argv[3])
c = json.load(open(sys.argv[4])); c = c.get("text_config", c)
moe = c["num_hidden_layers"] - c["first_k_dense_replace"]; L = c["routed_expert_hidden_size"]; K = c["num_experts_per_token"]
m = j["mpi"]; d = m["decode_tokens"]
assert m["expert_ranks"] == R and len(m["ranks"]) == R, "rank count"
assert d == len(j["generated_ids"]) - 1, "decode tokens"
assert abs(m["decode_exchanges_per_token"] - moe) < 1e-9, "exchanges per token %s, MoE layers %d" % (m["decode_exchanges_per_token"], moe)
msg = m["decode_messages_per_token"]
assert 2 * moe <= msg <= 2 * moe * R, "messages per token %s" % msg
want = msg / 2 * (16 + 4 * L + 8) + moe * K * (8 + 4 * L)
assert abs(m["decode_bytes_per_token"] - want) < 1e-6 * want, "bytes per token %s, format says %s" % (m["decode_bytes_per_token"], want)
assert abs(sum(r["decode_bytes_per_token"] for r in m["ranks"]) - m["decode_bytes_per_token"]) < 1e-6 * want
assert abs(sum(r["decode_messages_per_token"] for r in m["ranks"]) - msg) < 1e-9
assert 0 <= m["overhead_s"] <= m["exchange_s"] and m["exchanges"] >= moe * d
for i, r in enumerate(m["ranks"]):
    assert r["rank"] == i + 1 and r["host"] and r["local_servers"] == S, "rank %d" % (i + 1)
    assert r["requests"] > 0 and r["bytes_sent"] > 0 and r["bytes_received"] > 0, "rank %d counters" % (i + 1)
    assert 0 <= r["compute_s"] <= r["wait_s"] + 1e-3, "rank %d times" % (i + 1)
PY
chk() { /usr/bin/python3 "$T/check.py" "$T/m.json" "$1" "$2" $M/config.json || bad "--json mpi counters ($3)"; }
for btl in "self,tcp" "self,vader"; do
  for np in 2 3 5; do
    timeout 300 $MPI -np $np --mca btl $btl "$K3" $M --ids $P --gen 10 --mpi --threads 1 --dump-logits "$T/m.f32" \
      --json "$T/m.json" > "$T/m.ids" 2> "$T/m.err" || { tail -5 "$T/m.err"; bad "mpirun -np $np --mca btl $btl failed"; continue; }
    cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ with $np ranks over $btl"
    cmp -s "$T/m.f32" "$T/ref.f32" || bad "logits differ with $np ranks over $btl"
    grep -q "$((np - 1)) expert ranks over MPI" "$T/m.err" || bad "no rank report with $np ranks"
    chk $((np - 1)) 0 "$np ranks over $btl"
  done
done

# local servers behind every expert rank (--workers N under --mpi): same ids and logits
for lay in "2 self,vader 3" "3 self,tcp 2" "5 self,vader 1"; do
  set -- $lay
  timeout 300 $MPI -np $1 --mca btl $2 "$K3" $M --ids $P --gen 10 --mpi --workers $3 --threads 1 --dump-logits "$T/m.f32" \
    --json "$T/m.json" > "$T/m.ids" 2> "$T/m.err" || { tail -5 "$T/m.err"; bad "mpirun -np $1 --workers $3 failed"; continue; }
  cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ with $1 ranks x $3 local servers over $2"
  cmp -s "$T/m.f32" "$T/ref.f32" || bad "logits differ with $1 ranks x $3 local servers over $2"
  grep -q "expert ranks over MPI: 1@[^ ]*($3 local servers)" "$T/m.err" || bad "no local-server report ($1 ranks x $3)"
  chk $(($1 - 1)) $3 "$1 ranks x $3 local servers"
done
# a local server that crashes behind a rank is restarted there; the ids do not change
# (faults come from the test build of the server, as in t_40)
K3_EXPERTD="$(dirname "$K3ABS")/k3-expertd-faults" K3_FAULT=crash:5:1 timeout 300 $MPI -np 3 -x K3_FAULT -x K3_EXPERTD --mca btl self,vader "$K3" $M --ids $P --gen 10 --mpi --workers 2 \
  --threads 1 > "$T/m.ids" 2> "$T/m.err" || { tail -5 "$T/m.err"; bad "a crashed local server failed the run"; }
cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ after a local server restart"
grep -q "worker 1 failed (killed by signal 9); restarting" "$T/m.err" || bad "no local restart reported"
# rank 0's memory plan: no in-process expert cache (the experts are on the expert ranks), its MPI
# buffers per expert rank; `--plan-only --mpi` under the same mpirun prints that plan once (rank 0);
# the ids do not change
plan_of() { awk '/^memory plan/{p=1} p{print} p&&/^  total/{exit}' "$1"; }
PA="--mem-gb 0.05 --max-context 40"
timeout 300 $MPI -np 3 --mca btl self,vader "$K3" $M --ids $P --gen 10 --mpi --threads 1 $PA > "$T/m.ids" 2> "$T/m.err" \
  || { tail -5 "$T/m.err"; bad "mpirun --mem-gb run failed"; }
cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ with a --mem-gb budget under --mpi"
plan_of "$T/m.err" > "$T/plan.run"
grep -q "^memory plan .*MPI rank 0: the experts on 2 expert ranks" "$T/plan.run" || { cat "$T/plan.run"; bad "rank 0's plan does not say where the experts are"; }
grep -q "^  expert cache  *none in this process (.* on the 2 expert ranks)" "$T/plan.run" || bad "rank 0's plan has an in-process expert cache"
grep -q "^  MPI buffers  *[0-9.]* MiB  (2 x " "$T/plan.run" || bad "rank 0's plan has no MPI buffers line"
timeout 120 $MPI -np 3 "$K3" $M --plan-only --mpi --threads 1 $PA > "$T/only.out" 2> "$T/only.err" || { cat "$T/only.err"; bad "--plan-only --mpi under mpirun failed"; }
[ "$(grep -c '^memory plan' "$T/only.out")" = 1 ] || bad "--plan-only --mpi: not exactly one plan printed"
plan_of "$T/only.out" | diff - "$T/plan.run" || bad "--plan-only --mpi and rank 0 of the run print different plans"
"$K3" $M --plan-only --mpi $PA | grep -q "experts on 1 expert rank)" || bad "--plan-only --mpi without mpirun: not one expert rank"

# a request that takes 3 s (a local server pausing, with heartbeats) under a 1 s rank timeout:
# the rank's heartbeats keep rank 0 waiting; the ids do not change
K3_EXPERTD="$(dirname "$K3ABS")/k3-expertd-faults" K3_FAULT=pause:3:0:9 timeout 120 $MPI -np 2 -x K3_FAULT -x K3_EXPERTD \
  --mca btl self,tcp "$K3" $M --ids $P --gen 10 --mpi --workers 1 --worker-timeout-ms 1000 --json "$T/m.json" > "$T/m.ids" \
  2> "$T/m.err" || { tail -5 "$T/m.err"; bad "a slow rank with heartbeats was taken for a lost one"; }
cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ after a slow request"
/usr/bin/python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["mpi"]["ranks"][0]["heartbeats"] < 5)' "$T/m.json" \
  || bad "no heartbeats counted during a 3 s request"
# too many local servers for a rank's experts: refused before anything runs
timeout 120 $MPI -np 3 --mca btl self,tcp "$K3" $M --ids $P --gen 2 --mpi --workers 20 > "$T/m.ids" 2> "$T/m.err"
[ $? -ne 0 ] || bad "20 local servers per rank were accepted (some own no expert)"
grep -q "behind expert rank . would own no expert" "$T/m.err" || { tail -3 "$T/m.err"; bad "the empty local server is not explained"; }

# a host whose checkpoint differs (MPMD: rank 1 is given a changed copy at its "same" path)
cp -r $M "$T/other"
sed -i 's/"rms_norm_eps": *[0-9.e-]*/"rms_norm_eps": 1e-5/' "$T/other/config.json"
python3 - "$T/other/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["k3_test_marker"] = 1; json.dump(c, open(p, "w"))
PY
timeout 120 $MPI --mca btl self,tcp -np 1 "$K3" $M --ids $P --gen 4 --mpi : -np 1 "$K3" "$T/other" --ids $P --gen 4 --mpi \
  > "$T/d.ids" 2> "$T/d.err"
[ $? -ne 0 ] || bad "a rank with another checkpoint was accepted"
grep -q "is not this host's: config.json differs" "$T/d.err" || { cat "$T/d.err"; bad "the differing host is not named"; }
[ -s "$T/d.ids" ] && bad "ids printed although a rank was refused"

# a rank that stops answering (SIGSTOP): named, exit non-zero, no wrong token, no orphans;
# --resume from the run's checkpoint then gives the ids of an unbroken run
( timeout 120 $MPI --mca btl self,tcp -np 3 "$K3" $M --ids $P --gen 3000 --max-context 3010 --mpi --threads 1 \
    --worker-timeout-ms 1500 --checkpoint "$T/ck" --checkpoint-every 16 > "$T/h.ids" 2> "$T/h.err"; echo $? > "$T/h.rc" ) &
ranks() { for p in $(pgrep -f -- "--gen 3000 --max-context 3010 --mpi"); do
  [ "$(readlink /proc/$p/exe 2>/dev/null)" = "$K3ABS" ] && echo $p; done | sort -n; }
for i in $(seq 1 150); do
  [ "$(ranks | grep -c .)" -ge 3 ] && [ -f "$T/ck" ] && break
  sleep 0.2
done
sleep 1
victim=$(ranks | tail -1)
[ -n "$victim" ] && kill -STOP "$victim"
wait
rc=$(cat "$T/h.rc" 2>/dev/null || echo 0)
[ "$rc" -ne 0 ] || bad "a silent rank did not fail the run"
grep -q "did not answer within 1500 ms" "$T/h.err" || { tail -5 "$T/h.err"; bad "the silent rank is not named"; }
sleep 1
left=$(ranks | grep -c .)
[ "$left" -eq 0 ] || { bad "$left rank(s) left behind"; for p in $(ranks); do kill -9 $p; done; }
# what was printed is a prefix of the right answer
"$K3" $M --ids $P --gen 3000 --max-context 3010 --workers 0 > "$T/full.ids" 2>/dev/null
got=$(cat "$T/h.ids" | tr -d '\n')
case "$(cat "$T/full.ids")" in "$got"*) ;; *) bad "ids printed before the failure are not a prefix of the right ones";; esac

# a SIGKILLed mpirun (nothing can forward a signal): no rank and no local server is left
EXPD=$(dirname "$K3ABS")/k3-expertd
mine() { for p in $(pgrep -f -- "$1"); do [ "$(readlink /proc/$p/exe 2>/dev/null)" = "$2" ] && echo $p; done; }
$MPI -np 3 --mca btl self,tcp "$K3" $M --ids $P --gen 3000 --max-context 3011 --mpi --workers 2 --threads 1 \
  > /dev/null 2> "$T/k.err" &
mp=$!
for i in $(seq 1 150); do [ "$(mine k3-expertd "$EXPD" | grep -c .)" -ge 4 ] && break; sleep 0.2; done
[ "$(mine "max-context 3011" "$K3ABS" | grep -c .)" -eq 3 ] || bad "the ranks to be orphaned did not start"
kill -9 $mp; wait $mp 2>/dev/null
for i in $(seq 1 50); do [ -z "$(mine "max-context 3011" "$K3ABS")$(mine k3-expertd "$EXPD")" ] && break; sleep 0.2; done
left="$(mine "max-context 3011" "$K3ABS") $(mine k3-expertd "$EXPD")"
[ -z "${left// /}" ] || { bad "after kill -9 mpirun, left behind: $left"; kill -9 $left 2>/dev/null; }

# two hosts: network namespaces joined by a veth pair, mpirun entering each namespace
if ip netns add k3hA 2>/dev/null && ip netns add k3hB 2>/dev/null; then
  ip link add k3vA type veth peer name k3vB && ip link set k3vA netns k3hA && ip link set k3vB netns k3hB &&
  ip -n k3hA addr add 10.99.0.1/24 dev k3vA && ip -n k3hB addr add 10.99.0.2/24 dev k3vB &&
  ip -n k3hA link set lo up && ip -n k3hB link set lo up && ip -n k3hA link set k3vA up && ip -n k3hB link set k3vB up
  printf '10.99.0.1 k3hostA\n10.99.0.2 k3hostB\n' >> /etc/hosts
  cat > "$T/nsrsh" <<'SH'
#!/bin/sh
h=$1; shift
case $h in k3hostA) ns=k3hA ;; k3hostB) ns=k3hB ;; *) exit 1 ;; esac
exec ip netns exec $ns sh -c "$*"
SH
  chmod +x "$T/nsrsh"
  printf 'k3hostA slots=1\nk3hostB slots=2\n' > "$T/hosts"
  ip netns exec k3hA timeout 300 mpirun --allow-run-as-root --hostfile "$T/hosts" -np 3 --mca plm_rsh_agent "$T/nsrsh" \
    --mca btl self,tcp --mca btl_tcp_if_include 10.99.0.0/24 --mca oob_tcp_if_include 10.99.0.0/24 \
    "$K3ABS" "$(readlink -f $M)" --ids $P --gen 10 --mpi --threads 1 --dump-logits "$T/n.f32" > "$T/n.ids" 2> "$T/n.err" \
    || { tail -5 "$T/n.err"; bad "two-host run failed"; }
  cmp -s "$T/n.ids" "$T/ref.ids" || bad "ids differ across two hosts"
  cmp -s "$T/n.f32" "$T/ref.f32" || bad "logits differ across two hosts"
  rx=$(ip -n k3hB -s link show k3vB | awk '/RX:/{getline; print $1}')
  [ "${rx:-0}" -gt 10000 ] || bad "no traffic crossed the veth pair ($rx bytes)"
else
  echo "SKIP: two hosts (ip netns add refused here)"
fi
[ $fail -eq 0 ] && echo "t_90_mpi: ok"
exit $fail
