#!/bin/sh
# ensure_deps.sh [build|test|fuzz|all]: make sure the Debian packages k3 needs are installed.
# The list is scripts/debian-packages.txt (one "GROUP PACKAGE # why" per line). `build` checks
# the build group; `test` and `fuzz` check build plus that group; `all` checks every line.
# Missing packages are found with dpkg-query. As root they are installed (apt-get update, then
# apt-get install of only the missing ones) and the script exits 0; as another user it prints
# the one `sudo apt-get install ...` line needed and exits 2. Nothing missing: silent, exit 0.
# Not a Debian system (no dpkg-query), or K3_SKIP_DEPS=1: a note on stderr, exit 0 (the
# build then says what is missing).
set -eu
group="${1:-build}"
case "$group" in build|test|fuzz|all) ;; *) echo "ensure_deps.sh: unknown group '$group' (build|test|fuzz|all)" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
list="$here/debian-packages.txt"
if [ "${K3_SKIP_DEPS:-0}" = 1 ]; then exit 0; fi
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "ensure_deps.sh: no dpkg-query (not Debian): not checking packages; see $list" >&2
  exit 0
fi
wanted=$(sed 's/#.*//' "$list" | awk -v g="$group" 'NF >= 2 && ($1 == "build" || g == "all" || $1 == g) { print $2 }')
missing=""
for p in $wanted; do
  st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$st" = installed ] || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "k3: missing Debian packages ($group):$missing" >&2
  echo "k3: install them with:" >&2
  echo "sudo apt-get install -y --no-install-recommends$missing"
  exit 2
fi
echo "k3: installing missing Debian packages ($group):$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >&2
