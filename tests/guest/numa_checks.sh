# numa_checks.sh - runs as the payload of a NUMA test guest (tests/guest/mkinitramfs.sh,
# started by tests/t_60_numa_guests.sh). busybox sh. The kernel command line says
# k3topo=NAME; /k3/ids.txt is the prompt, /k3/ref.txt and /k3/ref_mn.txt the host's
# `--workers 0` ids on /k3/m13 and /k3/mn (the "numa" preset of scripts/gen_model.py: trunk
# matrices of many pages, so where each node's rows live shows in numa_maps).
# Every check prints "GUEST PASS: ..." or "GUEST FAIL: ..."; the exit status is the
# number of failures. Placement is read from /proc: Cpus_allowed_list in
# /proc/PID/status and /proc/PID/task/TID/status, pages per node in /proc/PID/numa_maps.
K3=/k3/bin/k3
M=/k3/m13
IDS=$(cat /k3/ids.txt)
REF=$(cat /k3/ref.txt)
REF_MN=$(cat /k3/ref_mn.txt)
GEN=6
topo=$(sed -n 's/.*k3topo=\([^ ]*\).*/\1/p' /proc/cmdline)
fails=0
# the operator's doctor sees the guest's topology
doctor_check() {
  $K3 --doctor > /tmp/doc.out 2>&1; _rc=$?
  [ $_rc = 0 ] && grep -q "topology: $n_nodes node" /tmp/doc.out; check $? "--doctor prints the topology it sees ($n_nodes node(s))"
  grep "topology:" /tmp/doc.out | sed 's/^/  doctor| /'
}
pass() { echo "GUEST PASS: $topo: $*"; }
fail() { echo "GUEST FAIL: $topo: $*"; fails=$((fails + 1)); }
check() { if [ "$1" = 0 ]; then pass "$2"; else fail "$2"; fi; }

nodes=$(ls -d /sys/devices/system/node/node[0-9]* | sed 's/.*node//' | sort -n)
n_nodes=$(echo $nodes | wc -w)
last_node=$(echo $nodes | tr ' ' '\n' | tail -n 1)
node_cpus() { cat /sys/devices/system/node/node$1/cpulist; }
cpus_allowed() { sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$1"; }
state_of() { sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$1/status 2>/dev/null; }
# anonymous pages of PID per node: "node pages" lines
anon_pages() {
  awk '/anon=/ { for (i = 1; i <= NF; i++) if ($i ~ /^N[0-9]+=/) { split(substr($i, 2), a, "="); p[a[1]] += a[2] } }
       END { for (n in p) print n, p[n] }' /proc/$1/numa_maps
}
pages_on() { anon_pages "$1" | awk -v n="$2" '$1 == n { s += $2 } END { print s + 0 }'; }
pages_all() { anon_pages "$1" | awk '{ s += $2 } END { print s + 0 }'; }
# the pid of a stopped k3-expertd other than $1 (waits up to ~10 min while $2 runs)
wait_stopped() {
  for i in $(seq 1 6000); do
    for s in /proc/[0-9]*/status; do
      grep -q '^Name:[[:space:]]*k3-expertd' "$s" 2>/dev/null || continue
      p=${s#/proc/}; p=${p%/status}
      [ "$p" = "$1" ] && continue
      [ "$(state_of $p)" = T ] && { echo "$p"; return 0; }
    done
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
expand() { echo "$1" | tr ',' '\n' | awk -F- 'NF == 2 { for (i = $1; i <= $2; i++) print i; next } NF == 1 { print $1 }'; }
subset() { # every cpu of list $1 is in list $2
  _in=" $(expand "$2" | tr '\n' ' ') "
  for _c in $(expand "$1"); do case "$_in" in *" $_c "*) ;; *) return 1 ;; esac; done
  return 0
}
# pages of the VMAs whose policy is prefer:N (the trunk rows numa_place put on node N): "N on all"
preferred_pages() {
  awk -v n="$2" '$2 == "prefer:" n && /anon=/ { for (i = 1; i <= NF; i++) { if ($i ~ /^anon=/) a += substr($i, 6); if ($i ~ ("^N" n "=")) o += substr($i, length(n) + 3) } }
       END { print o + 0, a + 0 }' /proc/$1/numa_maps
}
worker_line() { grep "^k3: worker $2 pid" "$1"; }          # stderr file, worker index
worker_pid() { worker_line "$1" "$2" | sed 's/^k3: worker [0-9]* pid \([0-9]*\),.*/\1/'; }
worker_node() { worker_line "$1" "$2" | sed -n 's/.*, node \([0-9]*\) cpus.*/\1/p'; }
worker_cpus() { worker_line "$1" "$2" | sed -n 's/.*, node [0-9]* cpus \([0-9,-]*\),.*/\1/p'; }

echo "guest $topo: uptime $(cut -d" " -f1 /proc/uptime) s, $n_nodes node(s): $(for n in $nodes; do printf 'node%s=%s ' $n $(node_cpus $n); done)"

if [ "$n_nodes" = 1 ]; then
  # control: one node, one unbound server, identical ids
  $K3 $M --ids "$IDS" --gen $GEN --json /tmp/c.json > /tmp/c.out 2> /tmp/c.err
  rc=$?
  grep '^k3: \(topology\|  node\|placement\|worker\)' /tmp/c.err | sed 's/^/  report| /'
  (exit $rc)
  check $? "1-node run exits 0"
  [ "$(cat /tmp/c.out)" = "$REF" ]; check $? "1-node ids identical to the host's --workers 0 ($(cat /tmp/c.out))"
  [ "$(grep -c '^k3: worker [0-9]* pid' /tmp/c.err)" = 1 ]; check $? "1-node: one expert server"
  grep -q '^k3: placement: unbound' /tmp/c.err; check $? "1-node: placement unbound"
  grep -q '"placement"' /tmp/c.json && grep -q '"topology"' /tmp/c.json; check $? "1-node: --json has topology and placement"
  doctor_check
  echo "GUEST DONE"
  exit $fails
fi

# ---- one run on /k3/mn with WPN servers per node: the last server is stopped at its first
# request, everything is inspected, the server is SIGKILLed, its next life (stopped again)
# must be on the same node; then the run goes on and its ids must be the host's. The fault
# comes from the test build of the server (K3_EXPERTD=/k3/bin/k3-expertd-faults).
case "$topo" in 2s2n) WPN=2 ;; *) WPN=1 ;; esac
n_srv=$((WPN * n_nodes)); last=$((n_srv - 1))
K3_EXPERTD=/k3/bin/k3-expertd-faults K3_FAULT=stop:1:$last:2 $K3 /k3/mn --ids "$IDS" --gen $GEN --workers-per-node $WPN --worker-timeout-ms 600000 \
  --json /tmp/r.json > /tmp/r.out 2> /tmp/r.err &
K=$!
sp=$(wait_stopped 0 $K)
if [ -z "$sp" ]; then
  fail "the last server never stopped (fault not reached)"; cat /tmp/r.err
else
  [ "$(grep -c '^k3: worker [0-9]* pid' /tmp/r.err)" = "$n_srv" ]; check $? "--workers-per-node $WPN: $n_srv servers"
  for n in $nodes; do
    c=0
    for i in $(seq 0 $last); do
      [ "$(worker_node /tmp/r.err $i)" = "$n" ] || continue
      p=$(worker_pid /tmp/r.err $i); got=$(cpus_allowed /proc/$p/status)
      if [ "$got" != "$(worker_cpus /tmp/r.err $i)" ] || ! subset "$got" "$(node_cpus $n)"; then
        fail "server $i (pid $p): Cpus_allowed_list $got, placement $(worker_cpus /tmp/r.err $i), node $n cpus $(node_cpus $n)"
        continue
      fi
      [ "$WPN" = 1 ] && { [ "$got" = "$(node_cpus $n)" ]; check $? "server $i (pid $p) runs on all of node $n's cpus ($got)"; }
      on=$(pages_on $p $n); all=$(pages_all $p)
      [ $((on * 2)) -gt "$all" ]; check $? "server $i (pid $p, cpus $got): most anonymous pages on node $n ($on of $all)"
      c=$((c + 1))
    done
    [ $c = "$WPN" ]; check $? "$WPN server(s) bound inside node $n"
  done
  [ "$(worker_pid /tmp/r.err $last)" = "$sp" ]; check $? "the stopped server is the last one (pid $sp)"
  # the coordinator: threads on every node's cpus; its anonymous pages spread; trunk rows where placed
  all=$(pages_all $K)
  for n in $nodes; do
    found=0
    for t in /proc/$K/task/*/status; do [ "$(cpus_allowed $t)" = "$(node_cpus $n)" ] && found=1; done
    [ $found = 1 ]; check $? "coordinator has threads bound to node $n's cpus ($(node_cpus $n))"
    on=$(pages_on $K $n)
    [ $((on * 2 * n_nodes)) -ge "$all" ]; check $? "coordinator anonymous pages on node $n: $on of $all (at least half of a fair share $((all / n_nodes)))"
    set -- $(preferred_pages $K $n)
    [ "$2" -gt 0 ] && [ $(($1 * 10)) -ge $(($2 * 9)) ]; check $? "trunk rows preferred on node $n: $1 of $2 pages there"
  done
  grep -q "^k3: topology: $n_nodes nodes" /tmp/r.err; check $? "start-up report names $n_nodes nodes"
  [ "$(grep -c '^k3: coordinator node [0-9]*: threads' /tmp/r.err)" = "$n_nodes" ]; check $? "start-up report: a coordinator group per node"
  cpus0=$(cpus_allowed /proc/$sp/status)
  kill -KILL $sp
  np=$(wait_stopped $sp $K)
  if [ -z "$np" ]; then
    fail "the SIGKILLed server did not come back"
  else
    [ "$(cpus_allowed /proc/$np/status)" = "$cpus0" ] && subset "$cpus0" "$(node_cpus $last_node)"
    check $? "restarted server (pid $np) on the last node's cpus again: $(cpus_allowed /proc/$np/status)"
    on=$(pages_on $np $last_node); all=$(pages_all $np)
    [ $((on * 2)) -gt "$all" ]; check $? "restarted server: most anonymous pages on node $last_node ($on of $all)"
    kill -CONT $np
  fi
fi
wait $K
check $? "the run exits 0"
[ "$(cat /tmp/r.out)" = "$REF_MN" ]; check $? "ids identical to the host's --workers 0 ($(cat /tmp/r.out))"
grep -q "worker $last failed (killed by signal 9)" /tmp/r.err; check $? "the coordinator saw the SIGKILL and restarted"
grep -q '"placement"' /tmp/r.json && grep -q '"topology"' /tmp/r.json && grep -q '"restarts":1' /tmp/r.json
check $? "--json has topology, placement and the restart"
grep '^k3: \(topology\|  node\|placement\|coordinator node\|worker\)' /tmp/r.err | sed 's/^/  report| /'
doctor_check
echo "GUEST DONE"
exit $fails
