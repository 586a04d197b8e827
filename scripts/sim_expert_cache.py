#!/usr/bin/python3
"""sim_expert_cache.py - replay expert-routing traces against expert-cache policies.

Reads traces written by `bin/k3 ... --dump-expert-trace FILE` (or makes a
synthetic one, --synth) and replays them, per expert server, against LRU, LFU,
SIEVE, S3-FIFO, PHIT (predicted hit, the default of workers/expert_cache.c) and
Belady's MIN (future known) at a range of cache sizes, modelling
workers/expert_cache.c (lru, lfu and phit are modelled exactly: same tie rules,
same arithmetic, same hit counts - tests/t_45_cache_policy.sh checks it):

  * ownership: worker w owns (layer, expert) with (expert + layer) % W == w;
  * a request = the distinct experts one worker needs for one layer of one
    forward chunk, in ascending expert order (expert_batch sorts them); a
    chunk's layers are the maximal runs of trace lines with the same layer;
  * capacity is counted in expert slots; EMPTY slots are used first;
  * prefetch: the first min(n, slots - 1) experts of a request are looked up
    first (resident ones pinned, each a hit), then a slot is taken for each
    miss among them (never a pinned slot), all before any is used; with one
    slot there is no prefetch;
  * the request then uses its experts in order; a prefetched one is unpinned
    after its use; an expert past the prefetch window is a hit if resident,
    else it takes a slot then (a miss), and is unpinned after its use;
  * hit rate = hits / (hits + misses), one lookup per distinct expert per
    request (the cache's own hits/misses counters).

Several trace files are replayed back to back (one long-lived server). Output:
a table per worker count (slots per worker, the fraction of all experts the W
caches hold together, hit % per policy); --json FILE writes the same numbers.

  sim_expert_cache.py TRACE... [--workers 1,2] [--sizes 1,2,4 | --fractions .05,.1]
                      [--policies lru,lfu,...] [--json FILE]
  sim_expert_cache.py --synth NAME[:k=v,...] [--write-trace FILE] ...

A policy may carry parameters, e.g. --policies "lru;lfu:tie=lru,age=64;phit:alpha=0.2"
(with parameters, separate policies by ';'): lfu age (x slots uses between
halvings, 16) and tie (mru|lru); phit alpha (0.05) and decay (4194304).

Synthetic traces (--synth): layers L, experts E, top-k K, a prompt of P tokens
in chunks of 64 then G decode tokens. Each layer has a fixed popularity
(Zipf exponent `zipf` over a random permutation of its experts, 0 = uniform),
and `stick` is the probability that each expert a token used at a layer is
used again by the next token at that layer (temporal locality); the other
picks are drawn by popularity without replacement; `shift` > 0 redraws every
layer's popularity every `shift` decode tokens (a change of topic). Presets:
see SYNTH_PRESETS; e.g. --synth k3:zipf=0.5,stick=0.3,shift=64,seed=2.
"""
import argparse
import heapq
import json
import random
import sys
from collections import OrderedDict

import numpy as np

INF = float("inf")

SYNTH_PRESETS = {
    # K3's real shape: 92 MoE layers x 896 experts, top-16 (the 1st layer is dense).
    "k3": dict(layers=92, experts=896, top_k=16, prompt=64, gen=256, zipf=0.0, stick=0.0, shift=0, seed=1),
    # the committed model's shape (12 MoE layers x 16 experts, top-4)
    "m13": dict(layers=12, experts=16, top_k=4, prompt=18, gen=1000, zipf=0.0, stick=0.0, shift=0, seed=1),
    # a mid-size shape for quick sweeps
    "mid": dict(layers=24, experts=128, top_k=8, prompt=64, gen=300, zipf=0.0, stick=0.0, shift=0, seed=1),
}


# ---------------------------------------------------------------- traces

def read_trace(path):
    """Returns (meta dict, list of (pos, layer, [experts]))."""
    meta, rows = None, []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                if meta is None and line.startswith("# k3 expert trace v1"):
                    meta = {}
                    for tok in line.split()[5:]:
                        k, _, v = tok.partition("=")
                        meta[k] = int(v)
                continue
            parts = line.split()
            if len(parts) < 3:
                raise SystemExit("%s:%d: expected 'pos layer e1 ... ek'" % (path, ln))
            v = [int(x) for x in parts]
            rows.append((v[0], v[1], v[2:]))
    if meta is None or not all(k in meta for k in ("layers", "experts", "top_k")):
        raise SystemExit("%s: missing header '# k3 expert trace v1 layers=N experts=E top_k=K'" % path)
    for pos, layer, ex in rows:
        if len(ex) != meta["top_k"] or not 0 <= layer < meta["layers"] or any(not 0 <= e < meta["experts"] for e in ex):
            raise SystemExit("%s: bad line '%d %d %s' for %s" % (path, pos, layer, " ".join(map(str, ex)), meta))
    return meta, rows


def synth_trace(spec):
    """spec 'NAME[:k=v,...]' -> (meta, rows) in the engine's order."""
    name, _, rest = spec.partition(":")
    if name not in SYNTH_PRESETS:
        raise SystemExit("unknown --synth preset '%s' (have: %s)" % (name, ", ".join(SYNTH_PRESETS)))
    p = dict(SYNTH_PRESETS[name])
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        if k not in p:
            raise SystemExit("unknown --synth parameter '%s'" % k)
        p[k] = type(p[k])(float(v)) if isinstance(p[k], int) else float(v)
    rng = random.Random(p["seed"])
    L, E, K = p["layers"], p["experts"], p["top_k"]
    def popularity():
        w, cum = [], []
        for _ in range(L):
            perm = list(range(E))
            rng.shuffle(perm)
            lw = [0.0] * E
            for rank, e in enumerate(perm):
                lw[e] = 1.0 / (rank + 1) ** p["zipf"]
            acc, c = 0.0, []
            for x in lw:
                acc += x
                c.append(acc)
            w.append(lw)
            cum.append(c)
        return w, cum

    pop = [popularity()]
    prev = [None] * L
    experts = range(E)

    def route(layer):
        keep = [e for e in (prev[layer] or []) if rng.random() < p["stick"]]
        chosen = set(keep)
        w, cum = pop[0][0][layer], pop[0][1][layer]
        while len(chosen) < K:  # popularity-weighted, without replacement (rejection)
            chosen.add(rng.choices(experts, cum_weights=cum)[0])
        out = keep + sorted(chosen - set(keep), key=lambda e: (-w[e], e))
        prev[layer] = out
        return out

    rows, pos = [], 0
    chunks = [min(64, p["prompt"] - s) for s in range(0, p["prompt"], 64)] + [1] * p["gen"]
    for n in chunks:
        if p["shift"] and pos >= p["prompt"] and (pos - p["prompt"]) % p["shift"] == 0 and pos > p["prompt"]:
            pop[0] = popularity()  # a new "topic": popularity redrawn
        for layer in range(1, L + 1):
            for t in range(n):
                rows.append((pos + t, layer, route(layer - 1)))
        pos += n
    meta = {"layers": L + 1, "experts": E, "top_k": K, "synth": spec}
    return meta, rows


def write_trace(path, meta, rows):
    with open(path, "w") as f:
        f.write("# k3 expert trace v1 layers=%d experts=%d top_k=%d\n" % (meta["layers"], meta["experts"], meta["top_k"]))
        for pos, layer, ex in rows:
            f.write("%d %d %s\n" % (pos, layer, " ".join(map(str, ex))))


def chunk_requests(rows):
    """(layer, set of experts) per chunk-layer: maximal runs of lines with the
    same layer and increasing positions."""
    out, cur_layer, cur, last_pos = [], None, None, None
    for pos, layer, ex in rows:
        if layer != cur_layer or pos <= last_pos:
            if cur is not None:
                out.append((cur_layer, cur))
            cur_layer, cur = layer, set()
        cur.update(ex)
        last_pos = pos
    if cur is not None:
        out.append((cur_layer, cur))
    return out


def worker_requests(creqs, n_experts, n_workers):
    """Per worker: list of (layer, [keys ascending by expert]); key = layer * E + expert."""
    per = [[] for _ in range(n_workers)]
    for layer, ex in creqs:
        mine = [[] for _ in range(n_workers)]
        for e in sorted(ex):
            mine[(e + layer) % n_workers].append(layer * n_experts + e)
        for w in range(n_workers):
            if mine[w]:
                per[w].append((layer, mine[w]))
    return per


# ---------------------------------------------------------------- policies
# A policy keeps its own view of the resident keys.  The replay calls
#   insert(k)          k was just read into a slot (it is pinned until used)
#   access(k, hit)     k is used by the request now (in acquire order)
#   victim(pinned)     choose and forget a resident key not in `pinned`
#   begin(i)           request i starts (MIN needs it)

class LRU:
    """Least recently used (the original cache): order of use."""
    name = "lru"

    def __init__(self, cap, reqs, ctx):
        self.od = OrderedDict()

    def begin(self, i, layer, keys=()):
        pass

    def insert(self, k):
        self.od[k] = True

    def access(self, k, hit):
        self.od.move_to_end(k)

    def victim(self, pinned):
        for k in self.od:
            if k not in pinned:
                del self.od[k]
                return k
        raise RuntimeError("no unpinned slot")


class LFU:
    """Least frequently used (CACHE_POLICY_LFU), with history and aging: every key
    keeps its use count also while not resident (the table is small: layers x
    experts); every `age` x slots uses all counts are halved. Ties: the most
    recently used (tie=mru: its layer comes round last) or the least (tie=lru);
    then the smallest key."""
    name = "lfu"

    def __init__(self, cap, reqs, ctx, age=16, tie="mru"):
        self.count, self.stamp, self.res = {}, {}, set()
        self.heap, self.t, self.since = [], 0, 0
        self.age_every = max(1, int(age * cap))
        self.tie = tie

    def begin(self, i, layer, keys=()):
        pass

    def _prio(self, k):
        s = self.stamp[k]
        return (self.count.get(k, 0), s if self.tie == "lru" else -s, k)

    def insert(self, k):
        self.res.add(k)

    def access(self, k, hit):
        self.t += 1
        self.count[k] = self.count.get(k, 0) + 1
        self.stamp[k] = self.t
        heapq.heappush(self.heap, self._prio(k))
        self.since += 1
        if self.since >= self.age_every:
            self.since = 0
            for q in self.count:
                self.count[q] >>= 1
            self.heap = [self._prio(q) for q in self.res if q in self.stamp]
            heapq.heapify(self.heap)

    def victim(self, pinned):
        held = []
        try:
            while self.heap:
                e = heapq.heappop(self.heap)
                k = e[2]
                if k not in self.res or e != self._prio(k):
                    continue  # stale
                if k in pinned:
                    held.append(e)
                    continue
                self.res.discard(k)
                return k
            raise RuntimeError("no unpinned slot")
        finally:
            for e in held:
                heapq.heappush(self.heap, e)


class SIEVE:
    """SIEVE (Zhang et al., NSDI'24): FIFO order, a visited bit, a hand moving
    from old to new that clears visited bits and evicts the first unvisited
    (pinned slots are passed over)."""
    name = "sieve"

    def __init__(self, cap, reqs, ctx):
        self.q = []          # oldest first
        self.visited = {}
        self.hand = 0

    def begin(self, i, layer, keys=()):
        pass

    def insert(self, k):
        self.q.append(k)
        self.visited[k] = False

    def access(self, k, hit):
        if hit:
            self.visited[k] = True

    def victim(self, pinned):
        n = len(self.q)
        for _ in range(2 * n + 1):
            if self.hand >= len(self.q):
                self.hand = 0
            k = self.q[self.hand]
            if k in pinned:
                self.hand += 1
            elif self.visited[k]:
                self.visited[k] = False
                self.hand += 1
            else:
                del self.q[self.hand]
                del self.visited[k]
                return k
        raise RuntimeError("no unpinned slot")


class S3FIFO:
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of the slots, at least 1),
    a main FIFO and a ghost FIFO of evicted keys (as many as main holds); a
    new key goes to small (to main if it is a ghost); 2-bit use counts; an
    object leaving small moves to main if it was used again there, else it
    is evicted (and remembered as a ghost); main evicts with a second chance
    per count. Pinned slots are rotated, never evicted."""
    name = "s3fifo"

    def __init__(self, cap, reqs, ctx):
        self.cap = cap
        self.small_cap = max(1, cap // 10)
        self.small, self.main, self.ghost = OrderedDict(), OrderedDict(), OrderedDict()
        self.freq = {}

    def begin(self, i, layer, keys=()):
        pass

    def insert(self, k):
        self.freq[k] = 0
        if k in self.ghost:
            del self.ghost[k]
            self.main[k] = True
        else:
            self.small[k] = True

    def access(self, k, hit):
        if hit:
            self.freq[k] = min(3, self.freq[k] + 1)

    def _ghost_add(self, k):
        self.ghost[k] = True
        while len(self.ghost) > max(1, self.cap - self.small_cap):
            self.ghost.popitem(last=False)

    def _from_small(self, pinned):
        for _ in range(len(self.small)):
            k, _v = self.small.popitem(last=False)
            if k in pinned:
                self.small[k] = True
                continue
            if self.freq[k] > 0:
                self.freq[k] = 0
                self.main[k] = True
                continue
            del self.freq[k]
            self._ghost_add(k)
            return k
        return None

    def _from_main(self, pinned):
        for _ in range(4 * len(self.main) + 1):
            if not self.main:
                return None
            k, _v = self.main.popitem(last=False)
            if k in pinned:
                self.main[k] = True
                continue
            if self.freq[k] > 0:
                self.freq[k] -= 1
                self.main[k] = True
                continue
            del self.freq[k]
            return k
        return None

    def victim(self, pinned):
        k = None
        if len(self.small) >= self.small_cap or not self.main:
            k = self._from_small(pinned)
        if k is None:
            k = self._from_main(pinned)
        if k is None:
            k = self._from_small(pinned)
        if k is None:
            raise RuntimeError("no unpinned slot")
        return k



def age_bucket(a):
    """passes since the last use -> 0..11: 1,2,3,4, 5-6,7-8, 9-12,13-16, 17-32,33-64,65-128, 129+"""
    if a <= 4:
        return max(0, a - 1)
    if a <= 8:
        return 4 + (a - 5) // 2
    if a <= 16:
        return 6 + (a - 9) // 4
    b, lim = 8, 32
    while a > lim and b < 11:
        b += 1
        lim *= 2
    return b


RATE_EDGES = (0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85)


class PHIT:
    """Predicted hit, learned online (CACHE_POLICY_PHIT). The layers come round
    once per forward pass (a cycle: a request whose layer is not above the
    previous request's starts one), so the question for a resident expert is:
    will it be used when its layer comes round next? For every key the cache
    keeps the pass of its last use and its use rate r (per pass, exponential
    average with weight alpha, as of its last use). At every request of layer l
    it counts, for each key of l used before, an opportunity in the bucket
    (age = passes since its last use, 12 buckets; rate class of r, 15 buckets),
    and a use if the request uses it. The victim is the resident, unpinned key
    whose bucket at its next visit has the lowest (uses + 1) / (opportunities + 2);
    ties: the key whose layer comes round last, then the smallest key. The
    statistics are halved after `decay` opportunities. (Slots are numpy arrays
    so that a victim is chosen in one vectorised pass.)"""
    name = "phit"

    def __init__(self, cap, reqs, ctx, alpha=0.05, decay=4194304):
        self.E, self.NL = ctx["experts"], ctx["layers"]
        self.alpha, self.decay = alpha, decay
        self.last, self.rate, self.cls = {}, {}, {}
        self.seen = {}   # layer -> keys of that layer used before
        nr = len(RATE_EDGES) + 1
        self.use = [[0.0] * nr for _ in range(12)]
        self.opp = [[0.0] * nr for _ in range(12)]
        self.nopp = 0.0
        self.cycle, self.cur = 0, -1
        self.slot = {}   # resident key -> slot index
        self.free = list(range(cap - 1, -1, -1))
        self.s_key = np.full(cap, -1, dtype=np.int64)
        self.s_last = np.zeros(cap, dtype=np.int64)
        self.s_cls = np.zeros(cap, dtype=np.int64)
        # age -> bucket for ages 0..256 (a vectorised age_bucket)
        self.bucket_of = np.array([age_bucket(a) for a in range(257)], dtype=np.int64)

    def begin(self, i, layer, keys=()):
        if layer <= self.cur:
            self.cycle += 1
        self.cur = layer
        use, opp, n = self.use, self.opp, 0
        for k in self.seen.get(layer, ()):  # opportunities of this visit
            a = self.cycle - self.last[k]
            if a <= 0:
                continue
            b, c = age_bucket(a), self.cls[k]
            opp[b][c] += 1
            if k in keys:
                use[b][c] += 1
            n += 1
        self.nopp += n
        if self.nopp >= self.decay:
            self.nopp = 0.0
            for tab in (self.use, self.opp):
                for row in tab:
                    for j in range(len(row)):
                        row[j] *= 0.5

    def insert(self, k):
        j = self.free.pop()
        self.slot[k] = j
        self.s_key[j] = k
        if k in self.last:
            self.s_last[j], self.s_cls[j] = self.last[k], self.cls[k]

    def access(self, k, hit):
        if k not in self.last:
            self.seen.setdefault(k // self.E, set()).add(k)
            self.rate[k] = 0.0
        else:
            self.rate[k] *= (1 - self.alpha) ** (self.cycle - self.last[k])
        self.rate[k] += self.alpha
        r = self.rate[k]
        self.last[k] = self.cycle
        self.cls[k] = sum(r >= t for t in RATE_EDGES)
        j = self.slot[k]
        self.s_last[j], self.s_cls[j] = self.cycle, self.cls[k]

    def victim(self, pinned):
        if len(self.s_key) <= 64:  # small caches: a plain loop is faster than numpy
            best, bv = None, None
            for k in self.slot:
                if k in pinned:
                    continue
                layer, c = k // self.E, self.cls[k]
                b = age_bucket(self.cycle - self.last[k] + (layer <= self.cur))
                d = (layer - self.cur) % self.NL or self.NL
                v = ((self.use[b][c] + 1) / (self.opp[b][c] + 2), -d, k)
                if bv is None or v < bv:
                    best, bv = k, v
            if best is None:
                raise RuntimeError("no unpinned slot")
            j = self.slot.pop(best)
            self.s_key[j] = -1
            self.free.append(j)
            return best
        keys = self.s_key
        ok = keys >= 0
        for k in pinned:
            j = self.slot.get(k)
            if j is not None:
                ok[j] = False
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            raise RuntimeError("no unpinned slot")
        k = keys[idx]
        layer = k // self.E
        age = self.cycle - self.s_last[idx] + (layer <= self.cur)
        b = self.bucket_of[np.minimum(age, 256)]
        c = self.s_cls[idx]
        val = (np.array(self.use)[b, c] + 1) / (np.array(self.opp)[b, c] + 2)
        d = (layer - self.cur) % self.NL
        d[d == 0] = self.NL
        j = idx[np.lexsort((k, -d, val))[0]]
        best = int(keys[j])
        keys[j] = -1
        self.free.append(j)
        del self.slot[best]
        return best


class MIN:
    """Belady's MIN: evict the resident key whose next use is farthest away
    (never used again first). Needs the future: the worker's request list."""
    name = "min"

    def __init__(self, cap, reqs, ctx):
        # next_use[i][k]: index of the next request after i that uses k
        nxt, last = [None] * len(reqs), {}
        for i in range(len(reqs) - 1, -1, -1):
            keys = reqs[i][1]
            nxt[i] = {k: last.get(k, INF) for k in keys}
            for k in keys:
                last[k] = i
        self.first = last
        self.nxt = nxt
        self.when = {}
        self.heap = []
        self.i = 0

    def begin(self, i, layer, keys=()):
        self.i = i

    def insert(self, k):
        self.when[k] = self.i  # used by the current request
        heapq.heappush(self.heap, (-self.i, k))

    def access(self, k, hit):
        w = self.nxt[self.i][k]
        self.when[k] = w
        heapq.heappush(self.heap, (-w, k))

    def victim(self, pinned):
        held = []
        try:
            while self.heap:
                nw, k = heapq.heappop(self.heap)
                if self.when.get(k) != -nw:
                    continue
                if k in pinned:
                    held.append((nw, k))
                    continue
                del self.when[k]
                return k
            raise RuntimeError("no unpinned slot")
        finally:
            for e in held:
                heapq.heappush(self.heap, e)


POLICIES = {
    "lru": LRU,
    "lfu": LFU,
    "sieve": SIEVE,
    "s3fifo": S3FIFO,
    "phit": PHIT,
    "min": MIN,
}


def make_policy(spec, ctx):
    """'name' or 'name:k=v,...' -> a factory (cap, reqs) -> policy."""
    name, _, rest = spec.partition(":")
    if name not in POLICIES:
        raise SystemExit("unknown policy '%s' (have: %s)" % (name, ", ".join(POLICIES)))
    kw = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        try:
            kw[k] = float(v)
        except ValueError:
            kw[k] = v
    return lambda cap, reqs: POLICIES[name](cap, reqs, ctx, **kw)


# ---------------------------------------------------------------- replay

def replay(reqs, cap, make):
    """Replays one worker's requests through a cache of `cap` slots; returns (hits, misses)."""
    pol = make(cap, reqs)
    resident = set()
    hits = misses = 0

    def load(k, pinned):
        nonlocal misses
        if len(resident) >= cap:
            v = pol.victim(pinned)
            if v not in resident or v in pinned:
                raise RuntimeError("%s evicted %r (resident %s, pinned %s)" % (pol.name, v, v in resident, v in pinned))
            resident.discard(v)
        resident.add(k)
        pol.insert(k)
        misses += 1

    for i, (_layer, keys) in enumerate(reqs):
        pol.begin(i, _layer, set(keys))
        win = keys[:cap - 1] if cap >= 2 else []
        pinned = set()
        was_hit = {}
        for k in win:                       # prefetch, pass 1: pin the resident ones
            if k in resident:
                pinned.add(k)
                was_hit[k] = True
                hits += 1
        for k in win:                       # pass 2: a slot for each miss
            if k not in pinned:
                load(k, pinned)
                pinned.add(k)
                was_hit[k] = False
        for k in win:                       # use in order, unpin after use
            pol.access(k, was_hit[k])
            pinned.discard(k)
        for k in keys[len(win):]:           # past the window: on demand
            if k in resident:
                hits += 1
                pol.access(k, True)
            else:
                load(k, {k})
                pol.access(k, False)
    return hits, misses


def simulate(per_worker, cap, make):
    h = m = 0
    for reqs in per_worker:
        a, b = replay(reqs, cap, make)
        h += a
        m += b
    return h, m


def parse_list(s, conv):
    return [conv(x) for x in s.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", help="trace files (replayed back to back)")
    ap.add_argument("--synth", help="synthetic trace NAME[:k=v,...] (presets: %s)" % ", ".join(SYNTH_PRESETS))
    ap.add_argument("--write-trace", help="write the (synthetic) trace to this file")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--sizes", help="cache sizes in slots per worker")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.2,0.3,0.5,0.75,1",
                    help="sizes as fractions of all experts (over all workers) when --sizes is not given")
    ap.add_argument("--policies", default=",".join(POLICIES), help="policies (default: all)")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--quiet", action="store_true", help="no table on stdout")
    a = ap.parse_args(argv)

    if a.synth:
        meta, rows = synth_trace(a.synth)
        if a.write_trace:
            write_trace(a.write_trace, meta, rows)
        sources = [a.synth]
    else:
        if not a.traces:
            ap.error("give trace files or --synth")
        meta, rows = None, []
        for p in a.traces:
            m, r = read_trace(p)
            if meta is not None and (m["layers"], m["experts"], m["top_k"]) != (meta["layers"], meta["experts"], meta["top_k"]):
                raise SystemExit("%s: header %s differs from %s" % (p, m, meta))
            meta = m
            rows.extend(r)
        sources = a.traces
    pols = a.policies.split(";") if ";" in a.policies else parse_list(a.policies, str)
    ctx = {"experts": meta["experts"], "layers": meta["layers"]}
    makers = {p: make_policy(p, ctx) for p in pols}

    E = meta["experts"]
    moe_layers = sorted({layer for _, layer, _ in rows})
    total = len(moe_layers) * E
    creqs = chunk_requests(rows)
    result = {"traces": sources, "layers": meta["layers"], "moe_layers": len(moe_layers), "experts": E,
              "top_k": meta["top_k"], "positions": len({(p, l) for p, l, _ in rows}) // max(1, len(moe_layers)),
              "chunk_layer_requests": len(creqs), "total_experts": total, "runs": []}
    for W in parse_list(a.workers, int):
        per = worker_requests(creqs, E, W)
        owned = -(-total // W)
        if a.sizes:
            sizes = parse_list(a.sizes, int)
        else:
            sizes = sorted({max(1, round(f * total / W)) for f in parse_list(a.fractions, float)})
        lookups = sum(len(k) for reqs in per for _, k in reqs)
        rows_out = []
        for cap in sizes:
            r = {"workers": W, "slots": cap, "fraction": cap * W / total, "lookups": lookups, "hit_rate": {}, "hits": {}}
            for p in pols:
                h, m = simulate(per, cap, makers[p])
                assert h + m == lookups
                r["hits"][p] = h
                r["hit_rate"][p] = h / lookups if lookups else 0.0
            rows_out.append(r)
        result["runs"].extend(rows_out)
        if not a.quiet:
            print("workers=%d  requests=%d  lookups=%d  experts/worker~%d" % (W, sum(map(len, per)), lookups, owned))
            print("| slots/worker | of all experts | " + " | ".join(pols) + " |")
            print("|---:|---:|" + "---:|" * len(pols))
            for r in rows_out:
                print("| %d | %.1f%% | " % (r["slots"], 100 * r["fraction"]) +
                      " | ".join("%.1f" % (100 * r["hit_rate"][p]) for p in pols) + " |")
            print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
