"""Upstream PyTorch weights -> the Flax port's NNX state, checked key by key.

One explicit map, `torch_key_to_nnx`, turns a torch key of the decode path
into an NNX parameter path and the layout change its tensor needs; the module
names in `bench.flax_vae` mirror upstream's, so the path is the key's dotted
parts with the leaf renamed. `convert_state_dict` applies it to a whole state
dict and refuses anything that does not fit, naming the keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

Path = tuple[str | int, ...]

# Keys of the encode path: in upstream's state dict, not in the decoder.
IGNORED_PREFIXES = ("encoder.", "quant_conv.")
DECODE_PREFIXES = ("decoder.", "post_quant_conv.")

# torch weight layout -> Flax kernel layout, by tensor rank.
_KERNEL_TRANSPOSES = {
    5: (2, 3, 4, 1, 0),  # Conv3d OIDHW -> DHWIO
    4: (2, 3, 1, 0),  # Conv2d OIHW -> HWIO
    2: (1, 0),  # Linear (out, in) -> (in, out)
}


class StateDictMismatch(ValueError):
    """The torch state dict does not fit the Flax decoder; the message names the keys."""


def torch_key_to_nnx(key: str, ndim: int) -> tuple[Path, Callable[[np.ndarray], np.ndarray]] | None:
    """Maps one upstream torch key to its NNX parameter path and layout transform.

    ``weight`` of a conv (rank 5 or 4) or linear (rank 2) becomes ``kernel``,
    transposed to channels-last (e.g. OIDHW -> DHWIO); a rank-1 ``weight``
    (GroupNorm) becomes ``scale``; ``bias`` stays ``bias``. Integer parts
    (``up_blocks.0``) become integer path entries, as `nnx.List` indexes them.

    Args:
        key: a key of ``AutoencoderKLCogVideoX.state_dict()``.
        ndim: the rank of its tensor.

    Returns:
        ``(path, transform)``, or None for encode-path keys (``encoder.*``,
        ``quant_conv.*``), which the decoder does not use.

    Raises:
        StateDictMismatch: a key outside the decode path, or a leaf that is
            neither ``weight`` nor ``bias`` or has an unexpected rank.
    """
    if key.startswith(IGNORED_PREFIXES):
        return None
    if not key.startswith(DECODE_PREFIXES):
        raise StateDictMismatch(f"unexpected key {key!r}: not part of the decoder")
    *parents, leaf = key.split(".")
    path: list[str | int] = [int(p) if p.isdigit() else p for p in parents]
    if leaf == "bias" and ndim == 1:
        return (*path, "bias"), lambda a: a
    if leaf == "weight" and ndim == 1:
        return (*path, "scale"), lambda a: a
    if leaf == "weight" and ndim in _KERNEL_TRANSPOSES:
        perm = _KERNEL_TRANSPOSES[ndim]
        return (*path, "kernel"), lambda a: np.transpose(a, perm)
    raise StateDictMismatch(f"unexpected key {key!r}: no Flax parameter for a rank-{ndim} {leaf!r}")


def _torch_key_for(path: Path) -> str:
    # The inverse of `torch_key_to_nnx`'s renaming, only to name missing keys.
    *parents, leaf = path
    return ".".join([*(str(p) for p in parents), "bias" if leaf == "bias" else "weight"])


def _to_numpy(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):  # torch; numpy has no bfloat16, so go through fp32
        return tensor.detach().cpu().float().numpy()
    return np.asarray(tensor)


def convert_state_dict(state_dict: Mapping[str, Any], abstract_state: nnx.State) -> nnx.State:
    """Fills the Flax decoder's (abstract) state from an upstream torch state dict.

    Every decode-path key must map to a parameter of ``abstract_state`` and
    every parameter must be given, with the shape the model expects after the
    layout transform; weights are cast to the parameters' dtype.

    Args:
        state_dict: ``upstream.state_dict()`` (encoder keys are skipped).
        abstract_state: ``nnx.split(nnx.eval_shape(...))[1]`` of a
            `FlaxCogVideoXDecoder`, or a real state of one.

    Returns:
        The state with the loaded arrays.

    Raises:
        StateDictMismatch: missing keys, unexpected keys or wrong shapes, all
            of them named in one message.
    """
    expected = {tuple(path): var for path, var in nnx.to_flat_state(abstract_state)}
    loaded: dict[Path, np.ndarray] = {}
    seen: set[Path] = set()
    unexpected, wrong_shape = [], []
    for key, tensor in state_dict.items():
        array = _to_numpy(tensor)
        try:
            mapped = torch_key_to_nnx(key, array.ndim)
        except StateDictMismatch:
            unexpected.append(key)
            continue
        if mapped is None:
            continue
        path, transform = mapped
        if path not in expected:
            unexpected.append(key)
            continue
        seen.add(path)
        converted = transform(array)
        want = tuple(expected[path].get_value().shape)
        if converted.shape != want:
            wrong_shape.append(f"{key}: torch {array.shape}, as Flax {converted.shape}, model expects {want}")
            continue
        loaded[path] = converted
    missing = [_torch_key_for(path) for path in expected if path not in seen]
    problems = []
    if missing:
        problems.append("missing keys: " + ", ".join(sorted(missing)))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(sorted(unexpected)))
    if wrong_shape:
        problems.append("wrong shapes: " + "; ".join(sorted(wrong_shape)))
    if problems:
        raise StateDictMismatch("state dict does not fit the Flax CogVideoX decoder: " + " | ".join(problems))
    return nnx.from_flat_state(
        [(path, var.replace(jnp.asarray(loaded[path], dtype=var.get_value().dtype))) for path, var in expected.items()]
    )
