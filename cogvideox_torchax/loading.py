"""Building a `TorchaxVAE`: from a diffusers folder, a hub id, or a module.

The upstream module is built from its config on the meta device (no random
init, no memory), and the safetensors are checked against it key by key and
shape by shape before anything is converted: a missing or unexpected key is an
error that names it, never a silent random init.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLCogVideoX
from jax.sharding import Mesh
from safetensors import SafetensorError
from safetensors.torch import load_file

from cogvideox_torchax.config import RuntimeOptions, preset_config
from cogvideox_torchax.sharding import make_mesh
from cogvideox_torchax.vae import TorchaxVAE

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"

# owner/name as the hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(ValueError):
    """The model folder, hub id or weights cannot be used; the message says why."""


def _hub_snapshot(repo_id: str, subfolder: str | None) -> Path:
    # Imported here: only hub users pay for it, and HF_HUB_OFFLINE is read at
    # import time, so tests can set it first.
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        root = huggingface_hub.snapshot_download(repo_id, allow_patterns=[f"{prefix}*.json", f"{prefix}*.safetensors"])
    except LocalEntryNotFoundError as e:
        raise ModelLoadError(
            f"{repo_id!r} is not in the local Hugging Face cache and the hub cannot be reached "
            f"(offline mode or no network); download it where you have a network, or pass a "
            f"local diffusers folder (one holding {CONFIG_NAME} and safetensors weights)"
        ) from e
    except (HfHubHTTPError, OSError) as e:
        raise ModelLoadError(f"could not fetch {repo_id!r} from the hub: {e}") from e
    return Path(root)


def resolve_model_dir(path_or_hub_id: str | os.PathLike, subfolder: str | None = None) -> Path:
    """Finds the folder holding ``config.json`` and the weights.

    Args:
        path_or_hub_id: a local diffusers folder, or a hub id such as
            ``"THUDM/CogVideoX-2b"`` (fetched through `huggingface_hub`, which
            uses its cache and honours ``HF_HUB_OFFLINE``).
        subfolder: e.g. ``"vae"`` for a whole-pipeline repository or folder.

    Raises:
        ModelLoadError: no such folder, or the hub id cannot be fetched.
    """
    path = Path(path_or_hub_id)
    if path.exists():
        root = path
    elif isinstance(path_or_hub_id, str) and _HUB_ID.match(path_or_hub_id):
        root = _hub_snapshot(path_or_hub_id, subfolder)
    else:
        raise ModelLoadError(f"no such model folder: {str(path_or_hub_id)!r}")
    folder = root / subfolder if subfolder else root
    if not folder.is_dir():
        raise ModelLoadError(f"model path is not a folder: {str(folder)!r}")
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    """Reads and checks the diffusers ``config.json`` of an AutoencoderKLCogVideoX."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise ModelLoadError(f"no {CONFIG_NAME} in model folder {str(folder)!r}")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{str(path)!r} is not valid JSON: {e}") from e
    cls = config.get("_class_name", AutoencoderKLCogVideoX.__name__) if isinstance(config, dict) else None
    if cls != AutoencoderKLCogVideoX.__name__:
        raise ModelLoadError(f"{str(path)!r} describes a {cls!r}, not an {AutoencoderKLCogVideoX.__name__}")
    return config


def _weight_files(folder: Path) -> list[Path]:
    index = folder / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{str(index)!r} is not a safetensors index: {e}") from e
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{str(index)!r} names a missing shard {f.name!r}")
        return files
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found
    if not found:
        raise ModelLoadError(f"no safetensors weights ({WEIGHTS_NAME} or an index) in {str(folder)!r}")
    raise ModelLoadError(
        f"several safetensors files and no {WEIGHTS_INDEX_NAME} in {str(folder)!r}: {', '.join(f.name for f in found)}"
    )


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Reads every safetensors file of the model (one file or an indexed set)."""
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(folder):
        try:
            part = load_file(f)
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"cannot read weights {str(f)!r}: {e}") from e
        duplicate = state.keys() & part.keys()
        if duplicate:
            raise ModelLoadError(f"weight {sorted(duplicate)[0]!r} appears in more than one shard")
        state.update(part)
    return state


def check_state_dict(module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Asserts the state dict has exactly the module's keys and shapes.

    Raises:
        ModelLoadError: naming the first missing, unexpected or mis-shaped key.
    """
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"weights are missing key {missing[0]!r}{more}")
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(f"weights have unexpected key {unexpected[0]!r}{more}")
    for key, shape in expected.items():
        got = tuple(state_dict[key].shape)
        if got != shape:
            raise ModelLoadError(f"weight {key!r} has shape {got}, the model expects {shape}")


def _meta_module(config: Mapping[str, Any]) -> AutoencoderKLCogVideoX:
    try:
        with torch.device("meta"):
            return AutoencoderKLCogVideoX.from_config(dict(config))
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"config does not build an AutoencoderKLCogVideoX: {e}") from e


def _options(dtype: str | torch.dtype, options: RuntimeOptions | None) -> RuntimeOptions:
    if options is None:
        return RuntimeOptions(dtype=dtype)
    if dtype is not None and RuntimeOptions(dtype=dtype).dtype != options.dtype:
        raise ValueError(f"dtype={dtype!r} disagrees with options.dtype={options.dtype!r}")
    return options


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: str | torch.dtype = "float32",
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
) -> TorchaxVAE:
    """Builds a `TorchaxVAE` from a diffusers config and a matching state dict."""
    opts = _options(dtype, options)
    device_mesh = make_mesh(mesh)
    module = _meta_module(config)
    check_state_dict(module, state_dict)
    return TorchaxVAE(module, state_dict, opts, device_mesh)


def from_pretrained(
    path_or_hub_id: str | os.PathLike,
    *,
    subfolder: str | None = None,
    dtype: str | torch.dtype = "float32",
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
) -> TorchaxVAE:
    """Loads a CogVideoX VAE saved in diffusers format.

    Args:
        path_or_hub_id: a folder with ``config.json`` and safetensors weights
            (one file, or shards with an index), or a hub id.
        subfolder: the VAE's folder inside it, e.g. ``"vae"`` for a pipeline.
        dtype: ``"float32"`` or ``"bfloat16"`` (also ``fp32``/``bf16`` or a
            torch dtype); weights are cast to it.
        mesh: None (every local device on ``tp``), ``"dp=2,tp=4"``, or a
            `jax.sharding.Mesh` with axes ``("dp", "tp")``.
        options: full `RuntimeOptions`; ``dtype`` must then agree with it.

    Returns:
        The VAE, ready to `TorchaxVAE.decode`.

    Raises:
        ModelLoadError: missing folder, config or weights; a missing,
            unexpected or mis-shaped weight (named).
        ValueError: a mesh that does not fit the devices; a bad dtype.
    """
    folder = resolve_model_dir(path_or_hub_id, subfolder)
    config = read_config(folder)
    return build(config, read_state_dict(folder), dtype=dtype, mesh=mesh, options=options)


def wrap(
    vae_module: AutoencoderKLCogVideoX,
    *,
    dtype: str | torch.dtype | None = None,
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
) -> TorchaxVAE:
    """Wraps an already-built upstream VAE, e.g. ``pipe.vae``.

    The given module is left untouched (still usable eagerly); its config and
    weights are copied into a patched twin, and so are its tiling and slicing
    switches (``pipe.vae.enable_tiling()`` before wrapping carries over).

    Args:
        vae_module: an `AutoencoderKLCogVideoX`.
        dtype: as `from_pretrained`; default the module's own dtype.
        mesh: as `from_pretrained`.
        options: as `from_pretrained`.
    """
    if not isinstance(vae_module, AutoencoderKLCogVideoX):
        raise TypeError(f"wrap expects an AutoencoderKLCogVideoX, got {type(vae_module).__name__}")
    if dtype is None and options is None:
        dtype = vae_module.dtype
    vae = build(vae_module.config, vae_module.state_dict(), dtype=dtype, mesh=mesh, options=options)
    if vae_module.use_tiling:
        vae.enable_tiling(
            tile_sample_min_height=vae_module.tile_sample_min_height,
            tile_sample_min_width=vae_module.tile_sample_min_width,
            tile_overlap_factor_height=vae_module.tile_overlap_factor_height,
            tile_overlap_factor_width=vae_module.tile_overlap_factor_width,
        )
    if vae_module.use_slicing:
        vae.enable_slicing()
    return vae


def random_upstream(preset: str, seed: int = 0) -> AutoencoderKLCogVideoX:
    """The upstream VAE of a named preset with seeded random weights (CPU, fp32).

    Torch's global RNG is left as it was.
    """
    config = preset_config(preset)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoencoderKLCogVideoX.from_config(config).eval()
