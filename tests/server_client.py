#!/usr/bin/python3
"""HTTP client for tests/t_80_server.sh (standard library only).

  server_client.py load URL KEY K3 MODEL CLIENTS REQUESTS   concurrent greedy/seeded requests, each
        answer compared with the same prompt ids run alone through `bin/k3 --ids`
  server_client.py disconnect URL KEY                        opens a long stream, reads 3 events, drops it
  server_client.py stream_ids URL KEY MAX                    one streamed chat; prints prompt ids and ids
Exit status 0 on success; failures are printed as FAIL lines."""
import json, os, socket, subprocess, sys, threading, urllib.request, urllib.error
from urllib.parse import urlparse

STOP_IDS = None


def post(url, key, path, body, stream=False, timeout=120):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    r = urllib.request.urlopen(req, timeout=timeout)
    if not stream:
        return json.loads(r.read())
    events = []
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b":"):
                continue  # SSE comment (keep-alive)
            assert ev.startswith(b"data: "), ev
            events.append(ev[6:].decode())
    return events


def run_request(url, key, spec):
    """Returns (prompt_ids, generated ids, finish_reason, text) for one request."""
    body = dict(spec["body"])
    body["return_token_ids"] = True
    path = "/v1/chat/completions" if spec["chat"] else "/v1/completions"
    if not body.get("stream"):
        j = post(url, key, path, body)
        ch = j["choices"][0]
        text = ch["message"].get("content") if spec["chat"] else ch["text"]
        return j["prompt_token_ids"], ch["token_ids"], ch["finish_reason"], text
    evs = post(url, key, path, body, stream=True)
    assert evs[-1] == "[DONE]", "stream does not end with [DONE]"
    prompt, ids, fr, text = None, [], None, ""
    usage = None
    for e in evs[:-1]:
        j = json.loads(e)
        assert "error" not in j, j
        if j.get("usage"):
            usage = j["usage"]
        if "prompt_token_ids" in j:
            prompt = j["prompt_token_ids"]
        for ch in j["choices"]:
            ids += ch.get("token_ids", [])
            if ch.get("finish_reason"):
                fr = ch["finish_reason"]
            d = ch.get("delta", {}) if spec["chat"] else ch
            text += (d.get("content") if spec["chat"] else d.get("text")) or ""
    if body.get("stream_options", {}).get("include_usage"):
        assert usage and usage["completion_tokens"] >= len(ids), ("usage", usage)
    return prompt, ids, fr, text


def reference(k3, model, prompt, spec):
    b = spec["body"]
    cmd = [k3, model, "--ids", ",".join(map(str, prompt)), "--gen", str(b["max_tokens"]), "--workers", "0",
           "--stop-id", ",".join(map(str, STOP_IDS))]
    if b.get("temperature"):
        cmd += ["--temperature", str(b["temperature"]), "--seed", str(b.get("seed", 0))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    ids = [int(x) for x in out]
    if ids and ids[-1] in STOP_IDS:
        ids = ids[:-1]
    return ids


def load(url, key, k3, model, clients, per_client):
    global STOP_IDS
    tok = post(url, key, "/tokenize", {"prompt": "<|end_of_msg|>[EOS]"})["tokens"]
    STOP_IDS = tok
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    specs = []
    for c in range(clients):
        for r in range(per_client):
            i = c * per_client + r
            n = 6 + (i * 7) % 19
            if i % 3 == 2:
                body = {"prompt": "%s %s %d the expert servers" % (words[c % 10], words[r % 10], i), "max_tokens": n}
                chat = False
            else:
                body = {"messages": [{"role": "user", "content": "request %d from client %s" % (i, words[c % 10])}],
                        "max_tokens": n, "thinking": i % 2 == 0}
                chat = True
            if i % 2 == 1:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            if i % 5 == 4:
                body["temperature"] = 0.8
                body["seed"] = 1000 + i
            specs.append({"chat": chat, "body": body, "client": c})
    results = [None] * len(specs)
    errors = []

    def worker(c):
        for i, s in enumerate(specs):
            if s["client"] != c:
                continue
            try:
                results[i] = run_request(url, key, s)
            except Exception as e:  # noqa
                errors.append("request %d: %r" % (i, e))

    th = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errors:
        for e in errors:
            print("FAIL", e)
        return 1
    bad = 0
    for i, (s, res) in enumerate(zip(specs, results)):
        prompt, ids, fr, _ = res
        ref = reference(k3, model, prompt, s)
        if ids != ref:
            print("FAIL request %d (%s, stream=%s): served %s, alone %s" % (i, "chat" if s["chat"] else "completion",
                                                                          s["body"].get("stream", False), ids, ref))
            bad += 1
        want_fr = "length" if len(ids) == s["body"]["max_tokens"] else None
        if want_fr and fr != want_fr:
            print("FAIL request %d: finish_reason %s, want %s" % (i, fr, want_fr))
            bad += 1
    print("load: %d requests from %d clients, %d equal to the command line alone" % (len(specs), clients,
                                                                                     len(specs) - bad))
    return 1 if bad else 0


def disconnect(url, key):
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port))
    body = json.dumps({"prompt": "a long one", "max_tokens": 3000, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
              + key.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        d = s.recv(4096)
        if not d:
            print("FAIL the stream ended early")
            return 1
        got += d
    s.close()
    print("disconnect: read 3 events, closed the socket")
    return 0


def stream_ids(url, key, n):
    spec = {"chat": True, "body": {"messages": [{"role": "user", "content": "kill test"}], "max_tokens": int(n),
                                   "stream": True, "thinking": False}}
    prompt, ids, fr, _ = run_request(url, key, spec)
    print(json.dumps({"prompt": prompt, "ids": ids, "finish_reason": fr}))
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "load":
        sys.exit(load(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7])))
    if cmd == "disconnect":
        sys.exit(disconnect(sys.argv[2], sys.argv[3]))
    if cmd == "stream_ids":
        sys.exit(stream_ids(sys.argv[2], sys.argv[3], sys.argv[4]))
    sys.exit(2)
