#!/usr/bin/env bash
# Wan 2.1 720p x 81 bf16 on the lent GPU, torchax only, each in its own process: compiled temporaries with XLA's
# GPU autotuning as it is and off (--xla_gpu_autotune_level=0: no autotuned cuDNN algorithms or workspaces),
# compile only; then main's plan decoded (steady time, peak) from a wheel built from a clean build folder.
set -u
PY=${PY:-python3}
LOG=$OUT/ws.log
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
} > "$LOG" 2>&1 || { echo "install failed" >> "$LOG"; exit 3; }
mkdir -p /tmp/b && rm -rf /tmp/b/bench && cp -r bench /tmp/b/ && cd /tmp/b || exit 3
export PYTHONPATH=/tmp/site:/tmp/b PYTHONUNBUFFERED=1
ls /tmp/site/cogvideox_torchax/families/wan/patches/ >> "$LOG"
for level in default 0; do
  echo "== compile-only $level $(date -u +%T)" >> "$LOG"
  flags=""; [ "$level" != default ] && flags="--xla_gpu_autotune_level=$level"
  XLA_FLAGS="$flags" timeout -s TERM 100 $PY -m bench.decode --model random:wan2.1 --dtype bf16 \
    --shape ${SHAPE:-21,90,160} --systems torchax --compile-only --no-reference --isolate never --json \
    > "$OUT/ws-compile-$level.json" 2>> "$LOG"
  echo "rc=$? $(date -u +%T)" >> "$LOG"
done
echo "== run default $(date -u +%T)" >> "$LOG"
timeout -s TERM 120 $PY -m bench.decode --model random:wan2.1 --dtype bf16 \
  --shape ${SHAPE:-21,90,160} --systems torchax --repeats 3 --no-reference --isolate never --json \
  > "$OUT/ws-run-default.json" 2>> "$LOG"
echo "rc=$? $(date -u +%T)" >> "$LOG"
