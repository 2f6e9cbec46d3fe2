"""torch stays whole beside a wrapped VAE: compile, compiled flex attention and export after a decode.

torchax 0.0.13 registers "jax" as torch's accelerator when it is imported,
after which every ``torch.compile`` in the process fails ("PyTorch is not
linked with support for jax devices"). `cogvideox_torchax._torchax_device`
imports it without that registration; these tests run in the suite's own
process, after a real decode, as a user's script would.
"""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from cogvideox_torchax import _torchax_device
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents


@pytest.fixture(scope="module")
def decoded(tiny_vae):
    """A decode through the wrapped tiny VAE, so torchax is imported and has traced and run."""
    return tiny_vae.decode(seeded_latents((1, 4, 2, 4, 4), seed=3)).sample


def test_torchs_accelerator_is_what_it_was_before_wrapping(decoded):
    assert decoded.shape == (1, 3, 8, 32, 32)
    assert _torchax_device.backend_name() == "privateuseone"  # never renamed to "jax"
    # What torch reports in a process that never imported torchax: None for a CPU
    # build, cuda for a CUDA build even on a machine without a GPU.
    untouched = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.accelerator.current_accelerator())"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout.strip()
    assert str(torch.accelerator.current_accelerator()) == untouched


def test_torch_compile_works_after_a_decode(decoded):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(lambda t: F.gelu(t) * 3 + t.sin())
    # Inductor's CPU kernels vectorise gelu's erf differently from eager: a few ulps.
    assert_close(compiled(x), F.gelu(x) * 3 + x.sin(), atol=1e-6, label="torch.compile after a decode")


def test_compiled_flex_attention_works_after_a_decode(decoded):
    from torch.nn.attention.flex_attention import flex_attention

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
    got = torch.compile(flex_attention)(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    # Two softmax implementations in fp32: ~1e-7 apart.
    assert_close(got, expected, atol=1e-5, label="compiled flex_attention after a decode")


def test_torch_export_works_after_a_decode(decoded):
    module = torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3, padding=1), torch.nn.SiLU()).eval()
    x = torch.randn(1, 2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    exported = torch.export.export(module, (x,))
    with torch.no_grad():
        assert_close(exported.module()(x), module(x), atol=0, label="torch.export after a decode")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_eager_cuda_works_after_a_decode(decoded):
    x = torch.randn(4, 4, device="cuda")
    assert torch.accelerator.current_accelerator().type == "cuda"
    assert_close((x @ x).cpu(), x.cpu() @ x.cpu(), atol=1e-4, label="eager CUDA after a decode")


def test_torchax_imported_first_is_named_in_a_warning():
    # A rename cannot be undone: the package says so once, naming the fix.
    # (torch 2.13 and 2.14 need the placeholders before torchax imports at all.)
    code = (
        "import warnings\n"
        "from cogvideox_torchax import _torch_compat\n"
        "_torch_compat.install_placeholders()\n"
        "import torchax\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    _torch_compat.import_torchax(); _torch_compat.import_torchax()\n"
        "print(sum('import cogvideox_torchax before torchax' in str(w.message) for w in caught))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "1"
