#!/usr/bin/env bash
# scripts/bench_mpi.sh - expert ranks over MPI (issue 12) on the real-width model, in one hold
# of $BENCH_LOCK: in-process, 1/2/4 expert ranks over shared memory (vader) and TCP, the
# waiting variants (sleeping polls, Open MPI's spin, spin + mpi_yield_when_idle, default
# binding) and local servers behind a rank. One JSON per run in OUT (default
# /tmp/k3-bench-mpi), plus load.txt, ceilings.txt and rss.txt (the largest sum of the RSS of
# every k3 / k3-expertd process seen during each run, sampled every 0.5 s). Tables:
# scripts/bench_mpi_md.py OUT. The prompt (32 ids) warms the expert caches in the prefill, so
# the decode tokens (GEN-1) are timed warm.
set -u
cd "$(dirname "$0")/.."
MODEL=${MODEL:-/work/models-big/rw6}
OUT=${OUT:-/tmp/k3-bench-mpi}
GEN=${GEN:-6}
RUNS=${RUNS:-all}
BENCH_LOCK=${BENCH_LOCK:-/work/bench.lock}
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
mkdir -p "$OUT"
K3=$(readlink -f bin/k3)
EXPERTD=$(readlink -f bin/k3-expertd)
ids8=${IDS8:-163584,1000,2000,3000,4000,5000,6000,7000}
ids32=$ids8,$ids8,$ids8,$ids8
MPI="mpirun --allow-run-as-root --oversubscribe"
log() { echo "bench_mpi: $(date -u +%T) $*" >&2; echo "$(date -u +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"; }
rss_sum() { local s=0 p e; for p in /proc/[0-9]*; do e=$(readlink $p/exe 2>/dev/null) || continue
  [ "$e" = "$K3" ] || [ "$e" = "$EXPERTD" ] || continue
  s=$((s + $(awk '/^VmRSS/{print $2}' $p/status 2>/dev/null || echo 0))); done; echo $s; }
run() {
  local name=$1; shift
  case " $RUNS " in *" all "*|*" $name "*) ;; *) return;; esac
  log "run $name: $*"
  ( m=0; while :; do s=$(rss_sum); [ "$s" -gt "$m" ] && { m=$s; echo "$m" > "$OUT/$name.rss"; }; sleep 0.5; done ) &
  local smp=$!
  /usr/bin/time -f "%e s wall" "$@" --json "$OUT/$name.json" > "$OUT/$name.out" 2> "$OUT/$name.err" || log "run $name FAILED (see $OUT/$name.err)"
  kill $smp; wait $smp 2>/dev/null
  echo "$name $(cat "$OUT/$name.rss" 2>/dev/null) kB" >> "$OUT/rss.txt"
}
A="$MODEL --ids $ids32 --gen $GEN"

log "waiting for $BENCH_LOCK"
exec 9>> "$BENCH_LOCK"
flock 9
log "lock held; free: $(free -m | awk '/Mem:/{print $7}') MB available"
[ -x bin/bench_kernels ] && bin/bench_kernels --ceilings > "$OUT/ceilings.txt" 2>&1
run inproc bin/k3 $A --workers 0
run np2_vader $MPI -np 2 --bind-to none --mca btl self,vader bin/k3 $A --mpi
run np2_tcp $MPI -np 2 --bind-to none --mca btl self,tcp bin/k3 $A --mpi
run np2_vader_spin $MPI -np 2 --bind-to none --mca btl self,vader -x K3_MPI_POLL=spin bin/k3 $A --mpi
run np2_vader_spin_yield $MPI -np 2 --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1 -x K3_MPI_POLL=spin bin/k3 $A --mpi
run np2_vader_bound $MPI -np 2 --mca btl self,vader bin/k3 $A --mpi
run np2_vader_t1 $MPI -np 2 --bind-to none --mca btl self,vader bin/k3 $A --mpi --threads 1 --worker-threads 1
run inproc_t1 bin/k3 $A --workers 0 --threads 1
run np3_vader $MPI -np 3 --bind-to none --mca btl self,vader bin/k3 $A --mpi
run np3_tcp $MPI -np 3 --bind-to none --mca btl self,tcp bin/k3 $A --mpi
run np5_vader $MPI -np 5 --bind-to none --mca btl self,vader bin/k3 $A --mpi
run np5_tcp $MPI -np 5 --bind-to none --mca btl self,tcp bin/k3 $A --mpi
run np2_w2_vader $MPI -np 2 --bind-to none --mca btl self,vader bin/k3 $A --mpi --workers 2
run workers2 bin/k3 $A --workers 2
log "done"
