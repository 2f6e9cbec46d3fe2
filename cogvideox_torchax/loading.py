"""Building a `TorchaxVAE`: from a diffusers folder, a hub id, or a module.

The upstream module is built from its config on the meta device (no random
init, no memory), and the safetensors are checked against it key by key and
shape by shape before anything is converted: a missing or unexpected key is an
error that names it, never a silent random init.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from jax.sharding import Mesh

# The module path earlier versions wrote into saved pipelines' model_index.json:
# diffusers loads a component only from a module already imported.
import cogvideox_torchax.runtime.vae  # noqa: F401
from cogvideox_torchax import families
from cogvideox_torchax.config import preset_config
from cogvideox_torchax.io.model_files import (
    checked_module,
    read_config,
    read_state_dict,
    resolve_model_dir,
)
from cogvideox_torchax.memory import budget
from cogvideox_torchax.options import RuntimeOptions
from cogvideox_torchax.parallel.sharding import make_mesh
from cogvideox_torchax.vae.program import tiling_switches
from cogvideox_torchax.vae.torchax_vae import TorchaxVAE


def _options(dtype: str | torch.dtype, options: RuntimeOptions | None) -> RuntimeOptions:
    if options is None:
        return RuntimeOptions(dtype=dtype)
    if dtype is not None and RuntimeOptions(dtype=dtype).dtype != options.dtype:
        raise ValueError(f"dtype={dtype!r} disagrees with options.dtype={options.dtype!r}")
    return options


def _check_loaded(state_dict: Mapping[str, torch.Tensor]) -> None:
    # A module built without its weights (accelerate's init_empty_weights, or
    # with sequential CPU offload's hooks holding them) has only meta tensors.
    on_meta = [key for key, t in state_dict.items() if t.is_meta]
    if on_meta:
        raise ValueError(
            f"{len(on_meta)} of the VAE's {len(state_dict)} weights are on the meta device ({on_meta[0]!r} first): "
            "the module was built without them (accelerate's init_empty_weights, or sequential CPU offload's "
            "hooks). Load the weights first (the class's from_pretrained, load_state_dict(..., assign=True), or "
            "pipe.remove_all_hooks() after enable_sequential_cpu_offload), then wrap"
        )


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: str | torch.dtype = "float32",
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
    max_memory: str | int | None = "auto",
    family: str | None = None,
) -> TorchaxVAE:
    """Builds a `TorchaxVAE` from a diffusers config and a matching state dict.

    ``family`` (``"cogvideox"``, ``"wan"``) names the model family; None
    reads it from the config's ``_class_name`` (none: CogVideoX).
    """
    opts = _options(dtype, options)
    budget.parse_memory(max_memory)  # refused before the weights are read
    _check_loaded(state_dict)
    device_mesh = make_mesh(mesh)
    started = time.perf_counter()
    module = checked_module(config, state_dict, None if family is None else families.get(family))
    checked = time.perf_counter()
    vae = TorchaxVAE(module, state_dict, opts, device_mesh, max_memory=max_memory)
    vae.programs.load_times.insert(0, ("checks", started, checked))
    return vae


def from_pretrained(
    path_or_hub_id: str | os.PathLike,
    *,
    subfolder: str | None = None,
    dtype: str | torch.dtype = "float32",
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
    max_memory: str | int | None = "auto",
) -> TorchaxVAE:
    """Loads a VAE saved in diffusers format: CogVideoX's or Wan's (`cogvideox_torchax.families`, from ``_class_name``).

    Args:
        path_or_hub_id: a folder with ``config.json`` and safetensors weights
            (one file, or shards with an index), or a hub id.
        subfolder: the VAE's folder inside it, e.g. ``"vae"`` for a pipeline.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (also
            ``fp32``/``bf16``/``fp16`` or a torch dtype); weights are cast to
            it. `wrap` of a float16 module (CogVideoX-2b's published
            ``torch_dtype``) runs in float16.
        mesh: None (every local device on ``tp``), ``"dp=2,tp=4"``, or a
            `jax.sharding.Mesh` with axes ``("dp", "tp")``.
        options: full `RuntimeOptions`; ``dtype`` must then agree with it.
        max_memory: the per-device budget each shape's plan must fit
            (`TorchaxVAE.memory_plan`): ``"auto"`` (the device's capacity),
            a size such as ``"16GiB"``, or bytes.

    Returns:
        The VAE, ready to `TorchaxVAE.decode`.

    Raises:
        ModelLoadError: missing folder, config or weights; a config of a
            model this runtime does not run; a config value the
            architecture cannot use (named); a shard outside the folder;
            a missing, unexpected, mis-shaped, non-float or non-finite weight
            (named).
        ValueError: a mesh that does not fit the devices; a bad dtype.
    """
    folder = resolve_model_dir(path_or_hub_id, subfolder)
    config = read_config(folder)
    budget.parse_memory(max_memory)
    return build(config, read_state_dict(folder), dtype=dtype, mesh=mesh, options=options, max_memory=max_memory)


def wrap(
    vae_module: torch.nn.Module,
    *,
    dtype: str | torch.dtype | None = None,
    mesh: Mesh | str | None = None,
    options: RuntimeOptions | None = None,
    max_memory: str | int | None = "auto",
) -> TorchaxVAE:
    """Wraps an already-built upstream VAE, e.g. ``pipe.vae``.

    The given module is left untouched (still usable eagerly); its config and
    weights are copied into a patched twin, and so are its settings (tiling,
    slicing and frames per batch: ``pipe.vae.enable_tiling()`` or a tile size
    set by hand before wrapping carries over) and its device (where results
    of non-torch inputs go, as `TorchaxVAE.device`).
    A `TorchaxVAE` (e.g. ``pipe.vae`` of a pipeline saved with one) is
    returned as it is, converted to ``dtype`` if one is given.

    Args:
        vae_module: an upstream VAE of a family this runtime runs
            (`AutoencoderKLCogVideoX`, `AutoencoderKLWan`, `AutoencoderKLLTX2Video`).
        dtype: as `from_pretrained`; default the module's own dtype.
        mesh: as `from_pretrained`.
        options: as `from_pretrained`.
        max_memory: as `from_pretrained`.

    Raises:
        TypeError: a module of a family this runtime does not run.
        ValueError: a module whose weights are still on the meta device
            (built without them): the message says how to load them.
    """
    if isinstance(vae_module, TorchaxVAE):
        if mesh is not None or options is not None or max_memory != "auto":
            raise ValueError("wrap: the VAE is already a TorchaxVAE; only dtype= can change it (by vae.to(dtype))")
        return vae_module if dtype is None else vae_module.to(dtype)
    try:
        family = families.of_module(vae_module)
    except families.UnsupportedModelError as e:
        raise TypeError(f"wrap expects an upstream VAE, got a {e}") from None
    if dtype is None and options is None:
        dtype = vae_module.dtype
    vae = build(
        vae_module.config, vae_module.state_dict(), dtype=dtype, mesh=mesh, options=options, max_memory=max_memory,
        family=family.name,
    )
    for name, value in tiling_switches(vae_module).items():
        setattr(vae, name, value)  # upstream's settings, as the module holds them (nothing compiled yet)
    if vae_module.device.type != "meta":
        vae.to(vae_module.device)
    return vae


def random_upstream(preset: str, seed: int = 0) -> torch.nn.Module:
    """The upstream VAE of a named preset (`cogvideox_torchax.config.PRESETS`) with seeded random weights (CPU, fp32).

    Presets: ``cogvideox-2b``, ``cogvideox-5b``, ``cogvideox-1.5``, ``tiny``
    (CogVideoX); ``wan2.1``, ``wan2.2-ti2v-5b``, ``wan-tiny`` (Wan). Torch's
    global RNG is left as it was.
    """
    config = preset_config(preset)
    family = families.of_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return family.upstream.from_config(config).eval()
