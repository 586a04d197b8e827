#!/usr/bin/env bash
# The committed test models and their expected outputs are exactly what
# scripts/gen_model.py writes: regenerate both presets into a temp dir and cmp every file.
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-/usr/bin/python3}"
base="${K3_TEST_TMP:-$(mktemp -d)}"
tmp="$base/t10"
rm -rf "$tmp"
mkdir -p "$tmp"
fail=0
for m in m13 m14b12; do
  if ! "$PYTHON" scripts/gen_model.py --preset "$m" --out "$tmp/models/$m" --expected-dir "$tmp/expected" >"$tmp/$m.log" 2>&1; then
    echo "FAIL: gen_model.py --preset $m failed:"; cat "$tmp/$m.log"; fail=1; continue
  fi
  # same file names
  a=$(cd "tests/models/$m" && ls | sort | tr '\n' ' ')
  b=$(cd "$tmp/models/$m" && ls | sort | tr '\n' ' ')
  if [ "$a" != "$b" ]; then
    echo "FAIL: $m file lists differ: committed [$a] regenerated [$b]"; fail=1
  fi
  for f in "$tmp/models/$m"/*; do
    n=$(basename "$f")
    if ! cmp "tests/models/$m/$n" "$f"; then echo "FAIL: tests/models/$m/$n differs from the regenerated file"; fail=1; fi
  done
  for n in "$m.json" "$m.logits.f32"; do
    if ! cmp "tests/expected/$n" "$tmp/expected/$n"; then echo "FAIL: tests/expected/$n differs from the regenerated file"; fail=1; fi
  done
  sz=$(cat "tests/models/$m"/* | wc -c)
  echo "$m: $(ls "tests/models/$m" | wc -l) files, $sz bytes"
  if [ "$sz" -ge 2000000 ]; then echo "FAIL: tests/models/$m is $sz bytes (limit 2,000,000)"; fail=1; fi
done
[ "$fail" -eq 0 ] && echo "OK: both fixtures regenerate byte for byte"
exit "$fail"
