"""How users spell a dtype or a memory size, read without importing any framework.

The commands check their options before torch, JAX or diffusers load, so
these parsers live apart from `config` and `memory.budget` (which import
both and re-export them).
"""

from __future__ import annotations

import re

DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
}

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def dtype_name(dtype: object) -> str:
    """``"float32"``, ``"bfloat16"`` or ``"float16"`` for an accepted spelling (``"bf16"``, ``"FP32"``, ...).

    Raises:
        ValueError: any other value (a torch dtype is `config.canonical_dtype`'s to read).
    """
    if isinstance(dtype, str) and dtype.lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype.lower()]
    raise ValueError(f"dtype must be float32, bfloat16 or float16 (fp32/bf16/fp16 accepted), got {dtype!r}")


def parse_memory(text: str | int | None) -> int | None:
    """Bytes from ``"16GiB"``, ``"8 GB"``, ``"512MiB"``, ``"1.5G"`` (G = GiB) or an int; None for ``"auto"``/None.

    Raises:
        ValueError: anything else, or a size that is not positive.
    """
    if text is None or (isinstance(text, str) and text.strip().lower() == "auto"):
        return None
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"memory budget must be 'auto' or a size like '16GiB', got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory budget must be 'auto' or a size like '16GiB', '8GB', '512MiB', got {text!r}")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise ValueError(f"memory budget must be positive, got {text!r}")
    return value
