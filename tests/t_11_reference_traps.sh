#!/usr/bin/env bash
# The reference (scripts/k3ref.py) reproduces the committed fixtures, and every trap of
# spec section 5 (each sprung with --trap NAME: the plausible wrong reading) changes the
# teacher-forced predictions or the greedy ids on at least one of the two test models
# (or is refused, when the wrong reading cannot even load the checkpoint).  Traps marked
# "info" in k3ref.py --list-traps cannot change ids by construction; they are reported only.
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-/usr/bin/python3}"
base="${K3_TEST_TMP:-$(mktemp -d)}"
tmp="$base/t11"
rm -rf "$tmp"
mkdir -p "$tmp"
models="m13 m14b12"
fail=0

# 1. the unsprung reference reproduces each fixture (ids and logits, byte for byte)
for m in $models; do
  fx="tests/expected/$m.json"
  read -r P N V < <("$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(",".join(map(str,d["prompt_ids"])), d["n_gen"], d["vocab_size"])' "$fx")
  echo "$P $N" >"$tmp/$m.args"
  if ! "$PYTHON" scripts/k3ref.py "tests/models/$m" --ids "$P" --gen "$N" --teacher-force \
       --json "$tmp/$m.ref.json" --dump-logits "$tmp/$m.ref.f32" >"$tmp/$m.ref.log" 2>&1; then
    echo "FAIL: reference failed on $m:"; cat "$tmp/$m.ref.log"; fail=1; continue
  fi
  if ! "$PYTHON" - "$fx" "$tmp/$m.ref.json" <<'EOF'
import json, sys
fx, got = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bad = [k for k in ("prompt_ids", "tf_pred", "generated_ids") if fx[k] != got[k]]
for k in bad:
    print("FAIL: %s differs:\n  fixture   %s\n  reference %s" % (k, fx[k], got[k]))
sys.exit(1 if bad else 0)
EOF
  then fail=1; fi
  if ! cmp "$tmp/$m.ref.f32" "tests/expected/$m.logits.f32"; then
    echo "FAIL: reference logits differ from tests/expected/$m.logits.f32:"
    "$PYTHON" scripts/compare_logits.py "$tmp/$m.ref.f32" "tests/expected/$m.logits.f32" --vocab "$V" --tol 0 --exact-rows
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "OK: the unsprung reference reproduces both fixtures"

# 2. every trap on both models: one process per model (in parallel), each calling the
#    reference's CLI entry point k3ref.main([... --trap NAME]) once per trap
traps=$("$PYTHON" scripts/k3ref.py --list-traps | awk '{print $1}')
for m in $models; do
  read -r P N <"$tmp/$m.args"
  "$PYTHON" - "$tmp" "$m" "$P" "$N" $traps <<'EOF' &
import contextlib, io, sys
sys.path.insert(0, "scripts")
import k3ref
tmp, m, P, N = sys.argv[1:5]
for t in sys.argv[5:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = k3ref.main(["tests/models/" + m, "--ids", P, "--gen", N, "--teacher-force", "--trap", t,
                             "--json", "%s/%s.%s.json" % (tmp, t, m)])
        except Exception:
            import traceback
            traceback.print_exc()
            rc = 1
    open("%s/%s.%s.log" % (tmp, t, m), "w").write(out.getvalue())
    open("%s/%s.%s.rc" % (tmp, t, m), "w").write("%d\n" % rc)
EOF
done
wait

"$PYTHON" - "$tmp" "$models" $traps <<'EOF' || fail=1
import json, os, subprocess, sys
tmp, models, traps = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
info, item = {}, {}
for line in subprocess.run([sys.executable, "scripts/k3ref.py", "--list-traps"], capture_output=True, text=True).stdout.splitlines():
    info[line.split()[0]] = "[info:" in line
    item[line.split()[0]] = line.split()[1]
fx = {m: json.load(open("tests/expected/%s.json" % m)) for m in models}
print("%-24s %-4s %s" % ("trap", "item", "  ".join("%-22s" % m for m in models)) + "  verdict")
bad = 0
for t in traps:
    cells, caught = [], []
    for m in models:
        try:
            rc = int(open("%s/%s.%s.rc" % (tmp, t, m)).read().strip())
        except (OSError, ValueError):
            rc = -1
        if rc == 2:
            msg = open("%s/%s.%s.log" % (tmp, t, m)).read().strip().splitlines()[-1:]
            cells.append("refused")
            caught.append(m)
            continue
        if rc != 0:
            cells.append("ERROR rc=%d" % rc)
            continue
        got = json.load(open("%s/%s.%s.json" % (tmp, t, m)))
        ntf = sum(a != b for a, b in zip(got["tf_pred"], fx[m]["tf_pred"]))
        first = next((i for i, (a, b) in enumerate(zip(got["generated_ids"], fx[m]["generated_ids"])) if a != b), None)
        if first is None and len(got["generated_ids"]) != len(fx[m]["generated_ids"]):
            first = min(len(got["generated_ids"]), len(fx[m]["generated_ids"]))
        if ntf or first is not None:
            caught.append(m)
            cells.append("tf %d/%d, gen@%s" % (ntf, len(fx[m]["tf_pred"]), "-" if first is None else first))
        else:
            cells.append("not caught")
    if caught:
        verdict = "caught by " + ",".join(caught)
        open("%s/%s.caught" % (tmp, t), "w").close()
    elif info.get(t):
        verdict = "info only (not observable through ids)"
    else:
        verdict = "FAIL: caught by no model"
        bad += 1
    print("%-24s %-4s %s  %s" % (t, item.get(t, "?"), "  ".join("%-22s" % c for c in cells), verdict))
items_caught = {item.get(t) for t in traps if os.path.exists("%s/%s.caught" % (tmp, t))}
missing = [str(i) for i in range(1, 12) if str(i) not in items_caught]
if missing:
    print("FAIL: no caught trap for spec section 5 item(s) %s" % ", ".join(missing))
    bad += 1
print("%d traps, %d not caught; section 5 items with a caught trap: %s" % (
    len(traps), bad, " ".join(sorted((i for i in items_caught if i.isdigit()), key=int))))
sys.exit(1 if bad else 0)
EOF
exit "$fail"
