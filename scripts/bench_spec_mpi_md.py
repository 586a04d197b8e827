#!/usr/bin/python3
"""scripts/bench_spec_mpi_md.py OUT - markdown tables from the JSON files that
scripts/bench_spec_mpi.sh wrote into OUT (speculation and MPI runs). Missing runs are skipped."""
import json, os, sys

out = sys.argv[1]
def load(name):
    p = os.path.join(out, name + ".json")
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None

plain = load("plain")
print("| run | draft-max K | decode tok/s | s/token | passes/token | trunk GB/token | proposed | accepted | ids = plain |")
print("|---|---|---|---|---|---|---|---|---|")
for name, label in [("plain", "plain"), ("ids100_k1", "ids, 100 %"), ("ids100_k2", "ids, 100 %"), ("ids100_k4", "ids, 100 %"),
                    ("ids0_k1", "ids, 0 %"), ("ids0_k2", "ids, 0 %"), ("ids0_k4", "ids, 0 %"),
                    ("plain_rep", "plain, 32-id repetitive prompt"), ("ngram_k4", "ngram, 32-id repetitive prompt")]:
    j = load(name)
    if not j:
        continue
    t, s = j["timing"], j["speculation"]
    ref = load("plain_rep") if name.endswith("rep") or name.startswith("ngram") else plain
    same = "yes" if ref and j["generated_ids"] == ref["generated_ids"] else "NO"
    tps = t["decode_tokens_per_s"]
    print("| %s | %s | %.3f | %.2f | %.2f | %.2f | %d | %d | %s |" % (
        label, s["draft_max"] if s["draft"] != "none" else "-", tps, 1 / tps if tps else 0, s["passes_per_token"],
        s["trunk_bytes_per_token"] / 1e9, s["proposed"], s["accepted"], same))
print()
base = load("mpi_none_t1")
rows = [("mpi_none_t1", "in-process (`--workers 0`)", 0, "-")]
for np_ in (2, 3, 5):
    for btl in ("vader", "tcp"):
        rows.append(("mpi_%s_np%d" % (btl, np_), "np %d" % np_, np_ - 1, "shared memory (vader)" if btl == "vader" else "TCP"))
print("| layout | expert ranks | transport | decode s/token | vs in-process | ids = in-process |")
print("|---|---|---|---|---|---|")
for name, label, r, tr in rows:
    j = load(name)
    if not j:
        continue
    tps = j["timing"]["decode_tokens_per_s"]
    spt = 1 / tps if tps else 0
    b = 1 / base["timing"]["decode_tokens_per_s"] if base and base["timing"]["decode_tokens_per_s"] else 0
    same = "yes" if base and j["generated_ids"] == base["generated_ids"] else "NO"
    print("| %s | %s | %s | %.2f | %s | %s |" % (label, r, tr, spt, "%+.1f %%" % (100 * (spt / b - 1)) if b else "-", same))
