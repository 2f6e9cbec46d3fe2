"""`kernels.host_conv`: torch's own convolution inside a program, wherever a program may hold it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax._torch_compat import import_torchax
from cogvideox_torchax.kernels.conv import conv, conv_reference
from cogvideox_torchax.kernels.host_conv import host_conv
from cogvideox_torchax.platforms import hlo
from tests.support.parity import assert_close

CASES = [
    ((2, 6, 9), (4, 6, 3), dict(stride=(2,), padding=(1,), dilation=(1,))),
    ((2, 6, 9, 11), (5, 6, 3, 3), dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))),
    ((1, 4, 5, 7, 6), (8, 4, 3, 3, 3), dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1))),
    ((1, 4, 5, 7, 6), (4, 2, 3, 1, 3), dict(stride=(2, 1, 2), padding=(1, 0, 2), dilation=(1, 1, 2), groups=2)),
]


def _operands(shape, wshape, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in (shape, wshape, wshape[:1]))


def _torch(x, w, b, kw):
    fn = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[x.ndim]
    return fn(torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b), **kw).numpy()


@pytest.mark.parametrize("shape,wshape,kw", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_equals_torch_and_the_reference_inside_a_program(shape, wshape, kw, with_bias):
    x, w, b = _operands(shape, wshape)
    b = b if with_bias else None
    got = jax.jit(lambda x, w, b: host_conv(x, w, b, **kw))(x, w, b)
    # torch's own kernel on the same operands: the same arithmetic, bit for bit.
    assert_close(np.asarray(got), _torch(x, w, b, kw), atol=0.0, label=f"host_conv {shape}")
    ref = conv_reference(jnp.asarray(x), jnp.asarray(w), None if b is None else jnp.asarray(b), **kw)
    # Outputs reach ~30; fp32 summation order alone moves them ~1e-6 relative.
    assert_close(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=1e-5, label=f"host_conv vs reference {shape}")


def test_conv_with_the_host_policy_splits_as_the_whole():
    shape, wshape, kw = CASES[2]
    x, w, b = _operands(shape, wshape)
    whole = np.asarray(conv(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), host=True, **kw))
    split = jax.jit(lambda x, w, b: conv(x, w, b, host=True, max_elements=400, **kw))
    text = split.lower(x, w, b).compile().as_text()
    convs, _ = hlo.compiled_ops(text)
    assert len(convs) > 1 and {c.op for c in convs} == {"host-conv"}  # each piece a host call, no XLA convolution
    assert_close(np.asarray(split(x, w, b)), whole, atol=0.0, label="host conv in pieces")
    assert_close(whole, _torch(x, w, b, kw), atol=0.0, label="conv(host=True)")


def test_in_a_loop_under_vmap_and_inside_a_torchax_environment():
    shape, wshape, kw = CASES[2]
    x, w, b = _operands(shape, wshape)
    expected = _torch(x, w, b, kw)
    one = lambda x: host_conv(x, w, b, **kw)  # noqa: E731

    def scanned(xs):  # a frame loop's body: one call per step
        return jax.lax.scan(lambda c, x: (c, one(x)), 0, xs)[1]

    xs = np.stack([x, 2 * x])
    assert_close(np.asarray(jax.jit(scanned)(xs))[1], _torch(2 * x, w, b, kw), atol=0.0, label="in a scan")
    assert_close(np.asarray(jax.jit(jax.vmap(one))(xs))[0], expected, atol=0.0, label="under vmap")
    # Run while the caller's torchax environment is on: the callback's torch ops stay torch's.
    with import_torchax().default_env():
        got = np.asarray(jax.jit(one)(x))
    assert_close(got, expected, atol=0.0, label="inside a torchax environment")


@pytest.mark.parametrize(
    "shape,wshape,groups,match",
    [
        ((4, 6), (4, 6), 1, "3-D to 5-D"),
        ((1, 4, 5, 5), (8, 3, 3, 3), 1, "does not fit"),
        ((1, 4, 5, 5), (8, 4, 3, 3, 3), 1, "does not fit"),
    ],
)
def test_operands_that_do_not_fit_are_refused(shape, wshape, groups, match):
    with pytest.raises(ValueError, match=match):
        host_conv(jnp.zeros(shape), jnp.zeros(wshape), None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                  groups=groups)
    with pytest.raises(ValueError, match="bias"):
        host_conv(jnp.zeros((1, 4, 5, 5)), jnp.zeros((8, 4, 3, 3)), jnp.zeros(4), stride=(1, 1), padding=(0, 0),
                  dilation=(1, 1))


@pytest.mark.parametrize("error", [MemoryError("no room"), RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_torch_out_of_memory_is_told_as_out_of_memory(monkeypatch, error):
    from cogvideox_torchax.kernels import host_conv as module
    from cogvideox_torchax.memory import retry

    def failing(*args):
        raise error

    monkeypatch.setitem(module._TORCH_CONV, 4, failing)
    x, w, b = _operands((1, 4, 5, 5), (8, 4, 3, 3))
    with pytest.raises(Exception) as raised:
        jax.jit(lambda x: host_conv(x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1)))(x).block_until_ready()
    assert retry.is_out_of_memory(raised.value) and "host's convolution of (1, 4, 5, 5)" in str(raised.value)
    # Any other error of torch's stays what it was.
    monkeypatch.setitem(module._TORCH_CONV, 4, lambda *args: (_ for _ in ()).throw(RuntimeError("bad weights")))
    with pytest.raises(Exception, match="bad weights") as raised:
        jax.jit(lambda x: host_conv(x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1)))(x).block_until_ready()
    assert not retry.is_out_of_memory(raised.value)
