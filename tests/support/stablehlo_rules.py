"""Reading lowered StableHLO text: which full-size f32 values feed what.

The bf16 rule: an fp32 value as large as an activation may exist in
the lowered program only as the inside of a fusible computation, i.e. it
reaches nothing but elementwise ops that end in a reduction or in a cast back
to a narrower float. XLA fuses such chains (and a convolution's fp32
accumulator with its elementwise epilogue), so they are never stored. What
the rule catches is fp32 reaching anything that materialises it: a
convolution operand, a pad, a concatenate, a slice, a function result.
"""

from __future__ import annotations

import math
import re

_DEF = re.compile(r"^\s*(%[\w#.:]+)(?::\d+)?\s*=\s*(\"?[\w.]+\"?)")
_TENSOR = re.compile(r"tensor<([\dx]*)x?(f32|bf16|f16|i\d+|i1|ui\d+)>")
_USE = re.compile(r"%[\w.]+")
# Elementwise ops a float value may pass through on its way into a reduce
# (and SpatialNorm's resize gathers, below).
_PASS_THROUGH = {
    "stablehlo.convert",
    "stablehlo.subtract",
    "stablehlo.add",
    "stablehlo.multiply",
    "chlo.square",
    "stablehlo.broadcast_in_dim",
    "stablehlo.reshape",
    "stablehlo.negate",
    "stablehlo.logistic",
    "stablehlo.divide",
    "stablehlo.exponential",
    "stablehlo.maximum",
    "stablehlo.minimum",
    # jax 0.12.1's sigmoid: exp(-|x|) chosen by the sign of x, all elementwise
    # (jax 0.12.0 lowered it to one stablehlo.logistic). The comparison's
    # predicate is no f32 value; the select it feeds is checked as its own.
    "stablehlo.abs",
    "stablehlo.compare",
    "stablehlo.select",
    "stablehlo.rsqrt",
    "stablehlo.sqrt",
    # The nearest resize of SpatialNorm's fp32 scale and shift (computed at
    # latent resolution, spatial_norm.LowResSpatialNorm3D): a gather of sorted
    # host indices per axis (`kernels.upsample.gather_indices`) feeding the
    # norm's multiply-add. XLA fuses it there: the 2b bf16 decode at
    # (1,16,3,16,16) compiles to 538.7 MiB of temporaries on XLA:CPU whether
    # the scale and shift are fp32 or bf16. (The gathers of torchax's
    # interpolation fallback, not marked sorted, still count as escapes.)
    "sorted stablehlo.gather",
}
_SORTED_GATHER = "sorted stablehlo.gather"  # a gather line marked indices_are_sorted
_CALLEE = re.compile(r"call @(\w+?)(?:_\d+)?\(")


def _numel(dims: str) -> int:
    return math.prod(int(d) for d in dims.split("x") if d) if dims else 1


def _result_types(line: str) -> list[tuple[int, str]]:
    rhs = line.split("->")[-1] if "->" in line else line.split(":")[-1]
    return [(_numel(d), t) for d, t in _TENSOR.findall(rhs)]


def fp32_escapes(stablehlo: str, min_elements: int) -> list[str]:
    """Lines where an f32 value of at least ``min_elements`` elements reaches
    anything but a reduction or a cast to a narrower type (through
    elementwise ops only).

    An empty list means every full-size f32 value in the program is inside a
    fusible computation: the input side of a reduce, or an elementwise chain
    (possibly starting at a convolution's fp32 accumulator) that is rounded
    back to bf16 at its end.
    """
    escapes = []
    for block in stablehlo.split("func.func")[1:]:
        lines = block.splitlines()
        defs: dict[str, tuple[str, bool]] = {}
        users: dict[str, list[tuple[str, str]]] = {}
        for ln in lines:
            m = _DEF.match(ln)
            op = m.group(2).strip('"') if m else ln.strip().split(" ")[0]
            callee = _CALLEE.search(ln) if op == "call" else None
            if callee:
                op = f"call @{callee.group(1)}"
            if op == "stablehlo.gather" and "indices_are_sorted = true" in ln:
                op = _SORTED_GATHER
            name = m.group(1) if m else None
            if name:
                big = any(n >= min_elements and t == "f32" for n, t in _result_types(ln))
                defs[name] = (op, big)
            operands = ln.split("=", 1)[1] if m else ln
            for use in set(_USE.findall(operands)):
                users.setdefault(use, []).append((op, ln.strip()))
        for name, (_op, big) in defs.items():
            if not big:
                continue
            for user_op, user_line in users.get(name, []):
                if user_op == "stablehlo.reduce":
                    continue
                if user_op in _PASS_THROUGH:
                    m = _DEF.match(user_line)
                    if m and defs.get(m.group(1), (None, False))[1]:
                        continue  # still full-size f32: checked as its own value
                    if user_op == "stablehlo.convert" and all(t != "f32" for _, t in _result_types(user_line)):
                        continue  # rounded back to a narrower type
                    if user_op == "stablehlo.compare":
                        continue  # a predicate for a select of the same elementwise chain
                escapes.append(user_line)
    return escapes
