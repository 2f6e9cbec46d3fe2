"""Three time taps of a 3x3x3 convolution as 2-D convolutions, channels-last, summed in fp32: XLA:CPU's time.

`python taps-microbench.py` with YNNPACK's fusions as XLA sets them; `python taps-microbench.py noynn` with
them off (`xla_cpu_experimental_ynn_fusion_type` empty). Prints the best of 5 calls per shape, in ms.
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""} if "noynn" in sys.argv else {}


def taps(x, w):  # x: (T + 2, H, W, C) frames; w: (3, 3, 3, C, C_out), time first
    frames = x.shape[0] - 2
    acc = None
    for d in range(3):
        product = jax.lax.conv_general_dilated(
            x[d : d + frames], w[d], (1, 1), [(1, 1), (1, 1)],
            dimension_numbers=("NHWC", "HWIO", "NHWC"), preferred_element_type=jnp.float32,
        )
        acc = product if acc is None else acc + product
    return acc


for frames, size, c_in, c_out in [(4, 128, 96, 96), (4, 64, 192, 192), (4, 32, 384, 384), (1, 16, 384, 384)]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((frames + 2, size, size, c_in)), jnp.float32)
    w = jnp.asarray(rng.random((3, 3, 3, c_in, c_out)) * 0.01, jnp.float32)
    compiled = jax.jit(taps).lower(x, w).compile(compiler_options=OPTIONS)
    compiled(x, w).block_until_ready()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        compiled(x, w).block_until_ready()
        times.append(time.perf_counter() - t)
    print((frames, size, c_in, c_out), "noynn" if OPTIONS else "ynn", f"{min(times) * 1e3:.1f} ms", flush=True)
