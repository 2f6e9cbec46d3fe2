#!/usr/bin/env bash
# Wan 2.1 720p x 81 bf16 on the lent GPU: ours with its residual blocks' time chunks of 1 output frame (the
# plan's), of 2 and of 3 (CHUNK_ELEMENTS raised), and off; each in its own process, torchax only.
set -u
PY=${PY:-python3}
LOG=$OUT/ab.log
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
} > "$LOG" 2>&1 || { echo "install failed" >> "$LOG"; exit 3; }
mkdir -p /tmp/b && rm -rf /tmp/b/bench && cp -r bench /tmp/b/ && cd /tmp/b || exit 3
export PYTHONPATH=/tmp/site:/tmp/b PYTHONUNBUFFERED=1
ARGS="--model random:wan2.1 --dtype bf16 --shape ${SHAPE:-21,90,160} --systems torchax --repeats 3 --no-reference --isolate never --json"
run() {  # name, chunk elements (empty: the library's), extra args
  echo "== $1 $(date -u +%T)" >> "$LOG"
  timeout -s TERM "${EACH_S:-80}" $PY -c "
import runpy, sys
from cogvideox_torchax.families.wan.patches import time_chunks
if '$2': time_chunks.CHUNK_ELEMENTS = int('$2')
sys.argv = ['bench.decode'] + '''$ARGS $3'''.split()
runpy.run_module('bench.decode', run_name='__main__')
" > "$OUT/ab-$1.json" 2>> "$LOG"
  echo "rc=$? $(date -u +%T)" >> "$LOG"
}
run chunks1 "" ""
run off "" "--option wan_time_chunks=false"
run chunks2 $((3 * 2**27)) ""
run chunks3 $((2**29)) ""
