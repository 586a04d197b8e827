#!/usr/bin/env bash
# Expert-server overhead (issue 3): the same greedy generation on a real-width
# model with --workers 0, 1 and 2 at the same total thread count, everything
# resident (--preset max) so no disk I/O is measured. Reports seconds per
# decoded token and the multi-process overhead (ring round trips and copies)
# relative to in-process experts; writes the '## Expert servers' section of
# docs/PERFORMANCE.md. Model: $K3_BENCH_MODEL (default models-big/rw6, made by
# `scripts/gen_model.py --preset realwidth --out models-big/rw6`); skipped if absent.
set -eu
cd "$(dirname "$0")/.."
M="${K3_BENCH_MODEL:-models-big/rw6}"
GEN="${K3_BENCH_GEN:-8}"
if [ ! -f "$M/config.json" ]; then echo "bench_workers: no model at $M (generate it first); skipped"; exit 0; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
threads=$(nproc)
rows=""
for w in 0 1 2; do
  bin/k3 "$M" --ids 1,2,3,4 --gen "$GEN" --workers $w --threads "$threads" --worker-threads $(( w ? (threads / w > 0 ? threads / w : 1) : 1 )) \
    --preset max --json "$T/w$w.json" > "$T/w$w.out" 2> "$T/w$w.err"
  rows="$rows $T/w$w.json"
done
/usr/bin/python3 - "$M" "$GEN" "$threads" $rows <<'PY'
import json, os, platform, sys, time
model, gen, threads, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
runs = [json.load(open(f)) for f in files]
base = runs[0]["timing"]["decode_s"] / max(1, gen - 1)
ids0 = runs[0]["generated_ids"]
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
out = ["## Expert servers", "",
       "Machine: %s, %d cores. Date: %s. Model `%s` (real widths, everything resident: `--preset max`), "
       "prompt 1,2,3,4, %d greedy tokens, %d threads in all." % (cpu[0], len(cpu), time.strftime("%Y-%m-%d"), model, gen, threads),
       "Command: `scripts/bench_workers.sh` (also run by `make bench`).", "",
       "| workers | s/token (decode) | vs in-process | ring wait s | server compute s | ring overhead | same ids |",
       "|---|---|---|---|---|---|---|"]
for r in runs:
    s = r["timing"]["decode_s"] / max(1, gen - 1)
    ws = r.get("workers", [])
    wait = sum(w["ring_wait_s"] for w in ws)
    comp = sum(w["compute_s"] for w in ws)
    total = r["timing"]["prefill_s"] + r["timing"]["decode_s"]
    # time the coordinator waited beyond the slowest server's compute, per run: copies, wake-ups, checksums
    over = (wait - max((w["compute_s"] for w in ws), default=0) * len(ws)) / len(ws) / total if ws else 0
    out.append("| %d | %.3f | %+.1f %% | %s | %s | %s | %s |" % (
        r["n_workers"], s, 100 * (s - base) / base,
        "%.2f" % wait if ws else "-", "%.2f" % comp if ws else "-",
        "%.1f %%" % (100 * over) if ws else "-",
        "yes" if r["generated_ids"] == ids0 else "NO"))
out += ["", "Ring overhead = time the coordinator spent waiting on the rings beyond the servers' own compute "
        "(shared-memory copies of latent rows and expert outputs, semaphore wake-ups, checksums), as a share of "
        "the whole run (negative: servers computed concurrently, so their summed compute exceeds the wall time). "
        "'vs in-process' compares decode time with `--workers 0` at the same total thread count.", ""]
text = "\n".join(out)
print(text)
md = "docs/PERFORMANCE.md"
old = open(md).read() if os.path.exists(md) else "# Performance\n"
i = old.find("## Expert servers")
if i >= 0:
    j = old.find("\n## ", i + 5)
    old = old[:i] + (old[j + 1:] if j >= 0 else "")
open(md, "w").write(old.rstrip() + "\n\n" + text)
PY
