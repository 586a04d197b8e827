#!/usr/bin/env bash
# bench_stream.sh - streaming (issue 13 item 4) on a real-width model, in ONE hold of the bench
# lock: the device's O_DIRECT read ceiling (fio: one job at QD 32, four jobs at QD 8 on four
# shards, one job at QD 1, io_uring at QD 8; without fio dd iflag=direct, QD 1, a lower bound),
# then streamed runs alternated between two binaries / flag sets at a budget, each with --json.
# The two fio shapes that read most are taken again after the runs; the ceiling is the best
# rate seen. Prints one markdown table: s/token, the run's read rate (trunk streamed + expert bytes over
# prefill + decode time) and its ratio to the best ceiling measured in the same hold, the waits
# for reads (trunk reader, expert reads), the prediction's recall and its reads.
#
#   BASE_K3=old/bin/k3 BASE_FLAGS="" K3=bin/k3 NEW_FLAGS="--expert-prefetch on" \
#     MEM_GB=7 GEN=6 PAIRS=2 scripts/bench_stream.sh MODEL_DIR [OUT_DIR]
# The caller holds the lock (flock /work/bench.lock scripts/bench_stream.sh ...); BENCH_LOCK
# is not taken here. A run that fails is reported and the others go on.
set -u
MODEL=${1:?usage: bench_stream.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
K3=${K3:-bin/k3}
BASE_K3=${BASE_K3:-$K3}
BASE_FLAGS=${BASE_FLAGS:-}
NEW_FLAGS=${NEW_FLAGS:---expert-prefetch on}
MEM_GB=${MEM_GB:-7}
GEN=${GEN:-6}
PAIRS=${PAIRS:-2}
THREADS=${THREADS:-2}
IDS=${IDS:-163584,1000,2000,3000,4000,5000,6000,7000}
PY=${PYTHON:-/usr/bin/python3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

uptime > "$OUT/uptime0"
mapfile -t shards < <(ls -S "$MODEL"/*.safetensors)
dev_json="$OUT/device.json"
echo '{}' > "$dev_json"
fio_one() { # name, fio args... (a name measured twice keeps the higher rate)
  local name=$1; shift
  if fio --readonly --direct=1 --rw=read --bs=4M --output-format=json "$@" > "$OUT/fio-$name.json" 2> "$OUT/fio-$name.err"; then
    $PY - "$OUT/fio-$name.json" "$name" "$dev_json" << 'PYEOF'
import json, sys
j = json.load(open(sys.argv[1])); io = sum(x["read"]["io_bytes"] for x in j["jobs"])
t = max(x["read"]["runtime"] for x in j["jobs"]) / 1e3
d = json.load(open(sys.argv[3])); r = {"gbs": io / t / 1e9 if t else 0, "gb": io / 1e9}
old = d.get(sys.argv[2])
d[sys.argv[2]] = r if not old or r["gbs"] > old["gbs"] else old
d.setdefault("_all", []).append([sys.argv[2], r["gbs"]])
json.dump(d, open(sys.argv[3], "w"))
PYEOF
  else log "fio $name failed: $(head -c 200 "$OUT/fio-$name.err")"; fi
}
if command -v fio > /dev/null && [ "${#shards[@]}" -ge 4 ]; then
  log "device ceiling (fio)"
  fio_one qd32 --name=a --ioengine=libaio --iodepth=32 --filename="${shards[0]}"
  fio_one qd8x4 --ioengine=libaio --iodepth=8 --name=a --filename="${shards[1]}" --name=b --filename="${shards[2]}" \
    --name=c --filename="${shards[3]}" --name=d --filename="${shards[4]:-${shards[0]}}"
  fio_one qd1 --name=a --ioengine=psync --iodepth=1 --filename="${shards[5]:-${shards[1]}}" --size=1G
  fio_one uring8 --name=a --ioengine=io_uring --iodepth=8 --filename="${shards[6]:-${shards[2]}}" --size=1G
  fio_one psync4 --ioengine=psync --thread --numjobs=4 --size=256M --offset_increment=256M --name=a --filename="${shards[7]:-${shards[3]}}"
  # the engine reads the same bytes every token: the last shards by name (late layers, lm head,
  # their experts: what a streamed run reads) read twice in a row, three jobs at QD 32; the second pass is what a re-read gets
  # (on a VM whose disk is a file of the host, the host's page cache serves part of it)
  mapfile -t last < <(ls "$MODEL"/*.safetensors | tail -n 3) # the last shards by name
  for pass in 1 2; do
    fio_one "reread-pass$pass" --ioengine=libaio --iodepth=32 --name=a --filename="${last[0]}" --name=b --filename="${last[1]}" \
      --name=c --filename="${last[2]}"
  done
else
  log "no fio: dd O_DIRECT"
  s=$(dd if="${shards[0]}" of=/dev/null bs=4M count=512 iflag=direct 2>&1 | sed -n 's/.* copied, \([0-9.]*\) s, .*/\1/p')
  $PY -c "import json,sys; json.dump({'dd_qd1': {'gbs': 2147483648/float(sys.argv[1])/1e9, 'gb': 2.147}}, open(sys.argv[2],'w'))" "${s:-0}" "$dev_json"
fi
run() { # tag, binary, flags
  local tag=$1 bin=$2; shift 2
  log "$tag: $bin $*"
  /usr/bin/time -v "$bin" "$MODEL" --ids "$IDS" --gen "$GEN" --workers 0 --threads "$THREADS" --mem-gb "$MEM_GB" "$@" \
    --json "$OUT/$tag.json" > "$OUT/$tag.out" 2> "$OUT/$tag.err" || log "$tag failed: $(tail -n 2 "$OUT/$tag.err")"
}
probe() { # a short fio (1 GiB, QD 32) between runs: the device's rate next to each run
  command -v fio > /dev/null || return 0
  fio --readonly --direct=1 --rw=read --bs=4M --ioengine=libaio --iodepth=32 --size=1G --name=p \
    --filename="${shards[$1 % ${#shards[@]}]}" --output-format=json > "$OUT/probe$1.json" 2> /dev/null || rm -f "$OUT/probe$1.json"
}
np=0
probe $np
for p in $(seq 1 "$PAIRS"); do
  # shellcheck disable=SC2086
  run "before$p" "$BASE_K3" $BASE_FLAGS
  np=$((np + 1)); probe $np
  # shellcheck disable=SC2086
  run "after$p" "$K3" $NEW_FLAGS
  np=$((np + 1)); probe $np
done
if command -v fio > /dev/null && [ "${#shards[@]}" -ge 4 ]; then
  log "device ceiling again, after the runs"
  fio_one qd32 --name=a --ioengine=libaio --iodepth=32 --filename="${shards[1]}"
  fio_one qd8x4 --ioengine=libaio --iodepth=8 --name=a --filename="${shards[0]}" --name=b --filename="${shards[3]}" \
    --name=c --filename="${shards[2]}" --name=d --filename="${shards[5]:-${shards[1]}}"
  fio_one reread-pass2 --ioengine=libaio --iodepth=32 --name=a --filename="${last[0]}" --name=b --filename="${last[1]}" \
    --name=c --filename="${last[2]}"
fi
uptime > "$OUT/uptime1"
$PY - "$OUT" "$PAIRS" "$MEM_GB" "$BASE_FLAGS" "$NEW_FLAGS" << 'PYEOF'
import json, os, sys
out, pairs, mem, bflags, nflags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dev = json.load(open(os.path.join(out, "device.json")))
allm = dev.pop("_all", [])
ceil = max([v["gbs"] for v in dev.values()] or [0])
print("Load: before `%s`, after `%s`." % (open(os.path.join(out, "uptime0")).read().strip(), open(os.path.join(out, "uptime1")).read().strip()))
print()
print("| device ceiling (O_DIRECT, 4 MiB) | GB/s (best) | GB read | every measurement in order (before, after the runs) |")
print("|---|---|---|---|")
for k, v in dev.items(): print("| %s | %.2f | %.1f | %s |" % (k, v["gbs"], v["gb"], ", ".join("%.2f" % g for n, g in allm if n == k)))
print()
def probe(i):
    f = os.path.join(out, "probe%d.json" % i)
    if not os.path.exists(f): return None
    j = json.load(open(f)); return j["jobs"][0]["read"]["bw_bytes"] / 1e9
print()
print("| run | flags | s/token | reads GB/s (prefill + decode) | of ceiling %.2f | fio QD 32 just before / after it, GB/s | of the better of those | trunk wait s | expert wait s | recall | hinted / used / wasted | peak RSS GiB | ids |" % ceil)
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
k = 0
for p in range(1, pairs + 1):
    for tag, fl in (("before%d" % p, bflags), ("after%d" % p, nflags)):
        pa, pb = probe(k), probe(k + 1); k += 1
        near = max([x for x in (pa, pb) if x] or [0])
        f = os.path.join(out, tag + ".json")
        if not os.path.exists(f): print("| %s | %s | failed |" % (tag, fl)); continue
        j = json.load(open(f)); t, m = j["timing"], j["memory"]; pf = j.get("prefetch", {})
        ntok = t.get("decode_tokens", 0)
        spt = t["decode_s"] / ntok if ntok else float("nan")
        rd = m["trunk_bytes_streamed"] + m["expert_bytes_read"]; tot = t["prefill_s"] + t["decode_s"]
        rate = rd / tot / 1e9 if tot else 0
        hint = "%s / %s / %s" % (pf.get("hint_reads", "-"), pf.get("hint_hits", "-"), pf.get("hint_wasted", "-")) if pf.get("mode") == "on" else "-"
        rec = "%.3f" % pf["recall"] if pf.get("recall") is not None else "-"
        print("| %s | `%s` | %.3f | %.2f | %.0f %% | %s / %s | %s | %s | %s | %s | %s | %.2f | %s |" % (
            tag, fl or "(defaults)", spt, rate, 100 * rate / ceil if ceil else 0,
            "%.2f" % pa if pa else "-", "%.2f" % pb if pb else "-", "%.0f %%" % (100 * rate / near) if near else "-",
            "%.1f" % m["trunk_read_wait_s"] if "trunk_read_wait_s" in m else "-",
            "%.1f" % m["expert_read_wait_s"] if "expert_read_wait_s" in m else "-",
            rec, hint, m["peak_rss_total_bytes"] / 2**30, " ".join(map(str, j["generated_ids"]))))
PYEOF
