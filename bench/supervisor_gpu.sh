#!/usr/bin/env bash
# Issue 29 on a GPU machine without Docker (the lent H200, each process capped at 24 GiB): a run through the
# real `verlbox train` with compact progress and saves, sampled by `nvidia-smi --query-compute-apps` beside
# `ps` (which process holds GPU memory: only verl's may); then the newest save cut short by hand (0-byte
# model file, half an optimizer file, as a power cut leaves them) and one restart that must resume from the
# save before it. Wheels as for bench/ppo_gpu.py; run from the repo root with OUT set.
source bench/gpu-setup.sh
set +e
C=/tmp/verlbox-bench/checkpoints/bench
# nvidia-smi lists no compute apps inside this machine's container (another PID namespace): a process
# with a CUDA context holds /dev/nvidia* open, so each process's open GPU device files are counted instead
sample() {
  while true; do
    echo "== $(date +%T)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    for pid in $(pgrep -f "verlbox.cli train|ray::|main_ppo"); do
      opened=$(ls -l /proc/$pid/fd 2>/dev/null | grep -c "/dev/nvidia")
      echo "$pid nvidia-fds=$opened $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-90)"
    done
    sleep 10
  done
}
sample > "$OUT/compute-apps.txt" 2>&1 &
sampler=$!
python3 bench/ppo_gpu.py --out "$OUT/r1" --run profile:3 --save-freq 1 --budget-s 220 2>&1 | tail -3
kill $sampler
newest=$(ls -d $C/global_step_* | sort -t_ -k3 -n | tail -1)
echo "cut short by hand: $newest" | tee "$OUT/cut.txt"
truncate -s 0 "$newest"/actor/model_world_size_1_rank_0.pt
optim="$newest"/actor/optim_world_size_1_rank_0.pt
truncate -s $(( $(stat -c %s "$optim") / 2 )) "$optim"
ls -la "$newest"/actor >> "$OUT/cut.txt"
python3 bench/ppo_gpu.py --out "$OUT/r2" --run resume:3 --save-freq 1 --budget-s 200 2>&1 | tail -3
grep -h -i "tracker\|incomplete\|global_step\|resum" "$OUT"/r2/*.log | grep -v "^(" | head -20 > "$OUT/restart-lines.txt"
cat "$OUT/restart-lines.txt"
