"""Saving a `TorchaxVAE` in upstream's format, so that upstream's and our `from_pretrained` load it back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cogvideox_torchax.io.model_files import WEIGHTS_NAME, with_variant
from cogvideox_torchax.io.outputs import atomic_output
from cogvideox_torchax.parallel import distributed
from cogvideox_torchax.vae.program_cache import to_host_torch


def save_pretrained(
    config: Any,
    weights: dict[str, Any],
    save_directory: str | os.PathLike,
    *,
    upstream: type | None = None,
    is_main_process: bool = True,
    safe_serialization: bool = True,
    variant: str | None = None,
    torch_dtype: torch.dtype | None = None,
) -> Path:
    """Writes ``config.json`` (``_class_name`` of ``upstream``, the upstream class) and the weights as upstream does.

    The weights are gathered from the mesh (every process must call this
    under jax.distributed; only the main process writes), in their own dtype
    unless ``torch_dtype`` says otherwise, to one safetensors file. Each file
    is written beside its name and moved in whole, replacing an earlier save
    of the same name as upstream's ``save_pretrained`` does.

    Returns:
        The folder.

    Raises:
        ValueError: ``safe_serialization=False`` (pickle is not written) or
            a ``save_directory`` that is a file.
    """
    from safetensors.torch import save_file

    from cogvideox_torchax import families

    upstream = upstream or families.of_config(config).upstream

    if not safe_serialization:
        raise ValueError("TorchaxVAE saves safetensors only (safe_serialization=False would write a pickle)")
    folder = Path(save_directory)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"save_pretrained needs a folder, and {str(folder)!r} is a file")
    tensors = {}
    for name, w in weights.items():  # a gather from every process: all take part
        t = to_host_torch(w)
        tensors[name] = (t if torch_dtype is None else t.to(torch_dtype)).contiguous()
    if not (is_main_process and distributed.is_primary()):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):  # the config's writer, structure only: nothing allocated
        module = upstream.from_config(dict(config))
    with atomic_output(folder / "config.json", overwrite=True) as tmp:
        tmp.write_text(module.to_json_string())
    with atomic_output(folder / with_variant(WEIGHTS_NAME, variant), overwrite=True) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    return folder
