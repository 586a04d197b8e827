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
