#!/usr/bin/env bash
# `make bench`: runs every scripts/bench_*.sh in name order. Benchmarks print
# their results on stdout; docs/PERFORMANCE.md records them with machine and command.
set -eu
cd "$(dirname "$0")/.."
for b in scripts/bench_*.sh; do
  [ -f "$b" ] || continue
  echo "### $b"
  bash "$b"
done
