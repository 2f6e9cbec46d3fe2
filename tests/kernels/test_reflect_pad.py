"""`kernels.reflect_pad`: a zero pad with its borders copied in equals torch's and jnp's reflection padding."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cogvideox_torchax.kernels.reflect_pad import reflect_pad, reflect_pad_reference


# One axis, two axes (LTX-2's height and width), three with pads up to size - 1 (the corners
# reflect in every axis), and a pad of 0 between padded axes.
@pytest.mark.parametrize("pads", [(0, 0, 2), (0, 1, 1), (1, 2, 3), (3, 0, 5)])
def test_equals_torch_and_jnp_reflection(pads):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    got = np.asarray(reflect_pad(jnp.asarray(x), pads))
    torch_pads = [p for p in reversed(pads) for _ in range(2)]
    expected = torch.nn.functional.pad(torch.from_numpy(x), torch_pads, mode="reflect").numpy()
    # Copies only: exactly equal.
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, np.asarray(reflect_pad_reference(jnp.asarray(x), pads)))


def test_a_pad_of_the_axis_size_has_no_reflection():
    with pytest.raises(ValueError, match="needs 0 <= pad < size, got pad 5 for size 5"):
        reflect_pad(jnp.zeros((1, 1, 5, 6)), (5, 1))
