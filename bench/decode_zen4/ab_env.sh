#!/bin/bash
# ab_env.sh OUTDIR "THREADS" REPS: like ab.sh, one binary (B, default bin/k3) run with the
# environment E0 ("before") and E1 ("after") alternated, ceilings at the start and the end:
#   E0="K3_DECODE_BF16_NEXT=0" E1="" flock /work/bench.lock bench/decode_zen4/ab_env.sh /tmp/ab "1 2" 2
# or with VARS="name:ENV,ENV;name2:ENV..." (runs named by name, alternated in that order)
# (summary: python3 bench/decode_zen4/ab_sum.py OUTDIR)
out=$1; TH=$2; REPS=$3
mkdir -p $out
B=${B:-bin/k3}; BK=${BK:-bin/bench_kernels}
VARS=${VARS:-"before:$E0;after:$E1"}
echo "start $(date -u +%H:%M:%S) $(cat /proc/loadavg) VARS='$VARS'" >> $out/log
$BK --ceilings > $out/ceil_a.txt 2>&1
IFS=';' read -ra VL <<< "$VARS"
for T in $TH; do for r in $(seq 1 $REPS); do for vv in "${VL[@]}"; do
  v=${vv%%:*}; E=${vv#*:}; E=${E//,/ }
  echo "$v T=$T r=$r $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $out/log
  env $E OMP_WAIT_POLICY=passive $B /work/models-big/rw6 --ids 163584,1000,2000,3000,4000,5000,6000,7000 --gen 8 --workers 0 --threads $T --preset max --preload-experts --json $out/${v}_t${T}_r$r.json > /dev/null 2>>$out/err
done; done; done
$BK --ceilings > $out/ceil_b.txt 2>&1
echo "end $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $out/log
