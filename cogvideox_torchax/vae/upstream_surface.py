"""What `TorchaxVAE` offers of an upstream VAE's inference surface, beyond decode and encode.

`UpstreamSurface` holds the parts of that surface that are upstream's
calling conventions (``forward``, tiling and slicing switches, ``to``,
``eval``/``train``); upstream's other attributes read through when they
are plain data and are refused otherwise (`attributes`: the rule, and
which writes reach the VAE), instead of running eager torch. The class
using it provides ``module`` (the patched upstream module), ``programs``
(its `ProgramCache`), ``reset_programs``, ``decode`` and ``encode``.
"""

from __future__ import annotations

import functools
import inspect
import os
import types
from typing import Any

import torch
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax import families
from cogvideox_torchax.vae import attributes, calls
from cogvideox_torchax.vae.attributes import (
    INFERENCE_SURFACE,
    UnsupportedAttributeError,
    refuse_other_module_attributes,
)

__all__ = ["INFERENCE_SURFACE", "UnsupportedAttributeError", "UpstreamSurface", "refuse_other_module_attributes"]


class family_signature:  # noqa: N801 (used as a decorator)
    """A method that shows its family's upstream signature (the default family's on the class).

    ``enable_tiling``'s, ``decode``'s and ``encode``'s arguments differ by
    family (CogVideoX's overlap factors, Wan's strides, LTX-2's timestep and
    causal switch); ``inspect.signature`` and ``help`` show a TorchaxVAE's
    own upstream's, and the class shows CogVideoX's.
    """

    def __init__(self, method: Any) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        family = families.DEFAULT if obj is None else obj.family
        method = self.method

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        call.__signature__ = inspect.signature(getattr(family.upstream, method.__name__))  # type: ignore[attr-defined]
        return call if obj is None else types.MethodType(call, obj)


class UpstreamSurface:
    """Upstream's inference calling conventions, as a mixin of `TorchaxVAE`."""

    # Where results of inputs that are not torch tensors go; `to` moves it.
    _result_device = torch.device("cpu")

    @property
    def config(self) -> Any:
        """The upstream diffusers config (a read-only mapping with attributes)."""
        return self.module.config

    @property
    def device(self) -> torch.device:
        """The torch device results land on when the input is not a torch tensor (CPU unless `to` moved it).

        Torch inputs get their results on their own device, whatever this says;
        the computation itself runs on the mesh's devices.
        """
        return self._result_device

    @property
    def use_tiling(self) -> bool:
        return bool(self.module.use_tiling)

    @property
    def use_slicing(self) -> bool:
        return bool(self.module.use_slicing)

    @family_signature
    def forward(self, sample: torch.Tensor, *args: Any, **kwargs: Any) -> DecoderOutput | tuple[torch.Tensor]:
        """Upstream's ``forward``: encode, take the posterior's mode (or a sample), decode.

        Takes upstream's arguments: ``sample`` (video ``(B, 3, F, H, W)`` in
        [-1, 1]), ``sample_posterior`` (decode ``latent_dist.sample(generator)``
        instead of ``latent_dist.mode()``), ``return_dict`` (a
        `DecoderOutput` or a 1-tuple), ``generator``, and its family's (LTX-2's
        ``temb`` for the decode).
        """
        arguments = calls.bind(self, "forward", (sample, *args), kwargs)
        posterior = self.encode(sample).latent_dist
        generator = arguments.get("generator")
        z = posterior.sample(generator=generator) if arguments.get("sample_posterior") else posterior.mode()
        inputs = {name: arguments[name] for name in self.family.decode_inputs(self.config) if name in arguments}
        return self.decode(z, return_dict=arguments["return_dict"], **inputs)

    __call__ = forward

    @family_signature
    def enable_tiling(self, *args: Any, **kwargs: Any) -> None:
        """Upstream's ``enable_tiling``, with its family's arguments and defaults.

        CogVideoX: ``tile_sample_min_height``, ``tile_sample_min_width``,
        ``tile_overlap_factor_height``, ``tile_overlap_factor_width`` (240x360
        tiles, overlap 1/6 x 1/5). Wan: ``tile_sample_min_height``,
        ``tile_sample_min_width``, ``tile_sample_stride_height``,
        ``tile_sample_stride_width`` (256x256 tiles, stride 192). Videos and
        latents larger than one tile then encode and decode tile by tile with
        upstream's grid and blending (CogVideoX's equal-shape tiles decoded
        together, `cogvideox_torchax.patches.tiling`). Compiled programs are
        dropped.
        """
        with self.programs.lock:  # the module's switches are read while another thread traces
            self.module.enable_tiling(*args, **kwargs)
            self.reset_programs()

    def disable_tiling(self) -> None:
        """Upstream's ``disable_tiling``; compiled programs are dropped."""
        with self.programs.lock:
            self.module.disable_tiling()
            self.reset_programs()

    def enable_slicing(self) -> None:
        """Upstream's ``enable_slicing``: a batch is encoded and decoded one element at a time.

        Results are unchanged; device memory is that of batch 1, and one
        program (for batch 1) serves every batch size.
        """
        with self.programs.lock:
            self.module.enable_slicing()

    def disable_slicing(self) -> None:
        """Upstream's ``disable_slicing``: whole batches again."""
        with self.programs.lock:
            self.module.disable_slicing()

    def to(self, *args: Any, **kwargs: Any) -> UpstreamSurface:
        """Upstream's ``.to(device)`` / ``.to(dtype)`` / ``.to(device, dtype)``, as pipelines call it; returns self.

        A dtype other than `dtype` converts the VAE: its weights once, and
        its plans and programs anew for that dtype (the next decode
        compiles). The computation stays on the mesh: a device becomes
        `device`, where results of non-torch inputs go.

        Raises:
            ValueError: a dtype this VAE cannot run (the message names those it can).
        """
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != self.dtype:
            try:
                self._set_dtype(dtype)
            except ValueError as e:
                raise ValueError(f"TorchaxVAE cannot run in {dtype}: {e}") from None
        if device is not None:
            self._result_device = torch.device(device)
        return self

    # torch.nn.Module's casts and moves, as `to` does them.

    def half(self) -> UpstreamSurface:
        return self.to(torch.float16)

    def float(self) -> UpstreamSurface:
        return self.to(torch.float32)

    def bfloat16(self) -> UpstreamSurface:
        return self.to(torch.bfloat16)

    def double(self) -> UpstreamSurface:
        return self.to(torch.float64)

    def type(self, dst_type: torch.dtype | str) -> UpstreamSurface:
        if isinstance(dst_type, str):
            raise UnsupportedAttributeError("TorchaxVAE.type takes a torch dtype", name="type", obj=self)
        return self.to(dst_type)

    def cpu(self) -> UpstreamSurface:
        return self.to("cpu")

    def cuda(self, device: int | torch.device | None = None) -> UpstreamSurface:
        return self.to(torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"))

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        is_main_process: bool = True,
        safe_serialization: bool = True,
        variant: str | None = None,
        torch_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        """Upstream's ``save_pretrained``: ``config.json`` and the weights in upstream's format (`saving`).

        ``AutoencoderKLCogVideoX.from_pretrained`` and our ``from_pretrained``
        load the folder back. The weights are written in `dtype` unless
        ``torch_dtype`` says otherwise; ``variant`` names the file as
        upstream does.

        Raises:
            ValueError: ``safe_serialization=False`` (no pickles) or a file as ``save_directory``.
            NotImplementedError: upstream's hub, sharding and custom-save options.
        """
        from cogvideox_torchax.vae import saving

        unsupported = {k: v for k, v in kwargs.items() if k in ("push_to_hub", "save_function") and v}
        if unsupported:
            raise NotImplementedError(f"TorchaxVAE.save_pretrained does not take {', '.join(unsupported)}")
        saving.save_pretrained(self.config, self.weights, save_directory, upstream=self.family.upstream,
                               is_main_process=is_main_process, safe_serialization=safe_serialization,
                               variant=variant, torch_dtype=torch_dtype)

    # Training scripts put a VAE they only encode with in inference mode;
    # these say yes to that and refuse anything else.

    @property
    def training(self) -> bool:
        """Always False: this VAE only runs inference."""
        return False

    @training.setter
    def training(self, mode: bool) -> None:
        # torch.nn.Module.__init__ sets it (to True) before anything else;
        # later, only False is taken, as by `train`.
        if mode and "programs" in self.__dict__:
            self.train(True)

    def eval(self) -> UpstreamSurface:
        """Upstream's ``eval()``: a no-op here (always in inference mode); returns self."""
        return self

    def train(self, mode: bool = True) -> UpstreamSurface:
        """``train(False)`` is a no-op returning self, as ``eval()``.

        Raises:
            UnsupportedAttributeError: ``train(True)``: this VAE cannot be trained.
        """
        if mode:
            raise UnsupportedAttributeError(
                "TorchaxVAE runs inference only and cannot be put in training mode; train the upstream module",
                name="train",
                obj=self,
            )
        return self

    def requires_grad_(self, requires_grad: bool = True) -> UpstreamSurface:
        """``requires_grad_(False)`` is a no-op returning self (nothing here takes gradients).

        Raises:
            UnsupportedAttributeError: ``requires_grad_(True)``.
        """
        if requires_grad:
            raise UnsupportedAttributeError(
                "TorchaxVAE takes no gradients; requires_grad_(True) needs the upstream module",
                name="requires_grad_",
                obj=self,
            )
        return self

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup fails: upstream's plain data,
        # else upstream's other attributes told apart from plain typos.
        return attributes.read(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Upstream's settings reach the patched module; its other attributes are refused.
        if not attributes.write(self, name, value):
            super().__setattr__(name, value)
