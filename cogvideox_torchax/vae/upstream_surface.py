"""What `TorchaxVAE` offers of an upstream VAE's inference surface, beyond decode and encode.

`UpstreamSurface` holds the parts of that surface that are upstream's
calling conventions (``forward``, tiling and slicing switches, ``to``,
``eval``/``train``) and refuses the rest with `UnsupportedAttributeError`
instead of running eager torch. The class using it provides ``module``
(the patched upstream module), ``programs`` (its `ProgramCache`),
``reset_programs``, ``decode`` and ``encode``.
"""

from __future__ import annotations

import functools
import inspect
import os
import types
from typing import Any

import torch
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.utils import deprecate

from cogvideox_torchax import families

# What `TorchaxVAE` offers of upstream's surface; other upstream attributes
# raise `UnsupportedAttributeError` naming this list.
INFERENCE_SURFACE = (
    "decode",
    "encode",
    "forward",
    "enable_tiling",
    "disable_tiling",
    "enable_slicing",
    "disable_slicing",
    "use_tiling",
    "use_slicing",
    "config",
    "dtype",
    "device",
    "to",
    "eval",
    "train",
    "training",
    "requires_grad_",
    "save_pretrained",
    "from_pretrained",
    "half",
    "float",
    "bfloat16",
    "double",
    "type",
    "cpu",
    "cuda",
)

# torch.nn.Module and ModelMixin attributes that diffusers' pipelines and
# accelerate's offload hooks use on any component, and that are true of this
# VAE as they stand: it has no torch submodules (`modules` yields itself,
# `children` nothing) and its config file name is upstream's.
_MODULE_ATTRIBUTES_KEPT = (
    "modules",
    "named_modules",
    "children",
    "named_children",
    "config_name",
    "extra_repr",
    "dump_patches",
    "call_super_init",
)


def refuse_other_module_attributes(cls: type) -> type:
    """Makes the public ``torch.nn.Module`` / ``ModelMixin`` attributes of ``cls`` outside the surface refused.

    ``state_dict``, ``parameters``, hooks, gradient checkpointing and the
    rest would act on torch parameters and submodules the VAE does not
    have (its weights are JAX arrays), silently. Each becomes a property
    that raises `UnsupportedAttributeError` as upstream attributes missing
    here do, so ``hasattr`` says no.
    """
    names = {name for base in cls.__mro__ for name in vars(base) if not name.startswith("_")}
    for name in sorted(names - set(INFERENCE_SURFACE) - set(_MODULE_ATTRIBUTES_KEPT)):
        # Refused only where torch's or diffusers' definition is the one found (ours win).
        owner = next(base for base in cls.__mro__ if name in vars(base))
        if owner.__module__.startswith(("torch.", "diffusers.")):
            setattr(cls, name, property(functools.partial(UpstreamSurface.__getattr__, name=name)))
    return cls



class UnsupportedAttributeError(AttributeError, NotImplementedError):
    """An upstream VAE's attribute (`AutoencoderKLCogVideoX`, `AutoencoderKLWan`) that `TorchaxVAE` does not offer.

    Both an AttributeError (so ``hasattr`` and ``getattr(obj, name, default)``
    answer "absent", as diffusers' pipelines probe components) and a
    NotImplementedError (it exists upstream, just not here).
    """


class _family_signature:  # noqa: N801 (used as a decorator)
    """A method that shows its family's upstream signature (the default family's on the class).

    ``enable_tiling``'s arguments differ by family (CogVideoX's overlap
    factors, Wan's strides); ``inspect.signature`` and ``help`` show a
    TorchaxVAE's own upstream's, and the class shows CogVideoX's as before.
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

    def forward(
        self,
        sample: torch.Tensor,
        sample_posterior: bool = False,
        return_dict: bool = True,
        generator: torch.Generator | None = None,
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Upstream's ``forward``: encode, take the posterior's mode (or a sample), decode.

        Args:
            sample: video ``(B, 3, F, H, W)`` in [-1, 1].
            sample_posterior: decode ``latent_dist.sample(generator)`` instead
                of ``latent_dist.mode()``.
            return_dict: a `DecoderOutput` or a 1-tuple.
            generator: for the posterior sample.
        """
        posterior = self.encode(sample).latent_dist
        z = posterior.sample(generator=generator) if sample_posterior else posterior.mode()
        return self.decode(z, return_dict=return_dict)

    __call__ = forward

    @_family_signature
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
        # Only reached when ordinary lookup fails: tell upstream's other
        # attributes apart from plain typos.
        programs = self.__dict__.get("programs")
        if programs is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)
        module = programs.own.module
        if name in module.config and name not in vars(module):
            # Upstream's deprecated direct config access, with its warning.
            deprecate(
                "direct config name access",
                "1.0.0",
                f"Accessing config attribute `{name}` directly via '{type(self).__name__}' object attribute is "
                f"deprecated. Please access '{name}' over '{type(self).__name__}'s config object instead, e.g. "
                f"'vae.config.{name}'.",
                standard_warn=False,
                stacklevel=3,
            )
            return module.config[name]
        if hasattr(module, name):
            raise UnsupportedAttributeError(
                f"TorchaxVAE does not offer {self.family.class_name}.{name}: it runs only the inference "
                f"surface ({', '.join(INFERENCE_SURFACE)}) under JAX; use the upstream module for anything else",
                name=name,
                obj=self,
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)
