"""Upstream's folder format for a `TorchaxVAE`, both ways.

Saving writes what upstream's and our `from_pretrained` load back; reading
is what diffusers' pipeline loader asks of a folder that names our class.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from cogvideox_torchax.io import model_files
from cogvideox_torchax.io.model_files import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, with_variant
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
    of the same name as upstream's ``save_pretrained`` does. An earlier
    sharded save's shards are removed first, as upstream removes them, and
    so is its index, which every loader would read before the one file
    (`stale_weights`): the folder then loads as what was saved.

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
    for stale in stale_weights(folder, variant):
        stale.unlink()
    with torch.device("meta"):  # the config's writer, structure only: nothing allocated
        module = upstream.from_config(dict(config))
    with atomic_output(folder / "config.json", overwrite=True) as tmp:
        tmp.write_text(module.to_json_string())
    with atomic_output(folder / with_variant(WEIGHTS_NAME, variant), overwrite=True) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    return folder


# Upstream's shard names: ``<weights name>-00001-of-00002``, before the suffix.
_SHARD = re.compile(r"(.*?)-\d{5}-of-\d{5}")


def stale_weights(folder: Path, variant: str | None = None) -> list[Path]:
    """The files of an earlier save in ``folder`` that a one-file save of ``variant`` leaves stale.

    Shards by upstream's own rule (`ModelMixin.save_pretrained` removes each
    regular file named after the weights, ``.safetensors`` or ``.bin``, whose
    stem ends in ``-NNNNN-of-NNNNN``), and the variant's indexes
    (safetensors' and pickles'), which upstream leaves but every loader
    would follow to weights that are no longer there or no longer current.
    Nothing else: other files, folders and other variants' indexes stay.
    """
    stem = with_variant(WEIGHTS_NAME, variant).removesuffix(".safetensors")
    indexes = {with_variant(name, variant) for name in (WEIGHTS_INDEX_NAME, "diffusion_pytorch_model.bin.index.json")}
    found = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_file():
            continue
        bare = entry.name.replace(".bin", "").replace(".safetensors", "")
        if entry.name in indexes or (entry.name.startswith(stem) and _SHARD.fullmatch(bare)):
            found.append(entry)
    return found


def read_saved(
    pretrained_model_name_or_path: str | os.PathLike,
    subfolder: str | None = None,
    variant: str | None = None,
    dtype: torch.dtype | None = None,
    loader_kwargs: dict[str, Any] | None = None,
) -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.dtype]:
    """A saved VAE folder's checked upstream module (structure), its state dict and the dtype to run in.

    ``dtype`` None keeps the dtype the weights were saved in (float32 if
    they mix dtypes).

    Raises:
        NotImplementedError: diffusers' device maps, offloading,
            quantization or non-safetensors loading in ``loader_kwargs``.
        ModelLoadError: as `cogvideox_torchax.from_pretrained`.
    """
    model_files.check_loader_kwargs(loader_kwargs or {})
    folder = model_files.resolve_model_dir(pretrained_model_name_or_path, subfolder)
    config = model_files.read_config(folder)
    state_dict = model_files.read_state_dict(folder, variant)
    if dtype is None:
        dtypes = {t.dtype for t in state_dict.values()}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    return model_files.checked_module(config, state_dict), state_dict, dtype
