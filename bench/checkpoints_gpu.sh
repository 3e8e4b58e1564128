#!/usr/bin/env bash
# Issue 17 on a GPU machine without Docker (the lent H200): real verl saves, an emptied tracker, stale
# folders across restarts. Wheels as for bench/ppo_gpu.py (docs/benchmarks.md); run from the repo root
# with OUT set to a folder for the logs.
source bench/gpu-setup.sh
C=/tmp/verlbox-bench/checkpoints/bench
state() { echo "== $1 $(date +%T)"; ls $C 2>/dev/null | tr '\n' ' '; echo; echo "tracker: [$(cat $C/latest_checkpointed_iteration.txt 2>/dev/null)]"; du -sh $C/global_step_* 2>/dev/null; df -h /tmp | tail -1; } 
python3 bench/ppo_gpu.py --out $OUT/r1 --run profile:3 --save-freq 1 --budget-s 240 2>&1 | tail -3
state after-run-1 | tee -a $OUT/state.txt
: > $C/latest_checkpointed_iteration.txt
state tracker-emptied | tee -a $OUT/state.txt
python3 bench/ppo_gpu.py --out $OUT/r2 --run resume:5 --save-freq 1 --budget-s 170 2>&1 | tail -3
state after-run-2 | tee -a $OUT/state.txt
python3 bench/ppo_gpu.py --out $OUT/r3 --run resume:6 --save-freq 1 --budget-s 130 2>&1 | tail -3
state after-run-3 | tee -a $OUT/state.txt
grep -h -i "tracker\|global_step\|remov\|free\|room\|checkpoint" $OUT/r2/*.log $OUT/r3/*.log | grep -v "^(" | head -30 > $OUT/verlbox-lines.txt
grep -h -i "Resuming from\|Found checkpoint\|load from" $OUT/r2/*.log $OUT/r3/*.log | head >> $OUT/verlbox-lines.txt
cat $OUT/verlbox-lines.txt
