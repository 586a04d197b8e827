#!/usr/bin/env bash
# t_90_mpi.sh - expert ranks over Open MPI (--mpi): the ids and logits of an in-process run
# with 2, 3 and 5 ranks over TCP and over shared memory; a rank whose checkpoint differs is
# refused naming its host; a rank that stops answering is named (rank and host), the run
# fails without a wrong token and no rank is left behind; two hosts in network namespaces
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
for btl in "self,tcp" "self,vader"; do
  for np in 2 3 5; do
    timeout 300 $MPI -np $np --mca btl $btl "$K3" $M --ids $P --gen 10 --mpi --threads 1 --dump-logits "$T/m.f32" \
      --json "$T/m.json" > "$T/m.ids" 2> "$T/m.err" || { tail -5 "$T/m.err"; bad "mpirun -np $np --mca btl $btl failed"; continue; }
    cmp -s "$T/m.ids" "$T/ref.ids" || bad "ids differ with $np ranks over $btl"
    cmp -s "$T/m.f32" "$T/ref.f32" || bad "logits differ with $np ranks over $btl"
    grep -q "$((np - 1)) expert ranks over MPI" "$T/m.err" || bad "no rank report with $np ranks"
  done
done

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
left=$(pgrep -f "k3 $M --ids $P --gen 400" | wc -l)
[ "$left" -eq 0 ] || { bad "$left rank(s) left behind"; pkill -9 -f "k3 $M --ids $P --gen 400"; }
# what was printed is a prefix of the right answer
"$K3" $M --ids $P --gen 3000 --max-context 3010 --workers 0 > "$T/full.ids" 2>/dev/null
got=$(cat "$T/h.ids" | tr -d '\n')
case "$(cat "$T/full.ids")" in "$got"*) ;; *) bad "ids printed before the failure are not a prefix of the right ones";; esac

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
