#!/usr/bin/env bash
# Expert cache policy (issue 4 item 4). On the committed trace
# tests/data/expert_trace_m13.txt (bin/k3 tests/models/m13, 240 generated tokens):
#  1. scripts/sim_expert_cache.py sanity: 0 <= every policy <= Belady (MIN) at every
#     size; LRU and MIN monotone in size; a cache that holds all of a worker's
#     experts misses only the first use of each (every policy); MIN beats LRU
#     somewhere; lookups do not depend on the size;
#  2. the C policies (bin/test_expert_cache --replay, real caches on m13's experts)
#     give exactly the simulator's hit counts;
#  3. bin/k3 with 2 expert servers (--read-threads 0) and a 0.05 MB cache gives the ids of --workers 0,
#     and the servers' hits are the simulator's for that run's own trace (default
#     policy; every policy once bin/k3 takes --expert-cache-policy).
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/cache_policy"
mkdir -p "$T"
fail() { echo "FAIL: $*"; exit 1; }
SIM=scripts/sim_expert_cache.py
TR=tests/data/expert_trace_m13.txt
TB="$(dirname "$K3")/test_expert_cache"
[ -x "$TB" ] || TB=bin/test_expert_cache
[ -f "$TR" ] || fail "missing $TR"

# 1. simulator sanity
SIZES=1,2,4,8,12,19,29,40,48,72,96,192
"$PY" "$SIM" "$TR" --workers 1,2 --sizes $SIZES --json "$T/sim.json" > "$T/sim.txt" || fail "simulator failed"
cat "$T/sim.txt"
"$PY" - "$T/sim.json" "$TR" <<'EOF' || fail "simulator sanity"
import json, sys
d = json.load(open(sys.argv[1]))
# first uses per worker, straight from the trace
E, first = d["experts"], {}
for line in open(sys.argv[2]):
    if line.startswith("#") or not line.strip():
        continue
    v = [int(x) for x in line.split()]
    for e in v[2:]:
        first[(v[1], e)] = 1
bad = []
by_w = {}
for r in d["runs"]:
    by_w.setdefault(r["workers"], []).append(r)
    h = r["hits"]
    for p, x in h.items():
        if not 0 <= x <= h["min"]:
            bad.append("W=%d slots=%d: %s has %d hits, MIN %d" % (r["workers"], r["slots"], p, x, h["min"]))
        if not 0.0 <= r["hit_rate"][p] <= 1.0:
            bad.append("hit rate out of range")
    owned = -(-d["total_experts"] // r["workers"])
    if r["slots"] >= owned:
        for p, x in h.items():
            if x != r["lookups"] - len(first):
                bad.append("W=%d slots=%d >= owned: %s has %d hits, expected lookups - first uses = %d"
                           % (r["workers"], r["slots"], p, x, r["lookups"] - len(first)))
for W, rs in by_w.items():
    rs.sort(key=lambda r: r["slots"])
    if len({r["lookups"] for r in rs}) != 1:
        bad.append("W=%d: lookups depend on the size" % W)
    for p in ("lru", "min"):
        for a, b in zip(rs, rs[1:]):
            if b["hits"][p] < a["hits"][p]:
                bad.append("W=%d %s not monotone: %d slots %d hits, %d slots %d hits" % (W, p, a["slots"], a["hits"][p], b["slots"], b["hits"][p]))
    if not any(r["hits"]["min"] > r["hits"]["lru"] for r in rs):
        bad.append("W=%d: MIN never beats LRU (degenerate replay?)" % W)
    if not any(r["hits"]["phit"] > r["hits"]["lru"] for r in rs):
        bad.append("W=%d: phit never beats LRU" % W)
print("\n".join(bad) if bad else "simulator sanity: ok (%d runs)" % len(d["runs"]))
sys.exit(1 if bad else 0)
EOF

# 2. C policies == simulator
[ -x "$TB" ] || fail "missing $TB (make)"
for W in 1 2; do
  for S in 4 19 40; do
    for P in lru lfu phit; do
      got=$(OMP_NUM_THREADS=1 "$TB" --replay "$TR" --model tests/models/m13 --workers $W --slots $S --policy $P) || fail "replay W=$W S=$S $P"
      want=$("$PY" -c "
import json, sys
for r in json.load(open('$T/sim.json'))['runs']:
    if r['workers'] == $W and r['slots'] == $S:
        print('hits %d misses %d' % (r['hits']['$P'], r['lookups'] - r['hits']['$P']))" )
      [ "$got" = "$want" ] || fail "C cache W=$W slots=$S $P: '$got', simulator '$want'"
    done
  done
done
echo "C policies match the simulator (workers 1,2; slots 4,19,40; lru lfu phit)"

# 3. bin/k3: tiny cache, 2 servers: same ids as in-process; hits as simulated
ids=$("$PY" -c "import json; print(','.join(map(str, json.load(open('tests/expected/m13.json'))['prompt_ids'])))")
"$K3" tests/models/m13 --ids "$ids" --gen 12 --workers 0 > "$T/ref.out" 2>/dev/null || fail "--workers 0 run"
pols=default
"$K3" --help 2>&1 | grep -q -- --expert-cache-policy && pols="default lru lfu phit"
for P in $pols; do
  extra=""
  [ "$P" = default ] || extra="--expert-cache-policy $P"
  # --read-threads 0: the misses read as the simulator models them (with readers, a request's
  # misses beyond its pinnable slots take their slots while earlier experts are still pinned)
  "$K3" tests/models/m13 --ids "$ids" --gen 12 --workers 2 --read-threads 0 --expert-cache-mb 0.05 $extra --json "$T/w.json" \
      --dump-expert-trace "$T/w.trace" > "$T/w.out" 2> "$T/w.err" || { cat "$T/w.err"; fail "--workers 2 --expert-cache-mb 0.05 ($P)"; }
  cmp -s "$T/ref.out" "$T/w.out" || fail "policy $P: ids with a 0.05 MB cache differ from --workers 0"
  read -r slots hits <<<"$("$PY" -c "
import json; w = json.load(open('$T/w.json'))['workers']
assert len({x['cache_slots'] for x in w}) == 1
print(w[0]['cache_slots'], sum(x['expert_hits'] for x in w))")"
  sp=$P; [ "$P" = default ] && sp=phit
  want=$("$PY" "$SIM" "$T/w.trace" --workers 2 --sizes "$slots" --policies "$sp" --json "$T/w.sim.json" --quiet &&
         "$PY" -c "import json; print(json.load(open('$T/w.sim.json'))['runs'][0]['hits']['$sp'])")
  [ "$hits" = "$want" ] || fail "policy $P: servers report $hits hits with $slots slots, simulator says $want"
  echo "bin/k3 --workers 2 --expert-cache-mb 0.05 ($P, $slots slots): ids identical, $hits hits as simulated"
done
echo "t_45: ok"
