#!/usr/bin/env bash
# Source this on a GPU machine without Docker (the lent H200): it installs the carried wheels of the
# verl 0.4.1 stack into /tmp/site beside that machine's own torch, applies verlbox's patch set to
# that verl and puts verlbox on PYTHONPATH. Make the wheels here first (docs/benchmarks.md says how).
# A second call on the same warm machine finds /tmp/site ready and only sets the variables.
set -euo pipefail
export PYTHONPATH="/tmp/site:$PWD/builder" PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.verlbox-ready ]; then
  rm -rf /tmp/site/verl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .device/wheels/*.whl
  tar -xJf .device/wheels/ray_nojars.tar.xz -C /tmp/site
  # the repacked Ray comes from a zip extraction, which drops the exec bits of its daemons
  find /tmp/site/ray/core/src -type f ! -name '*.so' -exec chmod +x {} +
  python3 -m verlbox.cli patch-verl /tmp/site
  touch /tmp/site/.verlbox-ready
fi
