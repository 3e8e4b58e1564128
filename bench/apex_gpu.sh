#!/usr/bin/env bash
# Apex on a GPU machine without Docker (the lent H200): compile the pinned archive with verlbox's own
# build plan and apex_build.py, then compare its fused kernels with torch. Prepare here first:
#   python bench/apex_gpu_plan.py ARCH SOURCES_DIR   (writes .device/apex/: plan, archive)
# then run this there with `carry: [".device"]`. WORK keeps the objects between calls: a compile cut off
# by a call's time limit resumes in the next call on the same warm machine.
set -euo pipefail
work="${WORK:-/tmp/verlbox-apex}"
out="${OUT:-$work/out}"
mkdir -p "$work/wheels" "$out"
if ! ls "$work"/wheels/apex-*.whl >/dev/null 2>&1; then
  start=$(date +%s)
  timeout "${BUILD_SECONDS:-540}" python3 builder/verlbox/runtime/apex_build.py \
    .device/apex/plan.json .device/apex/apex-*.tar.gz "$work/wheels" "$work/src" >"$work/build.log" 2>&1 || {
    echo "apex build stopped after $(($(date +%s) - start)) s (run again to resume)"
    tail -n 5 "$work/build.log"
    exit 0
  }
  echo "apex build finished in $(($(date +%s) - start)) s this call"
fi
rm -rf "$work/site" && python3 -m pip install -q --no-deps --no-index --target "$work/site" "$work"/wheels/apex-*.whl
cp "$work/wheels/verlbox-source.json" "$out/"
PYTHONPATH="$work/site:$PWD/builder" python3 - <<'PY' | tee "$out/apex-kernels.txt"
import json, os, platform
import torch
from verlbox.runtime.steps.apex_build import fatbin_architectures
from verlbox.runtime.steps.apex_kernels import compare_kernels
import importlib.util
site = os.environ["PYTHONPATH"].split(":")[0]
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, Python {platform.python_version()}")
for name in ("amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda"):
    print(name, fatbin_architectures(__import__("pathlib").Path(importlib.util.find_spec(name).origin)))
for check in compare_kernels():
    print(f"{check.kernel:32s} {check.dtype:8s} max error {check.max_error:.2e} (bound {check.tolerance:.0e}) {'ok' if check.ok else 'FAIL'}")
PY
