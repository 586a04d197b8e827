#!/usr/bin/env bash
# Part of `make asan`: the sanitizer-built engine runs the committed models
# (incremental and full recompute) and must agree with the normal build's ids;
# --verify --sha256 on each and --doctor run clean.
set -euo pipefail
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin-asan/k3}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for m in tests/models/*/; do
  name=$(basename "$m")
  exp="tests/expected/$name.json"
  [ -f "$exp" ] || continue
  ids=$(/usr/bin/python3 -c "import json,sys; print(','.join(map(str, json.load(open('$exp'))['prompt_ids'])))")
  want=$(/usr/bin/python3 -c "import json,sys; print(' '.join(map(str, json.load(open('$exp'))['generated_ids'][:8])))")
  for mode in "" "--full-recompute"; do
    got=$("$K3_BIN" "$m" --ids "$ids" --gen 8 --threads 2 $mode)
    if [ "$got" != "$want" ]; then echo "asan gate $name $mode: got '$got' want '$want'"; exit 1; fi
  done
  "$K3_BIN" --verify "$m" --sha256 >/dev/null 2>&1 || { echo "asan gate $name: --verify --sha256 failed"; exit 1; }
  echo "asan gate $name ok"
done
"$K3_BIN" --doctor tests/models/m13 >/dev/null 2>&1 || { echo "asan gate: --doctor failed"; exit 1; }
echo "asan gate --doctor ok"
# --serve: a whole and a streamed chat, a completion, a refusal, a dropped stream, then SIGTERM
# must exit 0 (LeakSanitizer runs at exit: a leak changes the status)
serr=$(mktemp)
"$K3_BIN" tests/models/m13 --serve --port 0 --workers 1 --parallel 2 2>"$serr" >/dev/null &
spid=$!
for _ in $(seq 1 300); do grep -q 'serving on' "$serr" && break; sleep 0.1; done
url=$(sed -n 's/.*serving on \(http:[^ ]*\).*/\1/p' "$serr")
[ -n "$url" ] || { cat "$serr"; echo "asan gate: --serve did not start"; exit 1; }
curl -sf "$url/v1/chat/completions" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"logprobs":true,"top_logprobs":2}' >/dev/null
curl -sfN "$url/v1/chat/completions" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"tools":[{"type":"function","function":{"name":"f"}}]}' | grep -q 'data: \[DONE\]'
curl -sf "$url/v1/completions" -d '{"prompt":[1,2,3],"max_tokens":4,"stop":["a"]}' >/dev/null
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -d '{"prompt":[1,99999]}')" = 400 ]
curl -sN -m 1 "$url/v1/completions" -d '{"prompt":"x","max_tokens":2000,"stream":true}' >/dev/null || true
kill -TERM "$spid"
wait "$spid" || { cat "$serr"; echo "asan gate: --serve did not exit 0 after SIGTERM"; exit 1; }
rm -f "$serr"
echo "asan gate --serve ok"
