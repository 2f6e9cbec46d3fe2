"""What XLA:CPU makes of a channels-last 3x3 convolution and an RMS norm after it, with YNNPACK's fusions and without.

`python hlo-check.py`: for each setting, the fusion kinds in the compiled HLO and the YNNPACK fusions' configs.
"""

import collections
import re

import jax
import jax.numpy as jnp


def conv_then_norm(x, w):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (y * jax.lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + 1e-6)).sum(-1)


lowered = jax.jit(conv_then_norm).lower(jnp.ones((1, 64, 64, 96)), jnp.ones((3, 3, 96, 96)))
print("jax", jax.__version__)
for options in ({}, {"xla_cpu_experimental_ynn_fusion_type": ""}):
    text = lowered.compile(compiler_options=options).as_text()
    kinds = collections.Counter(re.findall(r"kind=(\w+)", text))
    ynn = re.findall(r'"fusion_config":\{"kind":"(__ynn_fusion)"', text)
    print(options or "XLA's defaults", dict(kinds), "YNNPACK fusions:", len(ynn))
