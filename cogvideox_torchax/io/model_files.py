"""A diffusers VAE folder on disk (or the hub): finding it, reading its config and safetensors, checking both.

Every check names what is wrong (a key, a shard, a config value) before
anything is built from it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers.models.activations import ACT2CLS  # noqa: F401  (the activations a config may name; part of the API)
from safetensors import SafetensorError
from safetensors.torch import load_file

from cogvideox_torchax import families
from cogvideox_torchax.io import paths
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
    """Reads and checks the diffusers ``config.json`` of a VAE of a family this runtime runs.

    Raises:
        ModelLoadError: no config, not JSON, a ``_class_name`` of a model
            this runtime does not run (naming those it does), or a value the
            architecture cannot use (named).
    """
    path = folder / CONFIG_NAME
    if not os.path.lexists(path):
        raise ModelLoadError(f"no {CONFIG_NAME} in model folder {str(folder)!r}")
    _refuse_unless_regular(path)
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{str(path)!r} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise ModelLoadError(f"{str(path)!r} is nested too deeply to be a config") from e
    if not isinstance(config, dict):
        raise ModelLoadError(f"{str(path)!r} holds a JSON {type(config).__name__}, not a config object")
    family_of(config, source=str(path))
    check_config(config, source=str(path))
    return config


def family_of(config: Mapping[str, Any], source: str = "config") -> families.Family:
    """The model family ``config`` describes (its ``_class_name``).

    Raises:
        ModelLoadError: a class this runtime does not run; the message names those it runs.
    """
    try:
        return families.of_config(config)
    except families.UnsupportedModelError as e:
        raise ModelLoadError(f"{source} describes a {e}") from e


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Checks every value the architecture of ``config``'s family needs, before anything is built.

    Keys left out take upstream's defaults; what upstream would only trip
    over later is refused here (`families.Family.check_config`).

    Raises:
        ModelLoadError: naming the first bad key, its value and what it must be.
    """
    try:
        family_of(config, source).check_config(config, source)
    except families.ConfigError as e:
        raise ModelLoadError(str(e)) from e


def with_variant(name: str, variant: str | None) -> str:
    """``name`` of ``variant``, as diffusers names a variant's files: before the last suffix.

    (``diffusion_pytorch_model.fp16.safetensors``, ``....safetensors.index.fp16.json``.)
    """
    if not variant:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{variant}.{suffix}"


def _refuse_unless_regular(path: Path) -> None:
    # Every model file is looked at before it is opened: a FIFO would block
    # its reader for ever, a folder or a device is no file of weights.
    problem = paths.not_a_file(path)
    if problem:
        raise ModelLoadError(f"{str(path)!r} {problem}")


def _weight_files(folder: Path, variant: str | None = None) -> list[Path]:
    files = _named_weight_files(folder, variant)
    for f in files:
        _refuse_unless_regular(f)
    return files


def _named_weight_files(folder: Path, variant: str | None = None) -> list[Path]:
    index = folder / with_variant(WEIGHTS_INDEX_NAME, variant)
    if os.path.lexists(index):
        _refuse_unless_regular(index)
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
            if not os.path.lexists(f):
                raise ModelLoadError(f"{str(index)!r} names a missing shard {name!r}")
            files.append(f)
        return files
    single = folder / with_variant(WEIGHTS_NAME, variant)
    if os.path.lexists(single):
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
        if tensor.is_floating_point() and not tensor.is_meta and not all_finite(tensor):
            raise ModelLoadError(f"weight {key!r} holds NaN or Inf")


# The exponent bits of the 16-bit floats: all set is Inf or NaN.
_HALF_EXPONENTS = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80}


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether a float tensor holds no NaN or Inf.

    On the CPU NumPy reads it in place, in one pass (16-bit floats by their
    exponent bits); torch's ``isfinite(t).all()`` makes several passes and
    was the slowest step of loading a model (docs/cli.md, "Where a run's time goes").
    """
    tensor = tensor.detach()
    if tensor.device.type != "cpu" or tensor.dtype not in (*_HALF_EXPONENTS, torch.float32, torch.float64):
        return bool(torch.isfinite(tensor).all())
    if tensor.dtype in _HALF_EXPONENTS:
        exponent = _HALF_EXPONENTS[tensor.dtype]
        return not bool(np.any((tensor.view(torch.int16).numpy() & exponent) == exponent))
    return bool(np.isfinite(tensor.numpy()).all())


def checked_module(
    config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor], family: families.Family | None = None
) -> torch.nn.Module:
    """The upstream module of ``config`` on the meta device (no init, no memory), ``state_dict`` checked against it.

    ``family`` None is the config's (its ``_class_name``).

    Raises:
        ModelLoadError: a config of a model this runtime does not run, or
            one the architecture cannot use; a missing, unexpected,
            mis-shaped, non-float or non-finite weight (named).
    """
    family = family or family_of(config)
    try:
        family.check_config(config)
    except families.ConfigError as e:
        raise ModelLoadError(str(e)) from e
    try:
        with torch.device("meta"):
            module = family.upstream.from_config(dict(config))
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError, RuntimeError,
            AssertionError) as e:
        raise ModelLoadError(f"config does not build an {family.class_name}: {e}") from e
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
