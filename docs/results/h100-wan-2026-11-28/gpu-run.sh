#!/usr/bin/env bash
# One call on the lent GPU: the wheels from ../shared/gpu/wheels.sh, then bench.suite's steps, the most wanted
# first (a run cut short keeps what it measured), everything under $OUT. Not committed: the command is in the page.
set -u
PY=${PY:-python3}
REPO=$PWD
LOG=$OUT/run.log
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
} > "$LOG" 2>&1 || { echo "install failed" >> "$LOG"; exit 3; }
mkdir -p /tmp/b && rm -rf /tmp/b/bench && cp -r bench /tmp/b/ && cd /tmp/b || exit 3
export PYTHONPATH=/tmp/site:/tmp/b PYTHONUNBUFFERED=1
$PY -c "import jax, torch, torchax, diffusers, av, cogvideox_torchax.kernels as k; print(jax.devices(), torch.__version__, torch.cuda.is_available(), k.__file__)" >> "$LOG" 2>&1
timeout -s TERM "${SUITE_S:-530}" $PY -m bench.suite ${QUICK:-} --out "$OUT/suite" --examples "$REPO/examples" \
  --only "${ONLY:-decode-wan2.1,profile-2b,decode-wan2.1-720p,parity-wan2.1,stream-2b,decode-2b,decode-1.5,readme,parity-2b,cold-warm-2b}" \
  >> "$LOG" 2>&1
echo "suite rc=$? at $(date -u)" >> "$LOG"
