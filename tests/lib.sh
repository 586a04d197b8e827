# tests/lib.sh - shell helpers sourced by tests/t_*.sh (after they `cd` to the repository root
# and set PY, the Python that runs the JSON reads).
#   jget FILE a.b.c   prints the value at that key path of the JSON file FILE (a missing key
#                     fails the Python, so the caller's check fails)
#   gen_preset PRESET DIR   generates scripts/gen_model.py's PRESET into DIR unless DIR has a
#                     config.json (no expected outputs); on failure prints the generator's log
#                     (DIR.log) and returns 1
jget() {
  $PY -c "import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'): d=d[k]
print(d)" "$1" "$2"
}
gen_preset() {
  [ -f "$2/config.json" ] && return 0
  mkdir -p "$(dirname "$2")"
  $PY scripts/gen_model.py --preset "$1" --out "$2" --no-expected > "$2.log" 2>&1 || { cat "$2.log"; return 1; }
}
