# tests/lib.sh - shell helpers sourced by tests/t_*.sh (after they `cd` to the repository root
# and set PY, the Python that runs the JSON reads).
#   jget FILE a.b.c   prints the value at that key path of the JSON file FILE (a missing key
#                     fails the Python, so the caller's check fails)
jget() {
  $PY -c "import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'): d=d[k]
print(d)" "$1" "$2"
}
