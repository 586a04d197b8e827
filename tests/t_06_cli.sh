#!/usr/bin/env bash
# t_06_cli.sh - the command line cannot drift from its documentation: README.md's options
# block is exactly `bin/k3 --help-markdown` (both come from the flag table in
# coordinator/cli.c; `make readme-options` rewrites the README), `--help` exits 0 on stdout,
# and an unknown flag or a bad value exits 2 naming the flag.
# Env (from tests/run.sh): K3_BIN, PYTHON.
set -u
cd "$(dirname "$0")/.."
K3_BIN="${K3_BIN:-bin/k3}"
PYTHON="${PYTHON:-/usr/bin/python3}"
fail=0
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

"$PYTHON" scripts/readme_options.py --check "$K3_BIN" || bad "README options table differs from --help-markdown"
out=$("$K3_BIN" --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] || bad "--help exit $rc"
case "$out" in *--expert-cache-mb*) ;; *) bad "--help lacks --expert-cache-mb" ;; esac
# every flag of the markdown table is accepted by the parser (as an option, i.e. not "unknown")
for fl in $("$K3_BIN" --help-markdown | grep -o '`--[a-z-]*' | tr -d '`' | sort -u); do
  case $fl in --help|--help-markdown|--list-presets) continue ;; esac
  err=$("$K3_BIN" "$fl" 2>&1 >/dev/null)
  case "$err" in *"unknown or incomplete option '$fl'"*)
    # a flag that wants a value is "incomplete" without one; give it one
    err=$("$K3_BIN" "$fl" x 2>&1 >/dev/null)
    case "$err" in *unknown*) bad "$fl is in the table but the parser does not know it" ;; esac ;;
  esac
done
err=$("$K3_BIN" tests/models/m13 --ids 1 --bogus 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || bad "--bogus exit $rc"
case "$err" in *--bogus*) ;; *) bad "--bogus not named: $err" ;; esac
err=$("$K3_BIN" tests/models/m13 --ids 1 --gen -3 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || bad "--gen -3 exit $rc"
case "$err" in *"--gen wants an integer"*) ;; *) bad "--gen -3 not named: $err" ;; esac
[ $fail -eq 0 ] && echo "t_06_cli: ok"
[ $fail -eq 0 ]
