#!/usr/bin/env bash
# docs/ARCHITECTURE.md lists every module: each common/, coordinator/ and workers/ source
# (name.c / name.h) appears in the Modules table, as `dir/name`, as a bare `name` in a row
# that names `dir/...` first, or under a prefix like `common/kernels*`. And the code cites
# docs/MODEL.md (in the repository), not the spec outside it. Every unit test includes
# tests/unit/check.h and defines no CHECK of its own.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-/usr/bin/python3}"
"$PY" - <<'EOF' || exit 1
import glob, os, re, sys
doc = open("docs/ARCHITECTURE.md").read()
m = re.search(r"^## Modules\n(.*?)(?=^## )", doc, re.S | re.M)
if not m:
    sys.exit("FAIL: docs/ARCHITECTURE.md has no '## Modules' section")
listed, prefixes = set(), []
for line in m.group(1).splitlines():
    if not line.startswith("| `"):
        continue
    first = line.split("|")[1]
    cur = None
    for tok in re.findall(r"`([^`]+)`", first):
        if "/" in tok:
            cur, name = tok.split("/", 1)
        elif cur:
            name = tok
        else:
            continue
        if name.endswith("*"):
            prefixes.append((cur, name[:-1]))
        else:
            listed.add((cur, name))
missing = []
for d in ("common", "coordinator", "workers"):
    for f in sorted(glob.glob(d + "/*.[ch]")):
        name = os.path.splitext(os.path.basename(f))[0]
        if (d, name) in listed or any(d == pd and name.startswith(pp) for pd, pp in prefixes):
            continue
        missing.append(d + "/" + name)
if missing:
    print("FAIL: modules missing from the Modules table of docs/ARCHITECTURE.md (add a row saying what each does):")
    for x in sorted(set(missing)):
        print("  " + x)
    sys.exit(1)
print("every module is listed (%d named, %d prefixes)" % (len(listed), len(prefixes)))
bad = []
for d in ("common", "coordinator", "workers"):
    for f in sorted(glob.glob(d + "/*.[ch]")):
        for i, line in enumerate(open(f, errors="replace"), 1):
            if "K3-MODEL.md" in line:
                bad.append("%s:%d" % (f, i))
if bad:
    print("FAIL: code cites K3-MODEL.md (outside the repository); cite docs/MODEL.md sections:")
    for x in bad:
        print("  " + x)
    sys.exit(1)
print("the code cites docs/MODEL.md")
# one CHECK macro: every unit test includes tests/unit/check.h and none defines its own
bad = []
for f in sorted(glob.glob("tests/unit/test_*.c")):
    src = open(f, errors="replace").read()
    if not re.search(r'^#include "(tests/unit/)?check\.h"', src, re.M):
        bad.append(f + ": does not include tests/unit/check.h")
    if re.search(r"^\s*#\s*define\s+CHECK\b", src, re.M):
        bad.append(f + ": defines its own CHECK")
if bad:
    print("FAIL: unit tests and the one CHECK (tests/unit/check.h):")
    for x in bad:
        print("  " + x)
    sys.exit(1)
print("every unit test uses tests/unit/check.h")
EOF
echo ok
