#!/usr/bin/env python3
"""scripts/bench_mpi_md.py OUT - the markdown table of a scripts/bench_mpi.sh run."""
import json, os, re, sys

out = sys.argv[1]
load = {}
for line in open(os.path.join(out, "load.txt")):
    m = re.match(r"(\S+) run (\S+): .* load (\S+) (\S+) (\S+)$", line.strip())
    if m:
        load[m.group(2)] = (m.group(1), m.group(3))
rss = {}
for line in open(os.path.join(out, "rss.txt")):
    p = line.split()
    if len(p) >= 2 and p[1].isdigit():
        rss[p[0]] = int(p[1]) / 1048576.0
ceil = open(os.path.join(out, "ceilings.txt")).read() if os.path.exists(os.path.join(out, "ceilings.txt")) else ""
bw = re.findall(r"read_bw_gbs threads=(\d+) (\S+)", ceil)
runs = [n for n in load if os.path.exists(os.path.join(out, n + ".json"))]
ref = json.load(open(os.path.join(out, "inproc.json"))) if "inproc" in runs else None
def per_tok(j):
    t = j["timing"]
    return t["decode_s"] / max(1, t["decode_tokens"])
base = per_tok(ref) if ref else None
print("ceilings (same lock hold): " + ", ".join("read %s GB/s with %s threads" % (b, t) for t, b in bw))
print()
print("| run | at (UTC), load 1 min | decode s/token | vs in-process | expert ranks x local servers | exchanges / token | messages / token | bytes / token (all ranks) | exchange s / token | of which not computing | RSS all processes | ids = in-process |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in runs:
    j = json.load(open(os.path.join(out, n + ".json")))
    s = per_tok(j)
    m = j.get("mpi")
    same = "yes" if ref and j["generated_ids"] == ref["generated_ids"] else ("-" if not ref else "NO")
    ratio = "%+.0f %%" % (100 * (s / base - 1)) if base and n != "inproc" else "-"
    if m:
        lay = "%d x %d" % (m["expert_ranks"], m["ranks"][0]["local_servers"])
        cols = "%.0f | %.0f | %.2f MB | %.2f | %.3f" % (m["decode_exchanges_per_token"], m["decode_messages_per_token"],
                                                      m["decode_bytes_per_token"] / 1e6, m["decode_exchange_s_per_token"],
                                                      m["decode_overhead_s_per_token"])
    else:
        lay = "in-process" if j.get("n_workers", 0) == 0 else "%d local servers" % j["n_workers"]
        cols = "- | - | - | - | -"
    print("| %s | %s, %s | %.2f | %s | %s | %s | %.1f GiB | %s |" % (n, load[n][0], load[n][1], s, ratio, lay, cols, rss.get(n, 0), same))
