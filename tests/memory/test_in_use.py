"""Bytes in use (`memory.in_use`): live device memory, no growth over repeated decodes, `--memory-report`."""

import jax
import pytest
import torch

from cogvideox_torchax.decode import main
from cogvideox_torchax.memory import in_use


def test_five_decodes_leave_live_memory_where_the_first_did(tiny_vae):
    z = torch.randn((1, 4, 5, 3, 4), generator=torch.Generator().manual_seed(0))
    totals = []
    for _ in range(5):
        out = tiny_vae.decode_jax(z)
        jax.block_until_ready(out)
        del out
        totals.append(sum(in_use.live_device_bytes()[0].values()))
    print(f"[memory] live bytes after each of five decodes: {totals}")
    assert totals[0] > 0  # the weights are live
    assert totals[1:] == [totals[0]] * 4


def test_clear_compiled_drops_executables(tiny_vae):
    tiny_vae.compile_decode((1, 4, 2, 2, 2))
    assert tiny_vae.compiled_shapes()
    tiny_vae.clear_compiled()
    assert not tiny_vae.compiled_shapes()


def test_live_device_bytes_counts_a_new_array():
    before, source = in_use.live_device_bytes()
    x = jax.numpy.zeros((1024, 256), jax.numpy.float32)
    after, _ = in_use.live_device_bytes()
    assert source in ("memory_stats", "live_arrays")
    assert sum(after.values()) - sum(before.values()) >= x.nbytes
    del x


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cli_memory_report(tmp_path, capsys, monkeypatch, how):
    from safetensors.torch import save_file

    save_file({"z": torch.randn(1, 4, 2, 2, 2)}, tmp_path / "z.safetensors")
    argv = [str(tmp_path / "z.safetensors"), "--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    argv += ["-o", str(tmp_path / "v.npy"), "--quiet"]
    if how == "flag":
        argv.append("--memory-report")
    else:
        monkeypatch.setenv(in_use.ENV_VAR, "1")
    assert main(argv) == 0
    err = capsys.readouterr().err
    for stage in ("load", "compile", "decode", "write"):
        assert f"[memory] after {stage}: " in err, err
