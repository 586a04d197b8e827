#!/usr/bin/python3
"""Server throughput on a model: aggregate generated tokens/s and per-request latency at several
numbers of concurrent streams, and bytes read per generated token (from /metrics).

  scripts/bench_server.py MODEL_DIR [--streams 1,2,4,8] [--gen 8] [--prompt-len 8] [--reps 1]
                          [--ceiling-gbs GBS] [--k3 bin/k3] [--md FILE]
                          [-- extra bin/k3 flags, e.g. --mem-gb 8 --workers 1]

scripts/bench_server.sh runs it under the bench lock with the read-bandwidth ceiling of
bin/bench_kernels --ceilings measured before and after (--ceiling-gbs); without --ceiling-gbs
the ceiling is a numpy sum over 1 GiB (one Python thread).

Starts `bin/k3 MODEL --serve --port 0 --parallel MAX(streams)` with the extra flags, measures the
machine's ceilings in the same run (DRAM read bandwidth: numpy sum over 1 GiB; FMA peak: not
measured here, see bench_kernels), then for each N sends N streamed /v1/completions at once
(distinct prompts of 8 ids, greedy, max_tokens --gen). Per request: time to first token and total
latency; per N: generated tokens / wall time and (expert bytes read + trunk bytes streamed) /
generated token. Wrap runs on models-big/rw6 in `flock /work/bench.lock`. Progress on stderr,
a markdown table on stdout (and appended to --md)."""
import json, os, platform, re, subprocess, sys, threading, time, urllib.request


def metric(url, name):
    txt = urllib.request.urlopen(url + "/metrics").read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), txt, re.M)
    return float(m.group(1)) if m else 0.0


def dram_gbs():
    import numpy as np
    a = np.ones(1 << 27)  # 1 GiB of float64
    a.sum()
    best = 0
    for _ in range(3):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def one(url, k, prompt, gen, out):
    body = json.dumps({"prompt": prompt, "max_tokens": gen, "stream": True, "return_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    ids = []
    r = urllib.request.urlopen(req, timeout=3600)
    buf = b""
    while True:
        c = r.read1(65536)
        if not c:
            break
        buf += c
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue  # an SSE comment (keep-alive)
            d = ev[6:]
            if d == b"[DONE]":
                continue
            j = json.loads(d)
            for ch in j.get("choices", []):
                if ch.get("token_ids"):
                    if first is None:
                        first = time.perf_counter() - t0
                    ids += ch["token_ids"]
    out.append({"k": k, "ttft": first, "latency": time.perf_counter() - t0, "n": len(ids), "ids": ids})


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    model = args[0]
    opts = {"--streams": "1,2,4,8", "--gen": "8", "--k3": "bin/k3", "--md": None, "--reps": "1", "--prompt-len": "8",
            "--ceiling-gbs": None}
    for i in range(1, len(args), 2):
        opts[args[i]] = args[i + 1]
    streams = [int(x) for x in opts["--streams"].split(",")]
    gen = int(opts["--gen"])
    cmd = [opts["--k3"], model, "--serve", "--port", "0", "--parallel", str(max(streams))] + extra
    print("bench_server: " + " ".join(cmd), file=sys.stderr)
    err = open("/tmp/bench_server.%d.err" % os.getpid(), "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    url = None
    for _ in range(6000):
        err.seek(0)
        m = re.search(r"serving on (http://\S+)", err.read())
        if m:
            url = m.group(1)
            break
        if p.poll() is not None:
            err.seek(0)
            sys.exit("server failed: " + err.read()[-2000:])
        time.sleep(0.1)
    rows = []
    alone = {}
    try:
        bw = float(opts["--ceiling-gbs"]) if opts["--ceiling-gbs"] else dram_gbs()
        plen = int(opts["--prompt-len"])
        load = os.getloadavg()
        one(url, -1, [1, 2, 3, 4], gen, [])  # warm-up (first reads, page faults), not counted
        for n in streams:
            prompts = [[1 + (100 * (k + 1) + 37 * j) % 500 for j in range(plen)] for k in range(n)]  # in any vocab
            b0 = metric(url, "k3_expert_bytes_read_total") + metric(url, "k3_trunk_bytes_streamed_total")
            s0, r0 = metric(url, "k3_steps_total"), metric(url, "k3_step_rows_total")
            f0 = metric(url, "k3_forward_seconds_total")
            wall = None
            t_n = time.perf_counter()
            for _ in range(int(opts["--reps"])):  # the fastest repetition counts (a shared machine)
                o_rep = []
                t0 = time.perf_counter()
                th = [threading.Thread(target=one, args=(url, k, pr, gen, o_rep)) for k, pr in enumerate(prompts)]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                w = time.perf_counter() - t0
                if wall is None or w < wall:
                    wall, out = w, o_rep
            b1 = metric(url, "k3_expert_bytes_read_total") + metric(url, "k3_trunk_bytes_streamed_total")
            s1, r1 = metric(url, "k3_steps_total"), metric(url, "k3_step_rows_total")
            f1 = metric(url, "k3_forward_seconds_total")
            tok = sum(o["n"] for o in out)
            reps = int(opts["--reps"])
            # the first prompt is the same at every N: its ids must not change with the batch
            ids0 = [o["ids"] for o in out if o["k"] == 0][0]
            if "ids" in alone and ids0 != alone["ids"]:
                sys.exit("bench_server: the first prompt's ids changed with %d streams" % n)
            alone["ids"] = ids0
            t_all = time.perf_counter() - t_n
            tpot = [(o["latency"] - o["ttft"]) / (o["n"] - 1) for o in out if o["ttft"] is not None and o["n"] > 1]
            row = {"streams": n, "tokens": tok, "wall": wall, "tps": tok / wall,
                   "read_gbs": (b1 - b0) / t_all / 1e9, "s_per_step": (f1 - f0) / max(1, s1 - s0), "gib_per_step": (b1 - b0) / max(1, s1 - s0) / 2**30,
                   "tpot": sum(tpot) / len(tpot) if tpot else 0, "lat_max": max(o["latency"] for o in out),
                   "lat": sum(o["latency"] for o in out) / n, "ttft": sum(o["ttft"] or 0 for o in out) / n,
                   "gib_per_tok": (b1 - b0) / (tok * reps) / 2**30 if tok else 0, "rows_per_step": (r1 - r0) / max(1, s1 - s0)}  # over all repetitions
            rows.append(row)
            print("bench_server: %d streams: %d tokens in %.1f s = %.3f tok/s, latency %.1f s, first token %.1f s, "
                  "%.3f GiB read/token, %.2f rows/step, %.2f GB/s read" % (n, tok, wall, row["tps"], row["lat"], row["ttft"],
                                                         row["gib_per_tok"], row["rows_per_step"], row["read_gbs"]), file=sys.stderr)
    finally:
        p.terminate()
        p.wait()
    load1 = os.getloadavg()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    lines = ["", "Machine: %s, %d cores. Load average %.1f %.1f %.1f at the start, %.1f %.1f %.1f at the end. Date: %s." % (
        cpu, os.cpu_count(), load[0], load[1], load[2], load1[0], load1[1], load1[2],
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
        "Ceiling in the same run: read bandwidth %.2f GB/s (%s)." % (
            bw, "bin/bench_kernels --ceilings, all threads, just before the server starts" if opts["--ceiling-gbs"] else "numpy sum over 1 GiB, best of 3"),
        "Command: `scripts/bench_server.py %s --streams %s --gen %d --prompt-len %d --reps %s -- %s`" % (
            model, opts["--streams"], gen, plen, opts["--reps"], " ".join(extra)),
        "", "| streams | generated tokens | wall s | aggregate tok/s | vs 1 stream | mean / max latency s | mean first token s "
        "| mean s per later token | s per step | GiB read / token | GiB read / step | sequences per step | read GB/s | vs ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %d | %.1f | %.3f | %.2fx | %.2f / %.2f | %.2f | %.2f | %.2f | %.3f | %.3f | %.2f | %.2f | %.0f %% |" % (
            r["streams"], r["tokens"], r["wall"], r["tps"], r["tps"] / rows[0]["tps"], r["lat"], r["lat_max"], r["ttft"],
            r["tpot"], r["s_per_step"], r["gib_per_tok"], r["gib_per_step"], r["rows_per_step"], r["read_gbs"], 100 * r["read_gbs"] / bw))
    txt = "\n".join(lines) + "\n"
    print(txt)
    if opts["--md"]:
        open(opts["--md"], "a").write(txt)


if __name__ == "__main__":
    main()
