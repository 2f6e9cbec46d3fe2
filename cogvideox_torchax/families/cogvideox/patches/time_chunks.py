"""The decoder's resnet blocks convolving in time chunks built straight from the block's input.

In a resnet block, ``norm -> SiLU -> causal conv`` stores the conv's
padded input (the two cached frames and the activated frames) whole; the
block input stays alive beside it for the residual, and a convolution
over 2^31 elements (CUDA) was then cut into time slices of that padded
input, each one more copy. Here each convolution runs on time chunks of
its output, and each chunk's input (``halo`` cached or earlier frames and
its own) is built from the block input's frames by the norm (statistics
over the whole frame batch, taken once), the SiLU and the cache
concatenation in one pass: nothing activation-sized but the chunks'
inputs and outputs is stored, and only while that chunk convolves. The
outputs are joined along time; XLA never stores the join where every
user reads it in parts (the next norm's statistics, summed frame by frame
above `WHOLE_ELEMENTS`, and chunks).

The shortcut convolution and the upsamplers' convolutions are split at
the same size (`kernels.conv.ConvPolicy.max_elements`), so an upsampler's
output chunks are exactly the shortcut's input chunks and the block input
after an upsampler is never stored whole either.

The shortcut of a block that changes channels runs on the input's frames
as the chunks stop reading them, so the input dies frame by frame.

Values are upstream's: the same norm (`group_norm.JaxGroupNorm.apply` with
the batch's statistics, in one pass or summed frame by frame), the same cache
(``padded[:, :, -halo:]``), the same convolution on every output frame.

What this saves, step by step, is in the handbook's design notes
(docs/design.md, "Time chunks on CUDA").
"""

from __future__ import annotations

import dataclasses
import math

import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXResnetBlock3D
from diffusers.models.upsampling import CogVideoXUpsample3D

from cogvideox_torchax.families.cogvideox.patches.causal_conv import CacheFirstCausalConv3d
from cogvideox_torchax.patches.base import Patch, barrier, is_torchax, swap_classes

# Elements of a chunk's input or output: one frame of the 1.5 model's
# 256-channel activations at 768x1360 (267 M), three of the 2b's at 480x720.
CHUNK_ELEMENTS = 2**28
# A convolution whose padded input and output together hold no more than
# this runs whole: chunking the 2b model's 128-channel blocks at 480x720
# (0.74 x 2^30) saved 0.14 GiB at (1,16,13,60,90) (to 5.68) and took
# its H200 first compile from 5.1 to 8.6 s here; every convolution the 1.5
# headline chunks holds 1.1 x 2^30 or more.
WHOLE_ELEMENTS = 2**30


def _chunk_frames(conv: torch.nn.Module, x: torch.Tensor, chunk_elements: int, whole_elements: int) -> int | None:
    """Output frames per chunk of ``conv`` (a causal conv) on ``x``: inputs and outputs within ``chunk_elements``.

    None where the convolution runs whole: its padded input and output
    together hold at most ``whole_elements``.
    """
    halo = conv.time_kernel_size - 1
    frames = x.shape[2]
    in_frame = math.prod(x.shape[:2]) * math.prod(x.shape[3:])
    out_frame = x.shape[0] * conv.conv.out_channels * math.prod(x.shape[3:])
    if (frames + halo) * in_frame + frames * out_frame <= whole_elements:
        return None
    return max(1, min(chunk_elements // in_frame - halo, chunk_elements // out_frame))


def norm_act_conv(norm, act, conv, x: torch.Tensor, zq: torch.Tensor, norm_cache, conv_cache,
                  chunk_elements: int, whole_elements: int, side=None):
    """``conv(act(norm(x, zq)))`` as upstream's resnet block computes it, chunk by chunk in time.

    ``side(frames)``, if given, is computed on ``x``'s frames as soon as
    no chunk reads them any more, and its results are
    returned joined (the block's shortcut: the input's frames die as the
    chunks pass them).

    Returns:
        ``(outputs, new_norm_cache, new_conv_cache, side_output)``, the
        outputs a list of time chunks in order, or None where this
        does not apply (then the caller runs upstream's code).
    """
    # Time taps carry partial sums as their cache, not input frames.
    if type(conv) is not CacheFirstCausalConv3d or conv.pad_mode == "replicate":
        return None
    frames = x.shape[2]
    per_chunk = _chunk_frames(conv, x, chunk_elements, whole_elements)
    if per_chunk is None or per_chunk >= frames:
        return None
    # Statistics frame by frame keep a joined input from being stored whole
    # for their second pass; below `whole_elements` that store is small and
    # the frames' reductions cost more compile time than it (1.5 headline,
    # H200: 15.42 -> 15.61 GiB, compile 12.4 -> 10.9 s; 2b: 5.82 -> 5.80).
    by_frame = math.prod(x.shape) > whole_elements
    activated, new_norm_cache = norm.frames(x, zq, norm_cache, by_frame=by_frame)
    if activated is None:
        return None
    halo = conv.time_kernel_size - 1
    # Upstream pads with the cache, or with the first activated frame repeated.
    head = conv_cache if conv_cache is not None else torch.cat([act(activated(0, 1))] * halo, dim=2)

    def padded(start: int, stop: int) -> torch.Tensor:  # frames start:stop of cat(head, act(norm(x)))
        parts = []
        if start < halo:
            parts.append(head[:, :, start : min(stop, halo)])
        if stop > halo:
            # Frame by frame: a range across the chunks x was joined from
            # (an upsampler's) is normed as a join of its own, which jax
            # 0.12's XLA:GPU stores apart from this input (docs: compiled
            # targets, jax 0.12).
            parts.extend(act(activated(t, t + 1)) for t in range(max(start - halo, 0), stop - halo))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    outputs, new_cache, sides, done = [], None, [], 0
    for start in range(0, frames, per_chunk):
        stop = min(start + per_chunk, frames)
        out = conv.conv(padded(start, stop + halo))
        tied = {"out": out, "statistics": activated.statistics}
        if new_cache is not None:
            tied["cache"] = new_cache
        if sides:
            tied["side"] = sides[-1]
        # Frames of x the next chunk does not read go to the side
        # computation after this chunk (through the barrier), not before.
        # Above `whole_elements` the frames go one chunk earlier, those the
        # chunk after next does not read: their shortcut runs before the next
        # barrier, while the next chunk's input, built alongside, still
        # reads them. Otherwise jax 0.12's XLA:GPU builds that input first
        # and holds a frame no chunk reads through it; below that size the
        # earlier shortcut made jax 0.12's program larger, not smaller.
        ahead = min(stop + per_chunk, frames) if by_frame else stop
        free = frames if ahead == frames else max(ahead - halo, 0)
        if side is not None and free > done:
            # Frame by frame: a range across the chunks x was joined from
            # would be stored joined.
            tied["frames"] = tuple(x[:, :, t : t + 1] for t in range(done, free))
            done = free
        # The next chunk's input is built once this chunk is convolved (its
        # norm reads the statistics through the barrier): left free, XLA
        # builds every chunk's input at once, in one multi-output fusion.
        tied = dict(zip(tied, barrier(tuple(tied.values())), strict=True))
        out, activated.statistics = tied["out"], tied["statistics"]
        new_cache = tied.get("cache")
        if sides:
            sides[-1] = tied["side"]
        if "frames" in tied:
            sides.append(torch.cat([side(f) for f in tied["frames"]], dim=2))
        outputs.append(out)
        if new_cache is None and start + per_chunk >= halo:
            # Upstream's cache, padded[:, :, -halo:], taken once no chunk
            # reads the old cache any more (through the statistics), and
            # before the next chunk (the barrier above): the scan then
            # writes it in the old one's place instead of copying it there,
            # and nothing keeps the input alive for it.
            new_cache = padded(frames, frames + halo).clone()
    if new_cache is None:
        new_cache = padded(frames, frames + halo).clone()
    side_output = None if side is None else torch.cat(sides, dim=2)
    return outputs, new_norm_cache, new_cache, side_output


class TimeChunkedResnetBlock3D(CogVideoXResnetBlock3D):
    """A decoder `CogVideoXResnetBlock3D` whose two causal convolutions run in time chunks (`norm_act_conv`)."""

    chunk_elements: int = CHUNK_ELEMENTS
    whole_elements: int = WHOLE_ELEMENTS

    def forward(self, inputs, temb=None, zq=None, conv_cache=None):
        if not is_torchax(inputs) or zq is None or temb is not None or self.use_conv_shortcut:
            return super().forward(inputs, temb, zq, conv_cache)
        conv_cache = conv_cache or {}
        shortcut = None
        if self.in_channels != self.out_channels:
            shortcut = self.conv_shortcut
        first = norm_act_conv(self.norm1, self.nonlinearity, self.conv1, inputs, zq, conv_cache.get("norm1"),
                              conv_cache.get("conv1"), self.chunk_elements, self.whole_elements, side=shortcut)
        if first is None:
            return super().forward(inputs, temb, zq, conv_cache)
        new_conv_cache = {}
        outputs, new_conv_cache["norm1"], new_conv_cache["conv1"], residual = first
        if residual is None:
            residual = inputs
        hidden_states = torch.cat(outputs, dim=2)
        act = lambda h: self.dropout(self.nonlinearity(h))  # noqa: E731  (upstream: SiLU, then dropout)
        second = norm_act_conv(self.norm2, act, self.conv2, hidden_states, zq,
                               conv_cache.get("norm2"), conv_cache.get("conv2"), self.chunk_elements,
                               self.whole_elements)
        if second is None:
            hidden_states, new_conv_cache["norm2"] = self.norm2(hidden_states, zq, conv_cache=conv_cache.get("norm2"))
            hidden_states = self.dropout(self.nonlinearity(hidden_states))
            hidden_states, new_conv_cache["conv2"] = self.conv2(hidden_states, conv_cache=conv_cache.get("conv2"))
            outputs = [hidden_states]
        else:
            outputs, new_conv_cache["norm2"], new_conv_cache["conv2"], _ = second
        return torch.cat(outputs, dim=2) + residual, new_conv_cache


def apply_time_chunks(vae: torch.nn.Module, chunk_elements: int = CHUNK_ELEMENTS,
                      whole_elements: int = WHOLE_ELEMENTS) -> int:
    """Makes the decoder's resnet blocks `TimeChunkedResnetBlock3D`; splits shortcuts and upsamplers alike.

    A convolution runs in chunks of at most ``chunk_elements`` (input or
    output) where its padded input and output hold more than
    ``whole_elements`` together.

    Needs `group_norm.apply_group_norm`, `spatial_norm.apply_low_res_spatial_norm`,
    `causal_conv.apply_cache_first` and `conv.apply_conv_bias` applied first.

    Returns:
        How many modules changed class in this call (0 on a second call).
    """
    decoder = getattr(vae, "decoder", vae)
    count = swap_classes(decoder, {CogVideoXResnetBlock3D: TimeChunkedResnetBlock3D})
    for module in decoder.modules():
        if isinstance(module, TimeChunkedResnetBlock3D):
            module.chunk_elements, module.whole_elements = chunk_elements, whole_elements
        convs = []
        if isinstance(module, TimeChunkedResnetBlock3D) and module.in_channels != module.out_channels:
            convs.append(getattr(module, "conv_shortcut", None))
        if isinstance(module, CogVideoXUpsample3D):
            convs.append(module.conv)
        for c in convs:
            policy = getattr(c, "conv_policy", None)
            if policy is not None:
                limit = min(policy.max_elements or chunk_elements, chunk_elements)
                c.conv_policy = dataclasses.replace(policy, max_elements=limit)
    return count


PATCHES = (
    Patch(
        "time_chunks", "blocks",
        "The decoder's resnet blocks convolve in time chunks whose inputs are built straight from the block input "
        "(`time_chunks.TimeChunkedResnetBlock3D`): no padded input stored whole (H200, bf16: 1.5 at (1,16,21,96,170) "
        "20.40 -> 15.61 GiB, 2b at (1,16,13,60,90) 6.44 -> 5.80 GiB of temporaries).",
        lambda m, plan, mesh: apply_time_chunks(m),
        families=("cogvideox",),
        platforms=("cuda",),
        platforms_why="measured on CUDA only (compiled for an H200)",
        requires=("group_norm", "conv_bias", "cache_first", "low_res_spatial_norm"),
    ),
)
