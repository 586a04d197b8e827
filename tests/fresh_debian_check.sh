#!/usr/bin/env bash
# fresh_debian_check.sh [ROOT] [--test-deps] [--make-test]: the "set-up in one command" check on a fresh
# Debian 12 (not part of `make test`: it downloads ~300 MB and takes minutes; run as root).
#   1. debootstrap --variant=minbase bookworm ROOT (default /work/chroot) unless it exists,
#      then only gcc, make and git are added;
#   2. the repository is cloned inside (`git clone -b BRANCH` of this checkout's git directory,
#      bind-mounted read-only: what is committed on the current branch is tested);
#   3. as a non-root user `make demo` must exit 2 (make's status for a failed recipe)
#      after scripts/ensure_deps.sh printed one `sudo apt-get install ...` line naming the
#      missing packages (and exited 2 itself), without compiling anything;
#   4. as root `make demo` must install the missing packages and generate (exit 0);
#   5. as the non-root user `make demo` then works too;
#   6. with --test-deps: as root `scripts/ensure_deps.sh test` installs the test group, and a
#      second run finds nothing missing;
#   7. with --make-test: as root the README's `make test` (it installs the test group itself)
#      must pass; ROOT is then bind-mounted onto itself and /dev and /sys bound inside, so that
#      `ip netns exec` (t_90's two hosts) can remount / as it does on a machine (in a plain
#      chroot "mount --make-rslave /" fails: / is no mount point there).
# Each step prints PASS/FAIL; exit status 0 when all passed. Mounts are undone on exit.
set -u
R=/work/chroot; TESTDEPS=0; MAKETEST=0
for a in "$@"; do case $a in --test-deps) TESTDEPS=1 ;; --make-test) MAKETEST=1 ;; *) R=$a ;; esac; done
REPO=$(cd "$(dirname "$0")/.." && pwd)
GITDIR=$(cd "$REPO" && cd "$(git rev-parse --git-common-dir)" && pwd)   # works from a worktree too
BRANCH=$(git -C "$REPO" rev-parse --abbrev-ref HEAD)                     # its committed state is tested
[ "$(id -u)" = 0 ] || { echo "fresh_debian_check.sh: run as root (debootstrap, chroot)"; exit 2; }
fail=0
pass() { echo "PASS $*"; }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
if [ ! -x "$R/usr/bin/apt-get" ]; then
  echo "== debootstrap --variant=minbase bookworm $R" >&2
  debootstrap --variant=minbase bookworm "$R" http://deb.debian.org/debian >&2 || { echo "debootstrap failed"; exit 1; }
fi
cp /etc/resolv.conf "$R/etc/resolv.conf"
mkdir -p "$R/proc" "$R/dev/shm" "$R/src/k3"
mounted=()
mnt() { mount "$@" && mounted=("${@: -1}" "${mounted[@]}"); }
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null; done; }
trap cleanup EXIT
if [ $MAKETEST = 1 ]; then mnt --bind "$R" "$R" && mount --make-rslave "$R"; fi # no mount inside propagates out
mnt -t proc proc "$R/proc"
if [ $MAKETEST = 1 ]; then mkdir -p "$R/dev" "$R/sys"; mnt --rbind /dev "$R/dev" && mount --make-rslave "$R/dev"
  mnt --rbind /sys "$R/sys" && mount --make-rslave "$R/sys"; fi
mnt -t tmpfs -o mode=1777 shm "$R/dev/shm"
mnt --bind "$GITDIR" "$R/src/k3" && mount -o remount,bind,ro "$R/src/k3"
asroot() { chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
asuser() { chroot --userspec=1000:1000 "$R" env -i PATH=/usr/bin:/bin HOME=/home/u LANG=C.UTF-8 "$@"; }

echo "== adding gcc make git" >&2
asroot sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq gcc make git >/dev/null' \
  || { echo "installing gcc make git failed"; exit 1; }
asroot sh -c 'id u >/dev/null 2>&1 || useradd -m -u 1000 u'
asroot git config --system --add safe.directory '*'
asroot sh -c 'rm -rf /root/k3 /home/u/k3 && git clone -q -b '"$BRANCH"' /src/k3 /root/k3 && su u -c "git clone -q -b '"$BRANCH"' /src/k3 /home/u/k3"' \
  || { echo "git clone failed"; exit 1; }
echo "== chroot has: $(asroot dpkg-query -W -f='${Package} ' gcc make git libjansson-dev 2>/dev/null)" >&2

# 3. non-root, nothing installed yet
out=$(asuser sh -c 'cd /home/u/k3 && make demo' 2>&1); rc=$?
line=$(printf '%s\n' "$out" | grep '^sudo apt-get install')
if [ $rc -eq 2 ] && [ "$(printf '%s\n' "$line" | wc -l)" = 1 ] && printf '%s' "$line" | grep -q libjansson-dev \
   && ! printf '%s' "$out" | grep -q 'gcc\|cc -O2'; then
  pass "non-root make demo: exit 2 with: $line"
else bad "non-root make demo: exit $rc, output:"; printf '%s\n' "$out" | tail -n 8; fi
out=$(asuser sh -c 'cd /home/u/k3 && scripts/ensure_deps.sh build' 2>/dev/null); rc=$?
[ $rc -eq 2 ] && pass "non-root ensure_deps.sh: exit 2" || bad "non-root ensure_deps.sh: exit $rc"

# 4. root: installs then generates
echo "== root: make demo (installs the build group, builds, generates)" >&2
start=$(date +%s)
asroot sh -c 'cd /root/k3 && make -j2 demo' >"$R/tmp/demo.log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q 'installing missing Debian packages' "$R/tmp/demo.log" && grep -q 'worker 0 pid' "$R/tmp/demo.log"; then
  pass "root make demo: installed, built and generated in $(( $(date +%s)-start )) s"
else bad "root make demo: exit $rc"; tail -n 15 "$R/tmp/demo.log"; fi
asroot sh -c 'cd /root/k3 && scripts/ensure_deps.sh build' && pass "root: nothing missing after make demo" || bad "root: still missing"

# 5. non-root works now
asuser sh -c 'cd /home/u/k3 && make -j2 demo' >"$R/tmp/demo-u.log" 2>&1 && pass "non-root make demo after the install" \
  || { bad "non-root make demo after install"; tail -n 8 "$R/tmp/demo-u.log"; }

# 6. the test group
if [ $TESTDEPS = 1 ]; then
  echo "== root: scripts/ensure_deps.sh test" >&2
  start=$(date +%s)
  if asroot sh -c 'cd /root/k3 && scripts/ensure_deps.sh test' >"$R/tmp/deps-test.log" 2>&1; then
    pass "root ensure_deps.sh test: installed in $(( $(date +%s)-start )) s"
  else bad "root ensure_deps.sh test"; tail -n 15 "$R/tmp/deps-test.log"; fi
  asuser sh -c 'cd /home/u/k3 && scripts/ensure_deps.sh test' && pass "non-root: test group complete" || bad "test group still missing"
fi
# 7. the README's test command
if [ $MAKETEST = 1 ]; then
  echo "== root: make test" >&2
  start=$(date +%s)
  if asroot sh -c 'cd /root/k3 && make test' >"$R/tmp/make-test.log" 2>&1; then
    pass "root make test: $(grep -E '^[0-9]+/[0-9]+ passed' "$R/tmp/make-test.log") in $(( $(date +%s)-start )) s"
  else bad "root make test"; grep -E '^FAIL|passed' "$R/tmp/make-test.log" | tail -n 15; fi
  umount -l "$R/run/netns" 2>/dev/null # ip netns's own mount, if a test left it
fi
[ $fail -eq 0 ] && echo "fresh_debian_check: all passed" || echo "fresh_debian_check: $fail failed"
[ $fail -eq 0 ]
