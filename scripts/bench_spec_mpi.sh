#!/usr/bin/env bash
# scripts/bench_spec_mpi.sh - speculation (issue 14) and MPI expert ranks (issue 12) on the
# real-width model, in one hold of $BENCH_LOCK. Writes one JSON file per run into OUT
# (default /tmp/k3-bench-spec) plus load.txt and ceilings.txt; progress on stderr.
# PARTS: "spec mpi" (default both), or "rollback" (per-position states vs re-feed at 0 % and
# partial acceptance, every 3rd proposal wrong; KS: the K values, default "1 2 4"). GEN (default 8).
set -u
cd "$(dirname "$0")/.."
MODEL=${MODEL:-/work/models-big/rw6}
OUT=${OUT:-/tmp/k3-bench-spec}
GEN=${GEN:-8}
PARTS=${PARTS:-spec mpi}
BENCH_LOCK=${BENCH_LOCK:-/work/bench.lock}
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
mkdir -p "$OUT"
log() { echo "bench_spec_mpi: $(date -u +%T) $*" >&2; echo "$(date -u +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"; }
ids8=${IDS8:-163584,1000,2000,3000,4000,5000,6000,7000}
ids32=$ids8,$ids8,$ids8,$ids8
py() { /usr/bin/python3 -c "$@"; }
run() { local name=$1; shift; log "run $name: $*"; /usr/bin/time -f "%e s wall" "$@" --json "$OUT/$name.json" > "$OUT/$name.out" 2> "$OUT/$name.err" || log "run $name FAILED (see $OUT/$name.err)"; }

log "waiting for $BENCH_LOCK"
exec 9>> "$BENCH_LOCK"
flock 9
log "lock held"
[ -x bin/bench_kernels ] && bin/bench_kernels --ceilings > "$OUT/ceilings.txt" 2>&1
for part in $PARTS; do
  if [ "$part" = spec ]; then
    run plain bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0
    py 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$OUT/plain.json" > "$OUT/right.txt"
    py 'import sys; ids=open(sys.argv[1]).read().split(); print(" ".join(str((int(i)+1)%int(sys.argv[2])) for i in ids))' "$OUT/right.txt" "${VOCAB:-163000}" > "$OUT/wrong.txt"
    for k in 1 2 4; do
      run "ids100_k$k" bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0 --draft ids --draft-ids "$OUT/right.txt" --draft-max $k
    done
    for k in 4 1 2; do
      run "ids0_k$k" bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0 --draft ids --draft-ids "$OUT/wrong.txt" --draft-max $k
    done
    run plain_rep bin/k3 "$MODEL" --ids $ids32 --gen $GEN --workers 0
    run ngram_k4 bin/k3 "$MODEL" --ids $ids32 --gen $GEN --workers 0 --draft ngram --draft-max 4
  fi
  if [ "$part" = rollback ]; then # per-position states vs snapshot + re-feed (issue 14 item 1)
    run plain bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0
    py 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$OUT/plain.json" > "$OUT/right.txt"
    py 'import sys; ids=open(sys.argv[1]).read().split(); print(" ".join(str((int(i)+1)%int(sys.argv[2])) for i in ids))' "$OUT/right.txt" "${VOCAB:-163000}" > "$OUT/wrong.txt"
    py 'import sys; ids=open(sys.argv[1]).read().split(); print(" ".join(str((int(x)+1)%int(sys.argv[2])) if (i+1)%3==0 else x for i,x in enumerate(ids)))' "$OUT/right.txt" "${VOCAB:-163000}" > "$OUT/part.txt"
    run ids100_k4 bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0 --draft ids --draft-ids "$OUT/right.txt" --draft-max 4
    for rb in states refeed; do
      for k in ${KS:-1 2 4}; do
        run "ids0_k${k}_$rb" bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0 --draft ids --draft-ids "$OUT/wrong.txt" --draft-max $k --draft-rollback $rb
        run "idspart_k${k}_$rb" bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0 --draft ids --draft-ids "$OUT/part.txt" --draft-max $k --draft-rollback $rb
      done
    done
    run plain_end bin/k3 "$MODEL" --ids $ids8 --gen $GEN --workers 0
  fi
  if [ "$part" = mpi ]; then
    run mpi_none_t1 bin/k3 "$MODEL" --ids $ids8 --gen 4 --workers 0 --threads 1
    for np in 2 3 5; do
      for btl in vader tcp; do
        run "mpi_${btl}_np$np" mpirun --allow-run-as-root --oversubscribe -np $np --mca btl self,$btl \
          bin/k3 "$MODEL" --ids $ids8 --gen 4 --mpi --threads 1
      done
    done
  fi
done
log "done"
