"""A diffusers VAE folder on disk (or the hub): finding it, reading its config and safetensors, checking both.

Every check names what is wrong (a key, a shard, a config value) before
anything is built from it.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.activations import ACT2CLS
from safetensors import SafetensorError
from safetensors.torch import load_file

from cogvideox_torchax.io.latents import LatentsError, check_header

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

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
    except RecursionError as e:
        raise ModelLoadError(f"{str(path)!r} is nested too deeply to be a config") from e
    cls = config.get("_class_name", AutoencoderKLCogVideoX.__name__) if isinstance(config, dict) else None
    if cls != AutoencoderKLCogVideoX.__name__:
        raise ModelLoadError(f"{str(path)!r} describes a {cls!r}, not an {AutoencoderKLCogVideoX.__name__}")
    check_config(config, source=str(path))
    return config


# Upstream's defaults for the keys a config may leave out.
_DEFAULTS = {
    k: v.default
    for k, v in inspect.signature(AutoencoderKLCogVideoX.__init__).parameters.items()
    if k != "self"
}
_POSITIVE_INTS = ("in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups",
                  "sample_height", "sample_width")
_MAX_INT = 2**31 - 1
_BLOCK_TYPES = {"down_block_types": "CogVideoXDownBlock3D", "up_block_types": "CogVideoXUpBlock3D"}
_FLAGS = ("use_quant_conv", "use_post_quant_conv", "invert_scale_latents")
_ACTIVATIONS = frozenset(ACT2CLS)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    """A number (not a bool) whose float is finite (ints too large for a float are not)."""
    try:
        return _is_number(v) and math.isfinite(float(v))
    except OverflowError:
        return False


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Checks every value the architecture needs, before anything is built.

    Keys left out take upstream's defaults. What diffusers would only trip
    over later (a division by ``norm_num_groups`` 0, an empty
    ``block_out_channels``, ``log2`` of a ``temporal_compression_ratio`` 0, a
    ``scaling_factor`` 0 the latents are divided by) is refused here.

    Raises:
        ModelLoadError: naming the first bad key, its value and what it must be.
    """

    def bad(key: str, must: str) -> ModelLoadError:
        value = repr(merged[key])
        value = value if len(value) <= 60 else value[:57] + "..."
        return ModelLoadError(f"{source}: {key!r} is {value}; it must be {must}")

    merged = {**_DEFAULTS, **config}
    for key in _POSITIVE_INTS:
        v = merged[key]
        if not (_is_int(v) and 1 <= v <= _MAX_INT):
            raise bad(key, f"an integer from 1 to {_MAX_INT}")
    blocks = merged["block_out_channels"]
    if not (isinstance(blocks, (list, tuple)) and blocks and all(_is_int(c) and 1 <= c <= _MAX_INT for c in blocks)):
        raise bad("block_out_channels", "a non-empty list of positive integers")
    groups = merged["norm_num_groups"]
    if any(c % groups for c in blocks):
        raise bad("block_out_channels", f"channel counts divisible by norm_num_groups ({groups})")
    for key, name in _BLOCK_TYPES.items():
        types = merged[key]
        if not (isinstance(types, (list, tuple)) and len(types) == len(blocks) and all(t == name for t in types)):
            raise bad(key, f"a list of {len(blocks)} {name!r} (one per block_out_channels entry)")
    ratio = merged["temporal_compression_ratio"]
    top = 2 ** (len(blocks) - 1)
    if not (_finite(ratio) and float(ratio) in {float(2**k) for k in range(len(blocks))}):
        raise bad("temporal_compression_ratio", f"a power of two from 1 to {top}")
    for key in ("scaling_factor", "norm_eps"):
        v = merged[key]
        # The latents are divided by the scaling factor: its inverse must be finite too.
        if not (_finite(v) and v > 0 and math.isfinite(1.0 / float(v))):
            raise bad(key, "a finite number above 0 (with a finite inverse)")
    shift = merged["shift_factor"]
    if shift is not None and not _finite(shift):
        raise bad("shift_factor", "null or a finite number")
    for key in ("latents_mean", "latents_std"):
        v = merged[key]
        if v is not None and not (isinstance(v, (list, tuple)) and all(_finite(x) for x in v)):
            raise bad(key, "null or a list of finite numbers")
    if merged["act_fn"] not in _ACTIVATIONS:
        raise bad("act_fn", f"one of {', '.join(sorted(_ACTIVATIONS))}")
    for key in _FLAGS:
        if not isinstance(merged[key], bool):
            raise bad(key, "true or false")
    if not (isinstance(merged["force_upcast"], bool) or _is_number(merged["force_upcast"])):
        raise bad("force_upcast", "true or false")


def with_variant(name: str, variant: str | None) -> str:
    """``name`` of ``variant``, as diffusers names a variant's files: before the last suffix.

    (``diffusion_pytorch_model.fp16.safetensors``, ``....safetensors.index.fp16.json``.)
    """
    if not variant:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{variant}.{suffix}"


def _weight_files(folder: Path, variant: str | None = None) -> list[Path]:
    index = folder / with_variant(WEIGHTS_INDEX_NAME, variant)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, RecursionError) as e:
            raise ModelLoadError(f"{str(index)!r} is not a safetensors index: {e}") from e
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{str(index)!r} is not a safetensors index: 'weight_map' must map names to files")
        root = folder.resolve()
        files = []
        for name in sorted(set(weight_map.values())):
            f = folder / name
            # Shards live inside the model folder: no absolute paths, no
            # '..', no links leading out of it.
            if "\0" in name or Path(name).is_absolute() or not f.resolve().is_relative_to(root):
                raise ModelLoadError(f"{str(index)!r} names a shard outside the model folder: {name!r}")
            if not f.is_file():
                raise ModelLoadError(f"{str(index)!r} names a missing shard {name!r}")
            files.append(f)
        return files
    single = folder / with_variant(WEIGHTS_NAME, variant)
    if single.is_file():
        return [single]
    if variant:
        raise ModelLoadError(f"no weights of variant {variant!r} ({single.name} or an index) in {str(folder)!r}")
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found
    if not found:
        raise ModelLoadError(f"no safetensors weights ({WEIGHTS_NAME} or an index) in {str(folder)!r}")
    raise ModelLoadError(
        f"several safetensors files and no {WEIGHTS_INDEX_NAME} in {str(folder)!r}: {', '.join(f.name for f in found)}"
    )


def read_state_dict(folder: Path, variant: str | None = None) -> dict[str, torch.Tensor]:
    """Reads every safetensors file of the model (one file or an indexed set; ``variant``'s as diffusers names it)."""
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(folder, variant):
        try:
            check_header(f)  # the format's rules, checked before any data is read
            part = load_file(f)
        except LatentsError as e:
            raise ModelLoadError(f"cannot read weights: {e}") from e
        except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError, KeyError) as e:
            raise ModelLoadError(f"cannot read weights {str(f)!r}: {' '.join(str(e).split())}") from e
        for key, tensor in part.items():
            if tensor.dtype not in FLOAT_DTYPES:
                raise ModelLoadError(
                    f"weight {key!r} in {str(f)!r} is {tensor.dtype}; only float16, bfloat16, float32 and "
                    "float64 weights are loaded"
                )
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


def check_finite_weights(state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raises `ModelLoadError` naming the first weight that holds NaN or Inf."""
    for key, tensor in state_dict.items():
        if tensor.is_floating_point() and not tensor.is_meta and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"weight {key!r} holds NaN or Inf")


def checked_module(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> AutoencoderKLCogVideoX:
    """The upstream module of ``config`` on the meta device (no init, no memory), ``state_dict`` checked against it.

    Raises:
        ModelLoadError: a config the architecture cannot use; a missing,
            unexpected, mis-shaped, non-float or non-finite weight (named).
    """
    check_config(config)
    try:
        with torch.device("meta"):
            module = AutoencoderKLCogVideoX.from_config(dict(config))
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError, RuntimeError) as e:
        raise ModelLoadError(f"config does not build an AutoencoderKLCogVideoX: {e}") from e
    check_state_dict(module, state_dict)
    check_finite_weights(state_dict)
    return module


# What diffusers' pipeline loader may pass a component's from_pretrained
# beyond the dtype and variant: the values that ask for nothing this loader
# does not do anyway (the others ask for device maps, offloading,
# quantization or pickles, and are refused).
_LOADER_NO_OPS = {
    "device_map": (None,),
    "max_memory": (None,),
    "offload_folder": (None,),
    "quantization_config": (None,),
    "use_flashpack": (False,),
    "use_safetensors": (None, True),
    "low_cpu_mem_usage": (None, True, False),
    "disable_mmap": (None, True, False),
    "offload_state_dict": (None, True, False),
}


def check_loader_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Refuses what diffusers' pipeline loader may pass that this loader does not do.

    Raises:
        NotImplementedError: naming each such argument.
    """
    asked = sorted(k for k, v in kwargs.items() if not any(v is ok for ok in _LOADER_NO_OPS.get(k, ())))
    if asked:
        raise NotImplementedError(
            f"TorchaxVAE.from_pretrained does not take {', '.join(asked)}: it loads safetensors onto the "
            "JAX devices itself"
        )
