#!/usr/bin/env bash
# The OpenAI-compatible server (issue 10), on the bundled model m13:
# - curl: health, models, auth (401), 404/405, 400 naming the field (malformed JSON, unknown role,
#   impossible max_tokens, id out of range), 413, a whole and a streamed chat (data: [DONE], usage),
#   /tokenize, /detokenize, /metrics, the static page;
# - load: 8 clients x 4 requests (chat/completions, streamed or not, greedy or seeded) against
#   4 slots; every answer equals the same prompt ids run alone through `bin/k3 --ids`;
# - tool_choice: a named function makes the reply a call to it; an undeclared one is 400; none;
# - K2 template (a tokenizer with <|im_*|> specials, --tok): the rendering is the jinja text, the
#   reply equals the command line;
# - --state-dir: a prefix stored by one server is restored from disk by the next one (same ids);
# - a conversation's next turn reuses the kept prefix (cached_tokens > 0) with identical ids;
# - a client that disconnects mid-stream is cancelled and its slot freed;
# - a full queue answers 429 with Retry-After;
# - an expert server SIGKILLed during a stream: the same answer;
# - the official `openai` npm client (tests/openai_client) when npm can install it, else SKIP;
# - headless Chromium on GET / (tests/webpage_test.js) when chromium and node are there, else SKIP;
# - SIGTERM: exit 0, no k3-expertd left, no /dev/shm object left.
set -u
cd "$(dirname "$0")/.."
K3="${K3_BIN:-bin/k3}"
PY="${PYTHON:-/usr/bin/python3}"
T="${K3_TEST_TMP:-$(mktemp -d)}/server"
mkdir -p "$T"
M=tests/models/m13
KEY=test-key-123
fail() { echo "FAIL: $*"; [ -f "$T/s.err" ] && tail -5 "$T/s.err"; cleanup; exit 1; }
shm_count() { ls /dev/shm 2>/dev/null | grep -c '^k3\.' ; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ]; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

# start NAME ARGS...: starts a server on a free port; sets URL and SPID
start() {
  local name=$1; shift
  "$K3" "$M" --serve --port 0 "$@" > "$T/$name.out" 2> "$T/$name.err" &
  SPID=$!
  PIDS+=("$SPID")
  for _ in $(seq 1 200); do
    grep -q 'serving on' "$T/$name.err" && break
    alive "$SPID" || { cat "$T/$name.err"; fail "$name: server did not start"; }
    sleep 0.1
  done
  URL=$(sed -n 's/.*serving on \(http:[^ ]*\).*/\1/p' "$T/$name.err")
  [ -n "$URL" ] || fail "$name: no address printed"
}
# code METHOD PATH [curl args]: prints the status code, body into $T/body
code() { local m=$1 p=$2; shift 2; curl -s -o "$T/body" -w '%{http_code}' -X "$m" "$URL$p" "$@"; }
auth=(-H "Authorization: Bearer $KEY")
json=(-H "Content-Type: application/json")

shm0=$(shm_count)
start s --workers 2 --parallel 4 --api-key "$KEY"
cp "$T/s.err" "$T/s.err.start"
MAIN=$SPID
echo "server at $URL"

# ---- basics, auth, errors ----
[ "$(code GET /health)" = 200 ] || fail "/health"
[ "$(code GET /v1/models)" = 401 ] || fail "/v1/models without a key is not 401"
[ "$(code GET /v1/models -H 'Authorization: Bearer wrong-key-123')" = 401 ] || fail "wrong key accepted"
[ "$(code GET /v1/models "${auth[@]}")" = 200 ] || fail "/v1/models with the key"
grep -q '"object":"list"' "$T/body" || fail "/v1/models body"
[ "$(code GET /v2/nothing "${auth[@]}")" = 404 ] || fail "unknown path is not 404"
grep -q '"error":{"message"' "$T/body" || fail "404 body is not an OpenAI error"
[ "$(code GET /v1/chat/completions "${auth[@]}")" = 405 ] || fail "GET on a POST path is not 405"
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"messages": [')
[ "$c" = 400 ] && grep -q 'not valid JSON' "$T/body" || fail "malformed JSON: $c $(cat "$T/body")"
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"messages":[{"role":"wizard","content":"x"}]}')
[ "$c" = 400 ] && grep -q '"param":"messages\[0\].role"' "$T/body" || fail "unknown role: $c $(cat "$T/body")"
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":100000000}')
[ "$c" = 400 ] && grep -q '"param":"max_tokens"' "$T/body" || fail "impossible max_tokens: $c $(cat "$T/body")"
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}')
[ "$c" = 400 ] && grep -q '"param":"temperature"' "$T/body" || fail "wrong type: $c $(cat "$T/body")"
c=$(code POST /v1/completions "${auth[@]}" "${json[@]}" -d '{"prompt":[1,99999],"max_tokens":2}')
[ "$c" = 400 ] && grep -q '"param":"prompt\[1\]"' "$T/body" || fail "id out of range: $c $(cat "$T/body")"
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"messages":[{"role":"user","content":"x"}],"n":3}')
[ "$c" = 400 ] || fail "n=3 accepted"
head -c 5000000 /dev/zero | tr '\0' 'a' > "$T/big"
c=$(code POST /v1/completions "${auth[@]}" "${json[@]}" --data-binary @"$T/big")
[ "$c" = 413 ] || fail "a 5 MB body is not 413 ($c)"
echo "basics: health, models, 401, 404, 405, 400 (JSON, role, max_tokens, type, id range, n), 413"

# ---- a whole and a streamed chat ----
c=$(code POST /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"model":"k3","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hello"}],"max_tokens":8}')
[ "$c" = 200 ] || fail "chat: $c $(cat "$T/body")"
$PY -c "
import json,sys; j=json.load(open('$T/body')); c=j['choices'][0]
assert j['object']=='chat.completion' and c['message']['role']=='assistant', j
assert c['finish_reason'] in ('stop','length'), c
assert 'reasoning_content' in c['message'], c
assert j['usage']['total_tokens']==j['usage']['prompt_tokens']+j['usage']['completion_tokens'], j
" || fail "chat reply shape"
curl -sN "$URL/v1/chat/completions" "${auth[@]}" "${json[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2}' > "$T/sse"
tail -c 14 "$T/sse" | grep -q 'data: \[DONE\]' || fail "stream does not end with data: [DONE]"
grep -q '"usage":{"prompt_tokens"' "$T/sse" || fail "stream without usage chunk"
grep -q '"top_logprobs":\[{' "$T/sse" || fail "stream without top_logprobs"
echo "chat: whole and streamed (SSE, [DONE], usage, logprobs)"

# ---- tool_choice: a named function forces the call; undeclared is 400; none returns no call ----
$PY - "$URL" "$KEY" <<'EOF' || fail "tool_choice"
import json, sys, urllib.request, urllib.error
url, key = sys.argv[1:3]
tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
         for n in ("get_time", "get_weather")]
def chat(extra):
    b = {"messages": [{"role": "user", "content": "What time is it?"}], "tools": tools, "max_tokens": 90,
         "thinking": False, "return_token_ids": True}
    b.update(extra)
    r = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(b).encode(),
                               headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        return 200, json.loads(urllib.request.urlopen(r).read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
for name in ("get_weather", "get_time"):
    code, j = chat({"tool_choice": {"type": "function", "function": {"name": name}}})
    assert code == 200, j
    c = j["choices"][0]
    calls = c["message"].get("tool_calls") or []
    assert len(calls) == 1 and calls[0]["function"]["name"] == name, c
    json.loads(calls[0]["function"]["arguments"])
    assert c["finish_reason"] in ("tool_calls", "length"), c
code, j = chat({"tool_choice": {"type": "function", "function": {"name": "launch"}}})
assert code == 400 and j["error"]["param"] == "tool_choice" and "launch" in j["error"]["message"], (code, j)
code, j = chat({"tool_choice": "none"})
assert code == 200 and not j["choices"][0]["message"].get("tool_calls") and j["choices"][0]["finish_reason"] != "tool_calls", j
print("tool_choice: named -> a call to that tool (both tools), undeclared -> 400 tool_choice, none -> no call")
EOF

# ---- stop strings: the text ends before the first match, finish_reason stop ----
$PY - "$URL" "$KEY" <<'EOF' || fail "stop strings"
import json, sys, urllib.request
url, key = sys.argv[1:3]
def req(extra):
    b = {"prompt": "the expert servers", "max_tokens": 24}
    b.update(extra)
    return urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=json.dumps(b).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})).read()
full = json.loads(req({}))["choices"][0]["text"]
printable = [i for i in range(4, len(full) - 3) if full[i:i + 3].isprintable() and full[i:i + 3].strip()]
assert printable, repr(full)
i = printable[len(printable) // 2]
stop = full[i:i + 3]
cut = full[:full.index(stop)]
got = json.loads(req({"stop": [stop, "never-there"]}))["choices"][0]
assert got["text"] == cut and got["finish_reason"] == "stop", (got, cut)
text, fr = "", None
for ev in req({"stop": stop, "stream": True}).split(b"\n\n"):
    if ev.startswith(b"data: {"):
        for c in json.loads(ev[6:])["choices"]:
            text += c.get("text", "")
            fr = c.get("finish_reason") or fr
assert text == cut and fr == "stop", (text, cut, fr)
print("stop strings: cut at %r (whole and streamed)" % stop)
EOF

# ---- tokenize / detokenize / metrics / page ----
[ "$(code POST /tokenize "${auth[@]}" "${json[@]}" -d '{"prompt":"the expert servers"}')" = 200 ] || fail "/tokenize"
toks=$($PY -c "import json; print(json.load(open('$T/body'))['tokens'])")
[ "$(code POST /detokenize "${auth[@]}" "${json[@]}" -d "{\"tokens\":$toks}")" = 200 ] || fail "/detokenize"
grep -q '"prompt":"the expert servers"' "$T/body" || fail "detokenize round trip: $(cat "$T/body")"
[ "$(code GET / )" = 200 ] && grep -q '<title>k3 chat</title>' "$T/body" || fail "GET / page"

# ---- load: concurrent requests equal the command line alone ----
$PY tests/server_client.py load "$URL" "$KEY" "$K3" "$M" 8 4 || fail "load test"

# ---- prefix reuse: the next turn of a conversation ----
$PY - "$URL" "$KEY" "$K3" "$M" <<'EOF' || fail "prefix reuse"
import json, subprocess, sys, urllib.request
url, key, k3, model = sys.argv[1:5]
def complete(prompt, n):
    b = {"prompt": prompt, "max_tokens": n, "return_token_ids": True}
    r = urllib.request.Request(url + "/v1/completions", data=json.dumps(b).encode(),
                               headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r).read())
def alone(p, n):
    out = subprocess.run([k3, model, "--ids", ",".join(map(str, p)), "--gen", str(n), "--workers", "0",
                          "--stop-id", "509,510"], capture_output=True, text=True, check=True).stdout.split()
    return [int(x) for x in out if int(x) not in (509, 510)]
# turn 1, then turn 2 = turn 1's prompt + its reply + more: the slot's kept state covers all but
# the reply's last id (generated, never fed)
p1 = [300 + i for i in range(40)]
a = complete(p1, 8)
g1 = a["choices"][0]["token_ids"]
p2 = p1 + g1 + [400 + i for i in range(10)]
b = complete(p2, 8)
cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
assert b["choices"][0]["token_ids"] == alone(p2, 8), (b["choices"][0]["token_ids"], alone(p2, 8))
print("prefix reuse: second turn skipped %d of %d prompt ids, ids equal the command line" % (cached, len(p2)))
assert cached == len(p1) + len(g1) - 1 or len(g1) < 8, cached
# turn 1's prompt + something else: no slot's history fits, the snapshot taken at the end of
# turn 1's prompt does
p3 = p1 + [450, 451, 452]
c = complete(p3, 6)
cached = c["usage"]["prompt_tokens_details"]["cached_tokens"]
assert c["choices"][0]["token_ids"] == alone(p3, 6), (c["choices"][0]["token_ids"], alone(p3, 6))
print("snapshot: a prompt extending turn 1's prompt restored %d of %d ids, ids equal the command line" % (cached, len(p3)))
assert cached == len(p1), cached
EOF

# ---- a client that disconnects is cancelled ----
$PY tests/server_client.py disconnect "$URL" "$KEY" || fail "disconnect client"
ok=0
for _ in $(seq 1 100); do
  curl -s "$URL/metrics" "${auth[@]}" > "$T/metrics"
  if grep -q '^k3_requests_cancelled_total [1-9]' "$T/metrics" && grep -q '^k3_active_sequences 0' "$T/metrics"; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || { cat "$T/metrics"; fail "a disconnected stream was not cancelled / its slot not freed"; }
grep -q '^k3_time_to_first_token_seconds_bucket' "$T/metrics" || fail "/metrics lacks the TTFT histogram"
grep -q '^k3_expert_cache_hit_ratio' "$T/metrics" || fail "/metrics lacks the expert cache hit ratio"
echo "disconnect: cancelled, slot freed; /metrics ok"

# ---- an expert server SIGKILLed during a stream ----
wpid=$(sed -n 's/^k3: worker 0 pid \([0-9]*\).*/\1/p' "$T/s.err.start" | head -1)
[ -n "$wpid" ] || fail "no worker pid"
$PY tests/server_client.py stream_ids "$URL" "$KEY" 40 > "$T/kill.json" &
cpid=$!
sleep 0.3
kill -KILL "$wpid" 2>/dev/null
wait $cpid || fail "the stream failed after the expert server was killed"
$PY - "$T/kill.json" "$K3" "$M" <<'EOF' || fail "answer after a SIGKILLed expert server"
import json, subprocess, sys
j = json.load(open(sys.argv[1]))
out = subprocess.run([sys.argv[2], sys.argv[3], "--ids", ",".join(map(str, j["prompt"])), "--gen", "40", "--workers", "0",
                      "--stop-id", "509,510"], capture_output=True, text=True, check=True).stdout.split()
ref = [int(x) for x in out if int(x) not in (509, 510)]
assert j["ids"] == ref, (j["ids"], ref)
print("expert server killed mid-stream: %d ids identical to the command line" % len(ref))
EOF
grep -q 'restart' "$T/s.err" || echo "note: no restart logged (the kill may have landed after the stream)"

# ---- the openai npm client ----
if command -v npm >/dev/null && (cd tests/openai_client && timeout 120 npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1); then
  K3_URL="$URL" K3_KEY="$KEY" timeout 120 node tests/openai_client/test.mjs || fail "openai client test"
else
  echo "SKIP openai npm client: npm cannot install the package (registry unreachable?)"
fi

# ---- the static page in headless Chromium ----
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$CHROME" ] && command -v node >/dev/null; then
  CHROME="$CHROME" K3_URL="$URL" K3_KEY="$KEY" OUT="$T" timeout 120 node tests/webpage_test.js || fail "chat page in Chromium"
else
  echo "SKIP chat page: no chromium or node"
fi

# ---- K2 / Kimi Linear template: a tokenizer with <|im_*|> specials selects it ----
mkdir -p "$T/k2tok"
cp "$M/tiktoken.model" "$T/k2tok/"
$PY - "$M/tokenizer_config.json" "$T/k2tok/tokenizer_config.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
names = {"510": "<|im_end|>", "511": "<|im_user|>", "512": "<|im_assistant|>", "513": "<|im_system|>", "514": "<|im_middle|>"}
for k, v in names.items():
    d["added_tokens_decoder"][k]["content"] = v
d["additional_special_tokens"] = [t for t in d.get("additional_special_tokens", []) if t not in
                                  ("<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>")] + list(names.values())
json.dump(d, open(sys.argv[2], "w"), indent=1)
EOF
start k2 --workers 0 --tok "$T/k2tok" --parallel 2
$PY - "$URL" "$K3" "$M" "$T/k2tok" <<'EOF' || fail "K2 template"
import json, subprocess, sys, urllib.request, urllib.error
url, k3, model, tok = sys.argv[1:5]
def post(path, b):
    r = urllib.request.Request(url + path, data=json.dumps(b).encode(), headers={"Content-Type": "application/json"})
    try:
        return 200, json.loads(urllib.request.urlopen(r).read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And now?"}]
code, t = post("/tokenize", {"messages": msgs})
assert code == 200, t
code, d = post("/detokenize", {"tokens": t["tokens"]})
want = ("<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi <|im_end|> there<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>Hello!<|im_end|><|im_user|>user<|im_middle|>And now?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>")
assert d["prompt"] == want, d["prompt"]
assert t["tokens"].count(510) == 4, "the typed <|im_end|> must stay text"
code, j = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "return_token_ids": True})
assert code == 200, j
c = j["choices"][0]
out = subprocess.run([k3, model, "--ids", ",".join(map(str, t["tokens"])), "--gen", "12", "--workers", "0",
                      "--stop-id", "509,510"], capture_output=True, text=True, check=True).stdout.split()
ref = [int(x) for x in out]
got = c["token_ids"]
assert got == ref, (got, ref)
assert "reasoning_content" not in c["message"] or not c["message"]["reasoning_content"], c
code, j = post("/v1/chat/completions", {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}],
                                        "tool_choice": {"type": "function", "function": {"name": "f"}}})
assert code == 400 and j["error"]["param"] == "tool_choice", j
print("K2 template: <|im_*|> rendering = the jinja text, reply ids = the command line, named tool_choice 400")
EOF
kill -TERM $SPID; wait $SPID || fail "K2 server exit status"

# ---- prefix snapshots on disk (--state-dir): reused after a restart ----
SD="$T/snaps"
sdreq() { # sdreq PROMPT_JSON N: completion ids + cached count as JSON
  curl -s "$URL/v1/completions" "${json[@]}" -d "{\"prompt\":$1,\"max_tokens\":$2,\"return_token_ids\":true}"
}
P1=$($PY -c "print([300 + i for i in range(40)])")
P2=$($PY -c "print([300 + i for i in range(40)] + [450, 451, 452])")
start sd1 --workers 0 --parallel 2 --state-dir "$SD"
sdreq "$P1" 6 > "$T/sd1.json"
kill -TERM $SPID; wait $SPID || fail "state-dir server exit status"
ls "$SD"/*.k3snap >/dev/null 2>&1 || fail "no snapshot file written in --state-dir"
start sd2 --workers 0 --parallel 2 --state-dir "$SD"
sdreq "$P2" 6 > "$T/sd2.json"
curl -s "$URL/metrics" > "$T/sd.metrics"
kill -TERM $SPID; wait $SPID || fail "state-dir server exit status (2)"
$PY - "$T/sd2.json" "$T/sd.metrics" "$K3" "$M" "$P2" <<'EOF' || fail "snapshot from disk after a restart"
import json, subprocess, sys
j = json.load(open(sys.argv[1]))
metrics = dict(l.split()[:2] for l in open(sys.argv[2]) if l and not l.startswith("#"))
p2 = json.loads(sys.argv[5])
cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
assert cached == 40, ("cached", cached)
assert int(metrics["k3_snapshot_disk_hits_total"]) >= 1, metrics.get("k3_snapshot_disk_hits_total")
out = subprocess.run([sys.argv[3], sys.argv[4], "--ids", ",".join(map(str, p2)), "--gen", "6", "--workers", "0",
                      "--stop-id", "509,510"], capture_output=True, text=True, check=True).stdout.split()
assert j["choices"][0]["token_ids"] == [int(x) for x in out], (j["choices"][0]["token_ids"], out)
print("state-dir: after a restart, 40 of %d prompt ids restored from disk (k3_snapshot_disk_hits_total %s), ids equal the command line"
      % (len(p2), metrics["k3_snapshot_disk_hits_total"]))
EOF

# ---- a full queue answers 429 ----
start q --workers 0 --parallel 1 --max-queue 1 --http-timeout 1
QURL=$URL
# the idle timeout (1 s) does not cut a client that waits longer than that for its tokens
$PY -c "import json; print(json.dumps({'prompt': list(range(1, 301)) * 5, 'max_tokens': 3, 'stream': True}))" > "$T/long.json"
curl -sN "$QURL/v1/completions" "${json[@]}" --data-binary @"$T/long.json" > "$T/long.sse"
tail -c 14 "$T/long.sse" | grep -q 'data: \[DONE\]' || fail "a stream waiting longer than --http-timeout was cut"
# ... but a client that sends half a request and stalls is dropped after it
$PY - "$QURL" <<'EOF' || fail "a stalled client was not dropped"
import socket, sys, time
from urllib.parse import urlparse
u = urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
s.settimeout(20)
t = time.time()
try:
    got = s.recv(4096)
except ConnectionResetError:
    got = b""
assert got == b"" or b" 408 " in got.split(b"\r\n")[0] or b"HTTP/1.1 4" in got, got[:80]
print("slow client: dropped after %.1f s (--http-timeout 1)" % (time.time() - t))
EOF
for i in 1 2 3; do
  curl -s -o /dev/null -w '%{http_code}\n' -D "$T/q$i.h" "$QURL/v1/completions" "${json[@]}" -d '{"prompt":"x","max_tokens":400}' > "$T/q$i.code" &
done
sleep 0.5
qpid=$SPID
for _ in $(seq 1 300); do
  n=$(cat "$T"/q?.code 2>/dev/null | grep -c .)
  [ "$n" -ge 1 ] && grep -q 429 "$T"/q?.code && break
  sleep 0.1
done
grep -q 429 "$T"/q?.code || fail "a full queue did not answer 429"
grep -qi '^Retry-After:' $(grep -l 429 "$T"/q?.code | sed 's/code$/h/') || fail "429 without Retry-After"
kill -TERM $qpid; wait $qpid; qs=$?
[ $qs = 0 ] || fail "queue server exit status $qs after SIGTERM"
echo "queue: 429 with Retry-After when full"

# ---- SIGTERM ----
kill -TERM "$MAIN"
wait "$MAIN"; st=$?
[ $st = 0 ] || fail "exit status $st after SIGTERM"
for p in $(sed -n 's/^k3: worker [0-9]* pid \([0-9]*\).*/\1/p' "$T/s.err"); do
  alive "$p" && fail "expert server $p outlived the server"
done
[ "$(shm_count)" = "$shm0" ] || fail "shared-memory objects left after SIGTERM"
PIDS=()
echo "SIGTERM: exit 0, no expert server, no /dev/shm object left"
echo "t_80_server: all passed"
