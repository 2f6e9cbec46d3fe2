"""The commands' stages, each a progress bar on stderr and a time in the summary; the first of them, loading.

Loading is the model the options name (a ``random:`` preset, a folder or a
hub id), on its mesh, with the JAX compile cache on or off as asked. The
compile and plan stages are the plans' (`plans.compiling`, `plans.plan_stage`).
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm import tqdm

from cogvideox_torchax.cli import agreement, errors, interrupts, options, timeline
from cogvideox_torchax.memory import in_use


class Stage:
    """One progress bar per stage on stderr (nothing when quiet); times the stage (and records it on the `timeline`)."""

    def __init__(self, name: str, total: int, unit: str, quiet: bool, record: bool = True):
        self.name, self._record = name, record
        self._bar = tqdm(total=total, desc=f"{name:<8}", unit=unit, disable=quiet, file=errors.STDERR, leave=True)
        self._t0 = time.perf_counter()
        self.seconds = 0.0

    def tick(self, n: int = 1) -> None:
        self._bar.update(n)

    def write(self, text: str) -> None:
        """One line on stderr above the bar (shown even when quiet: it reports a failure)."""
        self._bar.write(text, file=errors.STDERR)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        end = time.perf_counter()
        self.seconds = end - self._t0
        if self._record:
            timeline.record_stage(self.name, self._t0, end)
        self._bar.close()
        if exc_type is None:
            interrupts.check_interrupted()


def load_together(run: options.RunOptions):
    """The compile cache and the "load" stage on every process (`agreement.together`): ``(cache_dir, vae, stage)``.

    Under jax.distributed the processes then agree on the memory budget
    (a collective, so here rather than at the first plan inside a step).
    """
    with agreement.together("loading the model"):
        cache_dir = compile_cache_from(run)
        vae, stage = load_stage(run)
    if agreement.process_count() > 1:
        vae.memory_budget()
    return cache_dir, vae, stage


def load_stage(run: options.RunOptions):
    """The "load" stage: the model on its devices. Returns ``(vae, stage)``."""
    import jax  # about 1 s: only once the options are checked (bad ones are refused in milliseconds)

    with Stage("load", 1, "model", run.quiet) as stage:
        vae = load_model(run.model)
        for name, start, end in vae.programs.load_times:  # checks, weights, wrap
            timeline.record_part(name, start, end)
        with timeline.timed_part("weights"):
            jax.block_until_ready(vae.weights)
        stage.tick()
    if run.memory_report:
        in_use.report("load")
    return vae, stage


def compile_cache_from(run: options.RunOptions) -> Path | None:
    """Turns the persistent compile cache on (returns its folder) or off (None) as the options say.

    A ``--compile-cache`` folder that cannot be created or written is bad
    input; a default folder that cannot (e.g. a home that is not writable)
    is a warning, and the run goes on without the cache.
    """
    from cogvideox_torchax.vae import compile_cache  # imports JAX: not before the options are checked

    if not run.use_compile_cache:
        compile_cache.disable_compile_cache()
        return None
    try:
        return compile_cache.enable_compile_cache(run.compile_cache)
    except OSError as e:
        if run.compile_cache is not None:
            raise errors.UsageError(
                f"compile cache folder {e.strerror}; pass another --compile-cache or --no-compile-cache"
            ) from e
        errors.warn_once(f"cannot use the default compile cache {e.strerror}; running without it", run.quiet)
        compile_cache.disable_compile_cache()
        return None


def check_mesh(mesh: str) -> None:
    """Refuses a ``--mesh`` that is malformed or needs more devices than there are, before any weight is built.

    Imports JAX (to count the devices), not the model.

    Raises:
        errors.UsageError: naming the mesh and the devices there are.
    """
    from cogvideox_torchax.parallel.sharding import make_mesh  # imports JAX: not before the options are checked

    try:
        make_mesh(mesh)
    except ValueError as e:
        raise errors.UsageError(f"--mesh: {e}") from e


def load_model(model: options.ModelOptions):
    """The `TorchaxVAE` the model options name."""
    import cogvideox_torchax as ct  # imports torch, JAX and diffusers: not before the options are checked

    # With --target, --mesh is the target's; the weights stay on one local device.
    mesh = "dp=1,tp=1" if model.target is not None else model.mesh
    if mesh is not None:
        check_mesh(mesh)
    if model.model.startswith(options.RANDOM_PREFIX):
        try:
            module = ct.random_upstream(model.model[len(options.RANDOM_PREFIX) :], seed=model.seed)
        except ValueError as e:
            raise errors.UsageError(str(e)) from e
        vae = ct.wrap(module, dtype=model.dtype, mesh=mesh, max_memory=model.max_memory)
    else:
        subfolder = model.subfolder
        path = Path(model.model)
        # A hub id, or a whole pipeline's folder (model_index.json, vae/...): its VAE.
        if subfolder is None and (not path.exists() or (not (path / "config.json").exists()
                                                         and (path / "vae" / "config.json").is_file())):
            subfolder = "vae"
        vae = ct.from_pretrained(model.model, subfolder=subfolder, dtype=model.dtype, mesh=mesh,
                                 max_memory=model.max_memory)
    if model.untiled:
        settings = vae.family.untiled_settings
        if settings is None:
            raise errors.UsageError(f"--untiled: {vae.family.title}'s decode and encode have no frame windows to "
                                    "turn off (they are already whole, or walk frames with exact caches)")
        for name, value in settings.items():
            setattr(vae, name, value)
    return vae
