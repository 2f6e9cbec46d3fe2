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


# -- compiled programs (optimized HLO, `jax.stages.Compiled.as_text()`) -------

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
# A tuple result's elements may carry TPU layouts, which hold parentheses of their own.
_INSTRUCTION = re.compile(
    r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(\((?:[^()]|\([^()]*\))*\)|[a-z]\w*\[[\d,]*\](?:\{[^}]*\})?)\S*\s+([\w\-]+)\((.*)$"
)
# TPU layouts carry their tiling and memory space: {1,0,4,3,2:T(8,128)(2,1)S(1)}.
_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\](?:\{([^}]*)\})?")
_OPERAND = re.compile(r"^%([\w.\-]+)")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_DIM_LABELS = re.compile(r"dim_labels=([\w>\-]+)")
_CUDNN = re.compile(r'custom_call_target="__cudnn\$conv\w*"')
# The target JAX gives every CPU buffer callback; `kernels.host_conv`'s call into the host's torch is the
# only one our programs hold.
HOST_CONV_TARGET = "xla_buffer_python_cpu_callback"
_HOST_CONV = re.compile(f'custom_call_target="{HOST_CONV_TARGET}"')
# What runs a convolution: XLA's own, a cuDNN call, the host's torch.
CONVOLUTION_OPS = ("convolution", "cudnn-conv", "host-conv")
# Cross-device communication (tp > 1); "-start" halves of async pairs count once.
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class CompiledOp:
    """One instruction of a compiled program: opcode, result dtype, shape and layout, and what it says of layout.

    ``layout`` is the physical dimension order XLA assigned (minor to
    major, as the HLO text writes it), ``operand_layout`` that of the first
    operand where the operand is known (copies).
    """

    op: str  # "convolution", "cudnn-conv", "host-conv", "transpose", "copy", ...
    dtype: str
    shape: tuple[int, ...]
    dim_labels: str = ""  # convolutions: e.g. "bf012_oi012->bf012" (channels second), "b012f_..." (last)
    layout: str = ""
    operand_layout: str = ""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """The result's bytes (0 for a dtype this module does not size)."""
        return _bytes(self.dtype, self.shape)

    @property
    def moves_data_to_another_layout(self) -> bool:
        """A transpose, or a copy whose result is laid out otherwise than its operand."""
        return self.op == "transpose" or (self.op == "copy" and self.layout != self.operand_layout)


def _computations(text: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(2)
            blocks[current] = []
        elif line.strip() == "}":
            current = None
        elif current is not None:
            blocks[current].append(line)
    return blocks


def _op(line: str, layouts: dict[str, str] | None = None) -> CompiledOp | None:
    m = _INSTRUCTION.match(line)
    if m is None:
        return None
    first = _ARRAY.search(m.group(3))
    shape = tuple(int(d) for d in first.group(2).split(",") if d)
    op = m.group(4)
    labels = _DIM_LABELS.search(line)
    if op == "custom-call" and _CUDNN.search(line):
        op = "cudnn-conv"
    elif op == "custom-call" and _HOST_CONV.search(line):
        op = "host-conv"
    operand = _OPERAND.match(m.group(5))
    operand_layout = (layouts or {}).get(operand.group(1), "") if operand else ""
    return CompiledOp(op, first.group(1), shape, labels.group(1) if labels else "", first.group(3) or "",
                      operand_layout)


def _results(lines: list[str]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Each instruction's result (a tuple's first element): dtype, shape and layout, by name."""
    found = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m is not None:
            array = _ARRAY.search(m.group(3))
            found[m.group(2)] = (array.group(1), tuple(int(d) for d in array.group(2).split(",") if d),
                                 array.group(3) or "")
    return found


def _fused(blocks: dict[str, list[str]]) -> set[str]:
    """The computations fusions call: steps of their callers, not of their own."""
    return {name for lines in blocks.values() for line in lines if " fusion(" in line for name in _CALLS.findall(line)}


def compiled_ops(text: str) -> tuple[list[CompiledOp], list[CompiledOp]]:
    """The convolutions and the data movements a compiled program runs.

    Returns:
        ``(convolutions, moves)``: every convolution (XLA's own, a cuDNN
        call on GPUs, a call into the host's torch) wherever it sits; and every transpose or copy that is
        a step of its own: outside fusions, or a fusion whose result is a
        transpose or copy (reported as its root, with the fusion's shape).
        `CompiledOp.moves_data_to_another_layout` tells layout changes from
        plain copies (loop-carried buffers XLA must not overwrite).
    """
    blocks = _computations(text)
    layouts = {name: {k: r[2] for k, r in _results(lines).items()} for name, lines in blocks.items()}
    fused = _fused(blocks)
    convs, moves = [], []
    for name, lines in blocks.items():
        for line in lines:
            op = _op(line, layouts[name])
            if op is None:
                continue
            if op.op in CONVOLUTION_OPS:
                convs.append(op)
            elif name not in fused and op.op in ("transpose", "copy"):
                moves.append(op)
            elif name not in fused and op.op == "fusion":
                called = _CALLS.search(line).group(1)
                root = next(
                    (_op(x, layouts.get(called)) for x in blocks.get(called, []) if x.lstrip().startswith("ROOT")),
                    None,
                )
                if root is not None and root.op in ("transpose", "copy"):
                    moves.append(dataclasses.replace(root, shape=op.shape, dtype=op.dtype))
    return convs, moves


# Call edges of a compiled program: (callee, how many times per call of the caller).
_CALLEE = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_BODY = re.compile(r"\bbody=%([\w.\-]+)")
_CONDITION = re.compile(r"\bcondition=%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
          "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# Data movement: what runs outside the convolutions to pad, join, cut and copy tensors.
MOVEMENT = ("pad", "concatenate", "slice", "dynamic-slice", "dynamic-update-slice", "copy", "transpose")
# What a fusion of data movement may also hold: free, shape-only or dtype-only instructions.
_SHAPE_ONLY = frozenset(("parameter", "constant", "bitcast", "reshape", "broadcast", "tuple", "get-tuple-element",
                         "iota", "convert"))


def runs_per_call(text: str) -> dict[str, int | None]:
    """How many times each computation of a compiled program runs per call of the program.

    The entry computation runs once; a while loop's body as many times as
    XLA's ``known_trip_count`` says and its condition once more (None where
    a loop's count is unknown, and below it); fusions, calls and reducers
    once per run of their caller; each branch of a conditional as often as
    the conditional (an upper bound).
    """
    blocks = _computations(text)
    entry = next((m.group(2) for line in text.splitlines() if (m := _COMPUTATION.match(line)) and m.group(1)), None)
    callers: dict[str, list[tuple[str, int | None]]] = {}
    for name, lines in blocks.items():
        for line in lines:
            body, condition = _BODY.search(line), _CONDITION.search(line)
            trip = int(m.group(1)) if (m := _TRIP_COUNT.search(line)) else None
            for callee in _CALLEE.findall(line):
                times: int | None = 1
                if body and callee == body.group(1):
                    times = trip
                elif condition and callee == condition.group(1):
                    times = None if trip is None else trip + 1
                callers.setdefault(callee, []).append((name, times))
            for group in _BRANCHES.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    callers.setdefault(callee, []).append((name, 1))
    runs: dict[str, int | None] = {}

    def count(name: str) -> int | None:
        if name not in runs:
            if name == entry:
                runs[name] = 1
            else:
                total: int | None = 0
                for caller, times in callers.get(name, []):
                    n = count(caller)
                    total = None if total is None or n is None or times is None else total + n * times
                runs[name] = total
        return runs[name]

    for name in blocks:
        count(name)
    return runs


def _in_loops(blocks: dict[str, list[str]]) -> set[str]:
    """The computations a while loop's body runs: the bodies and everything they call."""
    found: set[str] = set()
    todo = [m.group(1) for lines in blocks.values() for line in lines if (m := _BODY.search(line))]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for line in blocks.get(name, []):
            todo += _CALLEE.findall(line)
            for group in _BRANCHES.findall(line):
                todo += re.findall(r"%([\w.\-]+)", group)
    return found


def _bytes(dtype: str, shape: tuple[int, ...]) -> int:
    return _BYTES.get(dtype, 0) * math.prod(shape)


def executed_summary(text: str) -> dict[str, object]:
    """What a compiled program does per call, its loops unrolled: convolution calls, and data movement's bytes.

    ``convolution_calls``: every convolution (a cuDNN call on GPUs, the host's torch on the CPU) times
    the runs of the computation holding it (None where a loop's count is
    unknown). ``movement_bytes``: the bytes written by `MOVEMENT`
    instructions outside fusions, and by fusions that hold nothing else
    (and shape-only instructions and scalar arithmetic: offsets), each
    times its runs, by opcode (a
    fusion under its root's). A dynamic-update-slice writes its update
    in place and counts the update's bytes. These are what a GPU profile
    counts as convolution kernels and as pad, concatenate, slice and copy
    kernels, read from the program before any device runs it.
    ``movement_bytes_in_loops_by_op``: the part written inside while
    loops (a frame scan's steps).
    """
    blocks = _computations(text)
    runs = runs_per_call(text)
    fused = _fused(blocks)
    results: dict[str, dict[str, tuple[str, tuple[int, ...], str]]] = {}

    def written(computation: str, line: str, op: CompiledOp) -> int:
        if op.op != "dynamic-update-slice":
            return _bytes(op.dtype, op.shape)
        # The compiled text names operands without their types: the update's is its definition's.
        operands = re.findall(r"%([\w.\-]+)", _INSTRUCTION.match(line).group(5))
        if computation not in results:
            results[computation] = _results(blocks[computation])
        update = results[computation].get(operands[1]) if len(operands) > 1 else None
        return _bytes(*update[:2]) if update else _bytes(op.dtype, op.shape)

    conv_calls: int | None = 0
    movement: dict[str, int] = {}
    in_loops = _in_loops(blocks)
    looped: dict[str, int] = {}
    unknown = False
    for name, lines in blocks.items():
        n = runs.get(name)
        for line in lines:
            op = _op(line)
            if op is None:
                continue
            if op.op in CONVOLUTION_OPS:
                conv_calls = None if conv_calls is None or n is None else conv_calls + n
                continue
            if name in fused:
                continue
            kind, size = None, 0
            if op.op in MOVEMENT:
                kind, size = op.op, written(name, line, op)
            elif op.op == "fusion":
                called = _CALLS.search(line).group(1)
                ops = [(x, _op(x)) for x in blocks.get(called, [])]
                # Scalars are offsets (a dynamic slice's clamped start), not data.
                if ops and all(o is not None and (o.op in MOVEMENT or o.op in _SHAPE_ONLY or not o.shape)
                               for _, o in ops):
                    root = next(((x, o) for x, o in ops if x.lstrip().startswith("ROOT")), None)
                    if root is not None and root[1].op in MOVEMENT:
                        kind = root[1].op
                        size = written(called, *root) if kind == "dynamic-update-slice" else _bytes(op.dtype, op.shape)
            if kind is None:
                continue
            if n is None:
                unknown = True
                continue
            movement[kind] = movement.get(kind, 0) + n * size
            if name in in_loops:
                looped[kind] = looped.get(kind, 0) + n * size
    return {
        "convolution_calls": conv_calls,
        "movement_bytes": None if unknown else sum(movement.values()),
        "movement_bytes_by_op": dict(sorted(movement.items())),
        "movement_bytes_in_loops_by_op": dict(sorted(looped.items())),
    }


def compiled_summary(text: str, *, min_elements: int = 2**20) -> dict[str, object]:
    """What `compiled_ops` finds, counted, the collectives, and what the program runs per call (`executed_summary`).

    Convolutions by layout and by result dtype; data movements split into
    layout changes (transposes, relayouting copies) and plain copies, each
    in all and of activations; collectives by opcode, wherever they sit.
    ``min_elements``: a movement of at least this many elements counts as
    one of an activation (weights are smaller).
    """
    convs, moves = compiled_ops(text)
    by_layout: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    for c in convs:
        by_layout[c.dim_labels or c.op] = by_layout.get(c.dim_labels or c.op, 0) + 1
        by_dtype[c.dtype] = by_dtype.get(c.dtype, 0) + 1
    changes = [m for m in moves if m.moves_data_to_another_layout]
    copies = [m for m in moves if not m.moves_data_to_another_layout]
    collectives: dict[str, int] = {}
    for line in text.splitlines():
        op = _op(line)
        if op is not None and op.op.removesuffix("-start") in COLLECTIVES:
            name = op.op.removesuffix("-start")
            collectives[name] = collectives.get(name, 0) + 1
    return {
        "convolutions": len(convs),
        "conv_layouts": by_layout,
        "conv_output_dtypes": by_dtype,
        "layout_changes": len(changes),
        "activation_layout_changes": sum(m.elements >= min_elements for m in changes),
        "copies": len(copies),
        "activation_copies": sum(m.elements >= min_elements for m in copies),
        "min_activation_elements": min_elements,
        "collectives": collectives,
        **executed_summary(text),
    }
