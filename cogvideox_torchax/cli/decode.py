"""``python -m cogvideox_torchax.decode LATENTS``: decode latents to a video.

A thin command line over the library. Latents come from a safetensors file,
as the model family's pipelines return them (``output_type="latent"``:
CogVideoX ``(B, T, C, H, W)`` times the scaling factor, Wan ``(B, C, T, H, W)``
normalised per channel; LTX-2 and LTX-Video ``(B, C, T, H, W)`` normalised per
channel as their pipelines hold them before decoding, where their ``output_type="latent"``
returns them denormalised: ``--no-unscale``), and are brought to what
``vae.decode`` takes unless ``--no-unscale``; latents a file's metadata says are another
family's are refused. The video is
written as H.264 ``.mp4``, a folder of PNG frames (an output name without a
suffix), or raw float frames (``.npy`` / ``.safetensors``); one output per
video of the batch, all written under temporary names and moved in together
at the end. Bad input is one line on stderr, exit code 2, and no output
file; the exit codes are listed in ``--help``.

Many latents in one run: ``decode a.safetensors b.safetensors ... --output-dir
out/`` (folders and glob patterns too) loads the model once, compiles once
per latent shape, decodes equal shapes ``--batch-size`` at a time, and
writes ``out/a.mp4``, ... (each atomically) as they complete; a bad input is
reported and skipped, and ``--skip-existing`` resumes an interrupted run.
Under jax.distributed (``--coordinator``/``--distributed``) every process
runs the same command; process 0 reads, writes and reports.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from cogvideox_torchax import families
from cogvideox_torchax.cli import agreement, command, errors, interrupts, jobs, options, out_of_memory, plans, stages
from cogvideox_torchax.cli import summary as report
from cogvideox_torchax.cli.decode_config import DecodeConfig
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.options import add_model_arguments
from cogvideox_torchax.cli.stages import Stage
from cogvideox_torchax.io import family_latents, outputs
from cogvideox_torchax.io.writer import Writer, stream
from cogvideox_torchax.memory import in_use
from cogvideox_torchax.parallel import distributed


def _family_fps() -> str:
    return ", ".join(f"{family.title} {family.fps:g}" for family in families.FAMILIES.values())


def _parser() -> argparse.ArgumentParser:
    p = options.Parser.for_command("decode", __doc__)
    p.add_argument(
        "latents",
        nargs="+",
        help="safetensors file holding the latents; with --output-dir, any number of files, folders "
        "(their *.safetensors) and glob patterns",
    )
    p.add_argument("--key", help="tensor to decode when the file holds several")
    p.add_argument(
        "--layout",
        default="auto",
        choices=("auto", "BCTHW", "BTCHW"),
        help="latent layout; auto detects it from the model's latent channel count (each family as its pipelines "
        f"hold latents: {options.by_family(lambda f: f.pipeline_layout)})",
    )
    p.add_argument(
        "--no-unscale",
        dest="unscale",
        action="store_false",
        help="latents are already as vae.decode takes them (default: undo the scaling of the model's pipelines, as "
        f"each family's hold latents: {options.by_family(lambda f: f.normalization, '; ')})",
    )
    add_model_arguments(p)
    out = p.add_mutually_exclusive_group()  # one is needed unless --dry-run (DecodeConfig.from_args)
    out.add_argument(
        "--output",
        "-o",
        help="out.mp4, out.npy, out.safetensors, or a folder name for PNG frames; batch > 1 writes out_0.mp4, ...",
    )
    out.add_argument(
        "--output-dir",
        metavar="DIR",
        help="decode every input into DIR, one output per video named after its file (a.safetensors -> a.mp4; "
        "a file of B > 1 videos -> a_0.mp4, ...); DIR is made if missing",
    )
    p.add_argument(
        "--format",
        default=None,
        choices=("mp4", "png", "npy", "safetensors"),
        help="with --output-dir: what to write (default mp4; png writes a folder of frames per video)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="with --output-dir: videos of one latent shape decoded together, at least 1 (default: the mesh's dp)",
    )
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="with --output-dir: leave outputs that exist alone and decode the rest (resumes a run)",
    )
    p.add_argument("--fps", type=float, default=None,
                   help=f"mp4 frame rate, 0.01 to 1000 (default the model's: {_family_fps()})")
    p.add_argument("--crf", type=int, default=18, help="H.264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument(
        "--encoder",
        default="libx264",
        help="mp4 encoder: libx264 (the CPU, default) or h264_nvenc (an NVIDIA GPU's NVENC, which H100 and H200 "
        "lack; refused where it cannot start)",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="the encoder's speed preset: libx264 ultrafast ... veryslow (its default: medium), NVENC p1 ... p7",
    )
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="decode the whole video, then write it (default for mp4 and PNG: write each batch of frames while "
        "the next decodes)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing outputs: files, or folders holding only frame_*.png (never anything else)",
    )
    return options.with_shared_arguments(p)


def run(config: DecodeConfig) -> dict[str, Any]:
    """Decodes as the configuration says and returns the summary: one way for one file and for many.

    The inputs found (`jobs.find`: one file read before the model loads),
    one file's outputs staged, the model loaded, the inputs read into jobs
    (`jobs.scan`); then batch by batch: its latents read, its shape's way
    chosen (`plans.choose`: streamed or whole), decoded, written and moved
    in (`io.writer.Writer`); the summary last. A decoder that draws noise
    (LTX-Video 0.9.1's) draws it from a generator seeded 0 for each decode:
    the same latents, the same video.
    """
    from cogvideox_torchax.vae import drawn_noise  # imports torch and JAX: not before the options are checked

    with drawn_noise.seeded_calls(0):
        many = config.output_dir is not None
        found = None
        with agreement.together("finding the inputs" if many else "reading the latents"):
            if agreement.is_primary():
                found = jobs.find(config)
        shared = distributed.share_json(None if found is None else
                                        {"sources": found.sources, "videos": None if many else len(found.z)})
        kind = config.format if many else (outputs.output_kind(config.output) if config.output else None)
        names = [] if many or config.output is None else outputs.output_paths(Path(config.output), shared["videos"])
        # One file's outputs are checked, and their temporary entries made (the writability probe), before
        # anything expensive; on process 0 only.
        early = None
        with agreement.together("checking the outputs"):
            if agreement.is_primary() and config.run.dry_run:
                outputs.check_outputs(names, overwrite=config.overwrite)
            elif agreement.is_primary() and not many:
                early = _writer(config, names, kind)
        with early if early is not None else contextlib.nullcontext():
            cache_dir, vae, load = stages.load_together(config.run)
            work: dict[str, Any] = {}
            with agreement.together("reading the inputs"):
                if agreement.is_primary():
                    with _bar(many, "read", len(shared["sources"]), "file", config.run.quiet) as bar:
                        work = jobs.scan(config, vae, found, bar)
            work = distributed.share_json(work)
            decoding = _Decoding(config, vae, kind, found, early, many)
            if config.run.dry_run:
                return decoding.dry_run(work, load, names)
            return decoding.run(work, load, cache_dir, len(shared["sources"]), names)


def _writer(config: DecodeConfig, paths: list, kind: str) -> Writer:
    return Writer(paths, kind, overwrite=config.overwrite, atomic=interrupts.deferred, committed=interrupts.WRITTEN)


class _NoBar:
    """A many-latents run's bars in a one-file run: none (failures there end the run, said by the command)."""

    seconds = 0.0

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def tick(self, n: int = 1) -> None:
        pass

    def write(self, text: str) -> None:
        errors.say(text)


def _bar(shown: bool, name: str, total: int, unit: str, quiet: bool):
    return Stage(name, total, unit, quiet) if shown else _NoBar()


class _Decoding:
    """One decode run's loop over its batches, and what it gathered for the summary."""

    def __init__(self, config: DecodeConfig, vae, kind: str | None, found, early: Writer | None, many: bool):
        self.config, self.vae, self.kind, self.found, self.early, self.many = config, vae, kind, found, early, many
        self.raw = kind in ("npy", "safetensors")
        self.options = config.video_options(vae)
        self.written: list[str] = []
        self.failed: list[dict[str, Any]] = []
        self.compile_s = 0.0
        self.cache_status = "on"  # several shapes compile: the cache is on, each one's hit or miss not told
        self.times: dict[str, Any] = {}  # one file: its decode and write seconds, streamed or not
        self.chosen: dict[tuple[int, ...], plans.ShapePlan] = {}

    def shapes(self, items: list[jobs.Job]) -> dict[tuple[int, ...], tuple[int, ...]]:
        dp = self.vae.mesh.shape["dp"]
        return jobs.batch_shapes(items, self.config.batch_size or dp, dp, padded=self.many)

    # -- the run ------------------------------------------------------------

    def run(self, work: dict[str, Any], load, cache_dir, inputs: int, names: list) -> dict[str, Any]:
        config, vae = self.config, self.vae
        items = [jobs.Job.from_dict(d) for d in work["jobs"]]
        self.failed = list(work["failed"])
        shapes = self.shapes(items)
        size = config.batch_size or vae.mesh.shape["dp"]
        started = time.perf_counter()
        with _bar(self.many, "decode", len(items), "video", config.run.quiet) as bar:
            for batch in jobs.batches(items, size) if self.many else [items]:
                shape = shapes[batch[0].shape]
                z, unread = None, {}
                with agreement.together(f"reading latents for shape {shape}"):
                    if agreement.is_primary():
                        z, unread = jobs.read(config, vae, batch, shape, self.found)
                z = distributed.share_array(z)
                try:
                    self._decode_batch(batch, z, unread, bar)
                except Exception as e:  # a many-latents run fails the batch's videos and goes on
                    if not self.many or (isinstance(e, errors.PeerFailed) and e.code in errors.SIGNALLED):
                        raise
                    if config.run.debug and not isinstance(e, errors.PeerFailed) and agreement.process_count() == 1:
                        raise
                    self.failed += jobs.failures(batch, errors.one_line(e), bar)
                    bar.tick(len(batch))
        if config.run.memory_report and self.many:
            in_use.report("decode")
        fields = {**report.run_fields(vae, load), **report.compile_fields(self.compile_s, cache_dir, self.cache_status)}
        if not self.many:
            return {**self._one_file(items[0], work, names), **fields, **self.times,
                    "end_to_end_s": self.times.get("end_to_end_s", round(time.perf_counter() - started, 3))}
        plans_by = {str(list(s)): self._plan_of(s) for s in sorted(set(shapes.values()))}
        return {
            "many": True,
            "exit_code": distributed.share_json(errors.EXIT_SOME_FAILED if self.failed else errors.EXIT_OK),
            "output_dir": str(config.output_dir),
            "format": config.format,
            "inputs": inputs,
            "videos": len(items),
            "written": self.written,
            "skipped": work["skipped"],
            "failed": self.failed,
            "shapes": [list(s) for s in sorted(set(shapes.values()))],
            "batch_size": size,
            **fields,
            "memory_plans": {k: p.as_dict() for k, p in plans_by.items() if p is not None},
            # Each shape's reason, where its videos were decoded whole and then written.
            "stream_why_not": {str(list(s)): p.why_not for s, p in self.chosen.items() if p.why_not is not None},
            "decode_s": round(bar.seconds, 3),
            "videos_per_s": round(len(self.written) / bar.seconds, 3) if bar.seconds > 0 else None,
        }

    def _plan_of(self, shape: tuple[int, ...]):
        chosen = self.chosen.get(shape)
        if chosen is not None:
            return chosen.memory_plan(self.vae)
        return self.vae.planned(shape, kind="decode" if self.raw else "frames")

    def _one_file(self, job: jobs.Job, work: dict[str, Any], names: list) -> dict[str, Any]:
        chosen = self.chosen[job.shape]
        return {
            "outputs": [str(p) for p in names],
            "kind": self.kind,
            "latents_shape": list(job.shape),
            "layout": work["layout"],
            "unscaled": bool(self.config.unscale),
            "unscaled_as": self.vae.family.pipeline_word(),
            "video_shape": [job.shape[0], 3, family_latents.frames_of(self.vae, job.shape[2]),
                            *family_latents.frame_size(self.vae, job.shape)],
            "memory_plan": chosen.memory_plan(self.vae).as_dict(),
            "streamed": chosen.streamed is not None,
            "stream_why_not": chosen.why_not,
        }

    def _choose(self, shape: tuple[int, ...]) -> plans.ShapePlan:
        """The shape's way, decided at its first batch (a one-file run's stream compiles as its compile stage)."""
        if shape not in self.chosen:
            def compile_with(fn):
                return self._compile(fn, shape)

            self.chosen[shape] = plans.choose(self.vae, shape, self.kind, self.config.stream,
                                              compile_with=compile_with)
        return self.chosen[shape]

    def _compile(self, compile_for, shape: tuple[int, ...]) -> None:
        stage, events = stages.compile_stage(compile_for, shape, self.config.run, shown=not self.many)
        self.compile_s += stage.seconds
        if not self.many:
            self.cache_status = events.status

    def _decode_batch(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], bar) -> None:
        plan = self._choose(tuple(z.shape))
        if plan.streamed is not None:
            with plans.streaming(self.vae, plan, bar.write):
                return self._streamed(batch, z, unread, bar)
        self._whole(batch, z, unread, plan, bar)

    def _rows(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], stack: contextlib.ExitStack):
        """Each row of ``z``: (its writer, its output) or None (padding, or a video failed already: ``problems``)."""
        if not self.many:
            return [(self.early, j) for j in range(z.shape[0])] if self.early is not None else [], {}
        rows, problems = [], {}
        for i, job in enumerate(batch):
            if job.source in unread:
                problems[i] = unread[job.source]
                rows.append(None)
                continue
            try:
                Path(job.outputs[0]).parent.mkdir(parents=False, exist_ok=True)
                rows.append((stack.enter_context(_writer(self.config, list(job.outputs), self.kind)), 0))
            except Exception as e:  # this video fails; the batch goes on
                problems[i] = errors.one_line(e)
                rows.append(None)
        return rows + [None] * (z.shape[0] - len(rows)), problems

    def _streamed(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], bar) -> None:
        """Decodes latent frame batch by batch, each batch's frames written (on a thread) while the next decodes."""
        config, vae = self.config, self.vae
        videos, frames = z.shape[0], family_latents.frames_of(vae, z.shape[2])
        largest = float(np.abs(z).max())
        nonfinite: set[int] = set()

        def check(chunk) -> None:  # one file: its outputs are one, and NaN in any ends the run
            if not self.many and not chunk.finite.all():
                raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", largest))

        def failed_video(i: int, error: Exception | None) -> None:
            if error is None:
                nonfinite.add(i)
            else:
                problems[i] = errors.one_line(error)

        with contextlib.ExitStack() as stack:
            rows, problems = self._rows(batch, z, unread, stack)
            total = videos * frames
            with _bar(not self.many, "decode", total, "frame", config.run.quiet) as decode, \
                    _bar(not self.many, "write", total, "frame", config.run.quiet) as write:
                times = stream(rows, vae.decode_stream(z), self.options, check=check, on_decoded=decode.tick,
                               on_written=write.tick, poll=interrupts.check_interrupted,
                               failed_video=failed_video if self.many else None)
            if config.run.memory_report and not self.many:
                in_use.report("decode")
            interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
            for i in nonfinite:
                problems.setdefault(i, out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max())))
            if not self.many:
                if self.early is not None:
                    self.early.commit()
                self.times = {**times.as_dict(), "frames_per_s": round(total / times.decode_s, 3)}
                return
            for i, job in enumerate(batch):
                if i not in problems:
                    try:
                        rows[i][0].commit()
                        self.written.append(job.outputs[0])
                    except Exception as e:
                        problems[i] = errors.one_line(e)
                if i in problems:
                    self.failed += jobs.failures([job], problems[i], bar)
                bar.tick()
                interrupts.check_interrupted()

    def _whole(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], plan: plans.ShapePlan,
               bar) -> None:
        """Decodes the batch at once on the memory plan, then writes each video (retried once on a smaller plan)."""
        config, vae, shape, raw = self.config, self.vae, tuple(z.shape), self.raw
        videos, frames = z.shape[0], family_latents.frames_of(vae, z.shape[2])
        started = time.perf_counter()

        def decode_all():
            with _bar(not self.many, "decode", videos * frames, "frame", config.run.quiet) as decode:
                out = _decode(vae, z, raw)  # one program decodes the whole batch: the bar completes when it returns
                decode.tick(videos * frames)
            return decode, out

        # Compiled, then run, each agreed by every process (a process whose compile failed must not leave the
        # others inside the program).
        with agreement.together(f"decoding latents of shape {shape}"):
            out_of_memory.retry_out_of_memory(
                vae, shape, plan.program, "compiling the decode of",
                lambda: self._compile(lambda s: vae.compile_decode(s, frames=not raw), shape), quiet=config.run.quiet,
            )
            decode, out = out_of_memory.retry_out_of_memory(
                vae, shape, plan.program, "decoding latents of", decode_all, quiet=config.run.quiet
            )
        if config.run.memory_report and not self.many:
            in_use.report("decode")
        host, finite = _gather(out, raw)  # a collective: outside `together`, after all decoded
        del out
        # Every process, as it looks at the weights (which span them all).
        nonfinite = {i: out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max()))
                     for i in range(len(host)) if not finite[i]}
        if nonfinite and not self.many:
            raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
        per_video = 1 if raw else frames
        with agreement.together("writing the outputs"):
            with _bar(not self.many, "write", videos * per_video, "frame" if per_video > 1 else "file",
                      config.run.quiet) as write:
                if agreement.is_primary():
                    self._write(batch, host, unread, nonfinite, write, bar)
            if config.run.memory_report and not self.many:
                in_use.report("write")
            interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
        if not self.many:
            # Moved in only once every process has come through the step.
            with agreement.together("moving the outputs in"):
                if self.early is not None:
                    self.early.commit()
            self.times = {"decode_s": round(decode.seconds, 3), "write_s": round(write.seconds, 3),
                          "frames_per_s": round(videos * frames / decode.seconds, 3),
                          # Written whole: the first frame reaches the host with the last.
                          "first_frame_s": round(decode.seconds, 3),
                          "end_to_end_s": round(time.perf_counter() - started, 3), "write_hidden": 0.0}

    def _write(self, batch, host: np.ndarray, unread: dict[str, str], nonfinite: dict[int, str], write, bar) -> None:
        if not self.many:
            if self.early is not None:
                for i, one in enumerate(host):
                    self.early.write(i, one, self.options, tick=write.tick)
            return
        for i, job in enumerate(batch):
            error = unread.get(job.source) or nonfinite.get(i)
            if error is None:
                try:  # one video, atomically
                    Path(job.outputs[0]).parent.mkdir(parents=False, exist_ok=True)
                    with _writer(self.config, list(job.outputs), self.kind) as writer:
                        writer.write(0, host[i], self.options)
                        writer.commit()
                    self.written.append(job.outputs[0])
                except Exception as e:  # this video failed; the run goes on (KeyboardInterrupt still ends it)
                    error = errors.one_line(e)
            if error is not None:
                self.failed += jobs.failures([job], error, bar)
            bar.tick()
            interrupts.check_interrupted()

    # -- planning only ------------------------------------------------------

    def dry_run(self, work: dict[str, Any], load, names: list) -> dict[str, Any]:
        """Plans every batch shape's memory as the run would (compiled, not run); writes nothing."""
        config, vae = self.config, self.vae
        items = [jobs.Job.from_dict(d) for d in work["jobs"]]
        target = config.run.model.target
        memory_plans, stage = {}, None
        for shape in sorted(set(self.shapes(items).values())):
            def choose(shape=shape):
                return plans.choose(vae, shape, self.kind, config.stream, target)

            memory_plans[shape], self.chosen[shape], stage = stages.plan_stage(vae, shape, "decode", config.run,
                                                                               choose)
        why_not = {str(list(s)): p.why_not for s, p in self.chosen.items() if p.why_not is not None}
        fields = {"dry_run": True, **report.run_fields(vae, load)}
        if self.many:
            return {
                "many": True,
                **fields,
                # As a real run would end: some inputs cannot be decoded.
                "exit_code": errors.EXIT_SOME_FAILED if work["failed"] else errors.EXIT_OK,
                "videos": len(items),
                "skipped": work["skipped"],
                "failed": work["failed"],
                "batch_size": config.batch_size or vae.mesh.shape["dp"],
                "memory_plans": {str(list(s)): p.as_dict() for s, p in memory_plans.items()},
                "stream_why_not": why_not,
            }
        ((shape, chosen),) = self.chosen.items()
        out = {**fields, "memory_plan": memory_plans[shape].as_dict(), "plan_s": round(stage.seconds, 3),
               "latents_shape": list(shape), "layout": work["layout"], "streamed": chosen.streamed is not None,
               "stream_why_not": chosen.why_not, "outputs": [str(p) for p in names]}
        if target is not None:
            out.update(stages.target_report(vae, shape, chosen.program, target, memory_plans[shape]))
        return out


def _decode(vae, z: np.ndarray, raw: bool):
    """The batch's output on device, finished (an out-of-memory error surfaces here, not in the gather)."""
    import jax  # loaded with the model; imported here so that the command's own import needs no framework

    if raw:
        return jax.block_until_ready(vae.decode_jax(z).astype(jax.numpy.float32))
    return jax.block_until_ready(vae.decode_frames_jax(z))


def _gather(out, raw: bool) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of `_decode`'s output and its per-video finite flags; every process must call it."""
    if raw:
        host = distributed.to_host(out)
        return host, np.isfinite(host).reshape(host.shape[0], -1).all(axis=1)
    frames, finite = out
    return distributed.to_host(frames), distributed.to_host(finite)


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 1 error, 2 bad input, 3 out of memory, 130 interrupted)."""
    return command.command(_parser, argv, DecodeConfig.from_args, run, report.print_decode)
