"""The compiled decode's memory when frame batches chain (compile only, real 2b config, small frames).

The decode of 5 latent frames chains two decoder calls through the causal
conv cache. Before `causal_conv.CacheFirstCausalConv3d`, XLA scheduled the cache
slices late and kept the first call's full-size activations alive: at
(1,16,5,16,16) the compiled temp was 4.8 GiB against 0.57 GiB for one call
(3 frames); 92 GiB against 12.7 GiB at 480x720 (now 16.9 GiB at 13 frames). Measured with XLA:CPU's
memory-aware scheduler, which must be set before JAX starts: own process.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.support.cpu_codegen import with_flags

SCRIPT = """
import json
import cogvideox_torchax as ct
vae = ct.wrap(ct.random_upstream("cogvideox-2b"), mesh="dp=1,tp=1")
temps = {t: vae.compile_decode((1, 16, t, 16, 16)).memory_analysis().temp_size_in_bytes for t in (3, 5)}
print(json.dumps(temps))
"""


@pytest.mark.slow  # real 2b config: ~20 s of compiling, still in the default run
def test_chained_batches_cost_a_few_decoder_calls_not_eight():
    env = dict(os.environ, XLA_FLAGS=with_flags("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    temps = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    gib = {t: round(v / 2**30, 3) for t, v in temps.items()}
    print(f"[memory] 2b compiled temp GiB, latents (1,16,T,16,16), by latent frames: {gib}")
    # Measured (jax 0.10.2, channels-last convs on CPU): T=3 0.571 GiB,
    # T=5 1.24 GiB (T=13: 0.80); with cache_first=False T=5 is 4.80 GiB.
    # XLA's scheduler moves these by tens of percent between versions; the
    # bound separates the fixed program from the regression by 2x each way.
    assert temps[5] <= 3 * temps[3]
