#!/bin/bash
# ab.sh OUTDIR "THREADS" REPS: ceilings, then the engine on rw6 before (B0) / after (B1) alternated,
# then ceilings again; run under the lock: flock /work/bench.lock bench/decode_zen4/ab.sh /tmp/ab "1 2" 2
# (summary: python3 bench/decode_zen4/ab_sum.py OUTDIR)
out=$1; TH=$2; REPS=$3
mkdir -p $out
B0=${B0:-/tmp/d4_before/bin/k3}; B1=${B1:-bin/k3}; BK=${BK:-bin/bench_kernels}
echo "start $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $out/log
$BK --ceilings > $out/ceil_a.txt 2>&1
for T in $TH; do for r in $(seq 1 $REPS); do for v in before after; do
  B=$B0; [ $v = after ] && B=$B1
  echo "$v T=$T r=$r $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $out/log
  OMP_WAIT_POLICY=passive $B /work/models-big/rw6 --ids 163584,1000,2000,3000,4000,5000,6000,7000 --gen 8 --workers 0 --threads $T --preset max --preload-experts --json $out/${v}_t${T}_r$r.json > /dev/null 2>>$out/err
done; done; done
$BK --ceilings > $out/ceil_b.txt 2>&1
echo "end $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $out/log
