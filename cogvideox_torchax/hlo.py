"""Reading a lowered program: the convolutions it runs, with shapes, dtypes and layouts.

`TorchaxVAE.lower_decode(shape, platform="cuda")` lowers a program for any
platform on any machine; these helpers read its StableHLO text so the
structure the target will run (conv sizes, dtypes, layouts) can be checked
and reported without the hardware. Each distinct convolution appears at
least once in the text (identical jitted kernels are one private function).
"""

from __future__ import annotations

import dataclasses
import math
import re

_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
_DIMS = re.compile(r"dim_numbers = (\[[^\]]*\])x(\[[^\]]*\])->(\[[^\]]*\])")


@dataclasses.dataclass(frozen=True)
class Convolution:
    """One ``stablehlo.convolution``: operand and result shapes and element types, and its layouts."""

    input_shape: tuple[int, ...]
    kernel_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    input_dtype: str
    output_dtype: str
    input_layout: str  # e.g. "[b, 0, 1, 2, f]": channels (f) last

    @property
    def channels_last(self) -> bool:
        return self.input_layout.replace(" ", "").endswith(",f]")

    @property
    def max_elements(self) -> int:
        """The larger of the input's and the output's element counts."""
        return max(math.prod(self.input_shape), math.prod(self.output_shape))


def _shape(dims: str) -> tuple[int, ...]:
    return tuple(int(d) for d in dims.split("x") if d)


def convolutions(stablehlo: str) -> list[Convolution]:
    """Every convolution in a lowered program's StableHLO text (`jax.stages.Lowered.as_text()`)."""
    convs = []
    for line in stablehlo.splitlines():
        if "stablehlo.convolution" not in line:
            continue
        dims = _DIMS.search(line)
        types = _TENSOR.findall(line.rsplit(" : ", 1)[-1])
        if dims is None or len(types) != 3:
            raise ValueError(f"unrecognised convolution line: {line.strip()[:200]}")
        (x_dims, x_t), (w_dims, _), (y_dims, y_t) = types
        convs.append(Convolution(_shape(x_dims), _shape(w_dims), _shape(y_dims), x_t, y_t, dims.group(1)))
    return convs
