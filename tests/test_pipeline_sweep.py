"""Every diffusers pipeline built on a supported family's VAE takes the wrapped VAE, found from diffusers itself.

A pipeline class counts when its ``__init__`` annotates ``vae`` with a
family's upstream class (alone or in a union), a modular pipeline when its
blocks expect a ``vae`` component of one: a pipeline a later diffusers adds
is swept with no change here. Each is built with its other components None
(a stand-in for Cosmos' guardrail model, which needs a package not
installed) around upstream's VAE and around the wrapped one, through its
constructor, ``from_pretrained(folder, vae=wrapped)`` and assignment; what
it reads of its VAE while being built (scale factors, its video processor's
config) must come out as with upstream's. A pipeline that cannot be built
this way even around upstream's VAE must fail the same way around ours.
Whole tiny runs against upstream's: tests/families/<name>/test_pipelines.py.
"""

import inspect
import typing

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.vae.attributes import is_plain

pytest.importorskip("transformers", reason="diffusers' pipeline modules need transformers")

from tests.support.pipelines import StandInSafetyChecker  # noqa: E402

# Named here only to show the sweep finds them (diffusers 0.42's pipelines that read the VAE's
# plain attributes while being built, and the first of each family); the sweep itself names none.
KNOWN = {
    "CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "WanPipeline", "WanVACEPipeline",
    "WanVideoToVideoPipeline", "SkyReelsV2Pipeline", "SkyReelsV2DiffusionForcingPipeline",
    "Cosmos2VideoToWorldPipeline", "HeliosPipeline", "SanaVideoPipeline", "ChronoEditPipeline",
}
KNOWN_MODULAR = {"WanBlocks", "WanImage2VideoAutoBlocks", "Wan22VaceBlocks", "HeliosAutoBlocks"}


def _tiny_preset(family: families.Family) -> str:
    return next(name for name in family.presets if "tiny" in name)


@pytest.fixture(scope="module")
def vaes(tiny_upstream, tiny_vae):
    """Each family's upstream class -> (its tiny upstream module, that module wrapped), wrapped once."""
    found = {}
    for family in families.FAMILIES.values():
        upstream = tiny_upstream if family.name == "cogvideox" else ct.random_upstream(_tiny_preset(family), seed=0)
        wrapped = tiny_vae if family.name == "cogvideox" else ct.wrap(upstream, mesh="dp=1,tp=1")
        found[family.upstream] = (upstream, wrapped)
    return found


def _vae_classes(init) -> tuple:
    try:
        hint = typing.get_type_hints(init).get("vae")
    except Exception:  # an annotation that does not resolve here: read it as written
        parameter = inspect.signature(init).parameters.get("vae")
        hint = None if parameter is None else parameter.annotation
    return typing.get_args(hint) or (hint,)


@pytest.fixture(scope="module")
def pipelines(vaes) -> dict[str, tuple[type, list[type]]]:
    """diffusers' pipeline classes whose ``vae`` is a supported family's: name -> (class, those upstream classes)."""
    import diffusers
    from diffusers import DiffusionPipeline

    found = {}
    for name in sorted(set(dir(diffusers)) | set(dir(diffusers.pipelines))):
        if "Pipeline" not in name:
            continue
        try:
            cls = getattr(diffusers, name, None) or getattr(diffusers.pipelines, name)
        except Exception:  # a pipeline whose optional backend is missing here: nobody can build it
            continue
        if inspect.isclass(cls) and issubclass(cls, DiffusionPipeline):
            ours = [c for c in _vae_classes(cls.__init__) if c in vaes]
            if ours:  # a union may name several families (Sana-Video: Wan's and LTX-2's)
                found[name] = (cls, ours)
    return found


def _each(pipelines: dict):
    # (name, upstream VAE class, pipeline class) for each family a pipeline takes.
    for name, (cls, upstream_classes) in pipelines.items():
        for upstream_class in upstream_classes:
            yield f"{name} ({upstream_class.__name__})", upstream_class, cls


def _other_components(cls: type) -> dict:
    parameters = inspect.signature(cls.__init__).parameters
    kwargs = {
        name: None
        for name, p in parameters.items()
        if name not in ("self", "vae") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    if "safety_checker" in kwargs:  # Cosmos' pipelines build the guardrail model when given None
        kwargs["safety_checker"] = StandInSafetyChecker()
    return kwargs


def _built(cls: type, vae, kwargs: dict):
    """The pipeline, or the error building it: (type name, message)."""
    try:
        return cls(vae=vae, **kwargs)
    except Exception as e:
        return (type(e).__name__, str(e))


def _what_it_read(pipe) -> dict:
    """The pipeline's own plain attributes (its VAE scale factors...) and its processors' configs."""
    read = {}
    for name, value in vars(pipe).items():
        if name.startswith("_"):
            continue
        if is_plain(value):
            read[name] = value
        elif hasattr(value, "config") and not hasattr(value, "forward"):  # a video or image processor
            read[name] = dict(value.config)
    return read


def _differences(read: dict, expected: dict) -> str:
    differ = sorted(k for k in read.keys() | expected.keys() if read.get(k) != expected.get(k))
    return ", ".join(f"{k} {read.get(k)!r} (upstream's {expected.get(k)!r})" for k in differ)


def test_the_sweep_finds_every_familys_pipelines(pipelines):
    assert KNOWN <= set(pipelines), sorted(KNOWN - set(pipelines))
    assert {upstream.__name__ for _, upstreams in pipelines.values() for upstream in upstreams} == {
        f.upstream.__name__ for f in families.FAMILIES.values()
    }


def test_each_pipeline_is_built_around_the_wrapped_vae_and_takes_it_by_assignment(pipelines, vaes):
    failures, built = [], 0
    for name, upstream_class, cls in _each(pipelines):
        upstream, wrapped = vaes[upstream_class]
        kwargs = _other_components(cls)
        theirs = _built(cls, upstream, kwargs)
        ours = _built(cls, wrapped, kwargs)
        if isinstance(theirs, tuple):  # not buildable with its other parts None: ours fails alike
            if ours != theirs:
                failures.append(f"{name}: upstream's VAE fails with {theirs}, ours with {ours}")
            continue
        if isinstance(ours, tuple):
            failures.append(f"{name}: constructor: {ours[0]}: {ours[1][:300]}")
            continue
        built += 1
        if ours.vae is not wrapped or ours.config["vae"] != ("diffusers", upstream_class.__name__):
            failures.append(f"{name}: constructor: vae {type(ours.vae).__name__}, config {ours.config['vae']}")
        if _what_it_read(ours) != _what_it_read(theirs):
            failures.append(f"{name}: constructor: {_differences(_what_it_read(ours), _what_it_read(theirs))}")
        # diffusers' own tests rebuild a pipeline from its components (as upstream's rebuilds).
        again, theirs_again = cls(**ours.components), cls(**theirs.components)
        if again.vae is not wrapped or _what_it_read(again) != _what_it_read(theirs_again):
            failures.append(f"{name}: rebuilt: {_differences(_what_it_read(again), _what_it_read(theirs_again))}")
        # By assignment (the README's way), onto a pipeline built around upstream's VAE.
        theirs.vae = wrapped
        if theirs.vae is not wrapped or theirs.config["vae"] != ("diffusers", upstream_class.__name__):
            failures.append(f"{name}: assignment: vae {type(theirs.vae).__name__}, config {theirs.config['vae']}")
    assert not failures, "\n".join(failures)
    assert built >= len(KNOWN)


def test_each_pipeline_loads_with_the_wrapped_vae_passed_to_from_pretrained(pipelines, vaes, tmp_path):
    failures, loaded = [], 0
    for name, upstream_class, cls in _each(pipelines):
        upstream, wrapped = vaes[upstream_class]
        kwargs = _other_components(cls)
        theirs = _built(cls, upstream, kwargs)
        if isinstance(theirs, tuple):
            continue  # the test above shows ours fails alike
        folder = tmp_path / f"{name}-{upstream_class.__name__}"
        theirs.save_config(folder)  # model_index.json: the VAE passed is not read from the folder
        try:
            ours = cls.from_pretrained(folder, vae=wrapped, **kwargs)
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        loaded += 1
        if ours.vae is not wrapped or _what_it_read(ours) != _what_it_read(theirs):
            failures.append(f"{name}: from_pretrained: {_differences(_what_it_read(ours), _what_it_read(theirs))}")
    assert not failures, "\n".join(failures)
    assert loaded >= len(KNOWN)


def _modular_blocks(vaes) -> dict[str, object]:
    from diffusers import modular_pipelines

    found = {}
    for name in dir(modular_pipelines):
        cls = getattr(modular_pipelines, name)
        if not (inspect.isclass(cls) and issubclass(cls, modular_pipelines.ModularPipelineBlocks)):
            continue
        try:
            blocks = cls()
            specs = blocks.expected_components
        except Exception:  # a base class, or blocks that need arguments
            continue
        if any(spec.name == "vae" and spec.type_hint in vaes for spec in specs):
            found[name] = blocks
    return found


def _properties(pipe) -> dict:
    # Every property of the pipeline's class, as it reads with this VAE (errors by type).
    read = {}
    for name, _ in inspect.getmembers(type(pipe), lambda m: isinstance(m, property)):
        try:
            value = getattr(pipe, name)
        except Exception as e:
            read[name] = type(e).__name__
        else:
            read[name] = value if is_plain(value) else type(value).__name__
    return read


def test_each_modular_pipeline_takes_the_wrapped_vae(vaes):
    # Modular pipelines take components by update_components (they have no vae argument).
    blocks = _modular_blocks(vaes)
    assert KNOWN_MODULAR <= set(blocks), sorted(KNOWN_MODULAR - set(blocks))
    failures = []
    for name, block in blocks.items():
        upstream_class = next(s.type_hint for s in block.expected_components if s.name == "vae")
        upstream, wrapped = vaes[upstream_class]
        theirs, ours = block.init_pipeline(), block.init_pipeline()
        theirs.update_components(vae=upstream)
        ours.update_components(vae=wrapped)
        if ours.vae is not wrapped:
            failures.append(f"{name}: vae is {type(ours.vae).__name__}")
        read, expected = _properties(ours), _properties(theirs)
        for prop in sorted(read.keys() | expected.keys()):
            if read.get(prop) != expected.get(prop):
                failures.append(f"{name}: {prop} {read.get(prop)!r} (upstream's {expected.get(prop)!r})")
    assert not failures, "\n".join(failures)
    # Wan's scale factors read the VAE's temperal_downsample (refused before it read through).
    wan = blocks["WanBlocks"].init_pipeline()
    wan.update_components(vae=vaes[families.get("wan").upstream][1])
    assert (wan.vae_scale_factor_temporal, wan.vae_scale_factor_spatial) == (4, 8)
