"""The package's public names (`cogvideox_torchax.__all__`, resolved lazily by `__init__.py`)."""

import cogvideox_torchax as ct


def test_every_public_name_resolves():
    # The exports are resolved lazily (PEP 562): a name pointing at the wrong module fails only on use.
    for name in ct.__all__:
        assert getattr(ct, name) is not None, name
    assert ct.ModelLoadError.__module__ == "cogvideox_torchax.io.model_files"
