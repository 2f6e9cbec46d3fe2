"""One call to upstream and the same call to the wrapped VAE: the same error type, or outputs within a tolerance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.parity import assert_close


def outcome(call: Callable[[], Any], seed: int | None = None) -> Any:
    """The call's tensor (a decode's sample, an encode's posterior mean), or the exception it raised.

    ``seed``: torch's generator seeded so first (a decoder injecting noise draws from it).
    """
    if seed is not None:
        import torch

        torch.manual_seed(seed)
    try:
        out = call()
    except Exception as e:  # noqa: BLE001  (whatever upstream raises is an expectation)
        return e
    return out.sample if hasattr(out, "sample") else out.latent_dist.mean


def assert_as_upstream(upstream_call: Callable[[], Any], our_call: Callable[[], Any], label: str,
                       atol: float = 1e-4, seed: int | None = 0) -> Any:
    """Ours raises what upstream raises (also a ValueError), or gives its output within ``atol``; returns upstream's.

    The meta device checks in torch's shape functions, which may raise the
    parent of the type a CPU kernel raises (bool latents: RuntimeError where
    the CPU's reflection pad says NotImplementedError).
    """
    import torch

    with torch.no_grad():
        expected = outcome(upstream_call, seed)
    got = outcome(our_call, seed)
    if isinstance(expected, Exception):
        kind = RuntimeError if isinstance(expected, RuntimeError) else type(expected)
        assert isinstance(got, kind) and isinstance(got, ValueError), (label, expected, got)
        assert "as upstream does" in str(got), (label, got)
    else:
        assert not isinstance(got, Exception), (label, got)
        assert 0 not in got.shape, (label, got.shape)
        assert_close(got, expected, atol=atol, label=label)
    return expected


def assert_codes_as_upstream(upstream: Any, ours: Any, z: Any, x: Any, label: str, *decode_args: Any) -> None:
    """A decode of ``z`` (with upstream's further arguments) and an encode of ``x``, each as upstream's.

    Where upstream decodes, the frame count is the family's rule too
    (`Family.frames_of`: what the commands and the planner count by). Both
    sides start from the same generator state (a decoder injecting noise).
    """
    decoded = assert_as_upstream(lambda: upstream.decode(z, *decode_args), lambda: ours.decode(z, *decode_args),
                                 f"{label} decode")
    if not isinstance(decoded, Exception):
        assert decoded.shape[2] == ours.family.frames_of(ours.config, z.shape[2]), (label, decoded.shape)
    assert_as_upstream(lambda: upstream.encode(x), lambda: ours.encode(x), f"{label} encode")
