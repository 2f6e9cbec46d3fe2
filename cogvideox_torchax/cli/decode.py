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
from cogvideox_torchax.cli import agreement, command, errors, interrupts, jobs, options, out_of_memory, plans, summary
from cogvideox_torchax.cli.decode_config import DecodeConfig
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.options import add_model_arguments
from cogvideox_torchax.cli.stages import Stage
from cogvideox_torchax.io import family_latents, outputs
from cogvideox_torchax.io.writer import stream
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

    The jobs and the model (`jobs.prepare`), each shape's way compiled
    (`plans.make`), then batch by batch: its latents, decoded (streamed, or
    whole), written and moved in (`io.writer`); the summary last
    (`summary.decoded`). A decoder that draws noise (LTX-Video 0.9.1's)
    draws it from a generator seeded 0 for each decode: the same latents,
    the same video.
    """
    from cogvideox_torchax.vae import drawn_noise  # imports torch and JAX: not before the options are checked

    with drawn_noise.seeded_calls(0), contextlib.ExitStack() as stack:
        work = jobs.prepare(config, stack)
        many = config.output_dir is not None
        kind = config.format if many else (outputs.output_kind(config.output) if config.output else None)
        chosen = plans.make(config, work.vae, sorted(set(work.shapes.values())), kind)
        if config.run.dry_run:
            return summary.planned(config, work, chosen)
        done = _Done(config, work, kind, many)
        started = time.perf_counter()
        with _bar(many, "decode", len(work.jobs), "video", config.run.quiet) as bar:
            for batch in work.batches:
                plan = chosen.by_shape[work.shapes[batch[0].shape]]
                z, unread = None, {}
                with agreement.together(f"reading latents for shape {plan.shape}"):
                    if agreement.is_primary():
                        z, unread = _read(config, work, batch, plan.shape)
                z = distributed.share_array(z)
                try:
                    if plan.error is not None:
                        raise plan.error
                    with plans.streaming(work.vae, plan, bar.write):
                        if plan.streamed is not None:
                            done.streamed(batch, z, unread, bar)
                    if plan.streamed is None:
                        done.whole(batch, z, unread, bar)
                except Exception as e:  # a many-latents run fails the batch's videos and goes on
                    if not many or (isinstance(e, errors.PeerFailed) and e.code in errors.SIGNALLED):
                        raise
                    if config.run.debug and not isinstance(e, errors.PeerFailed) and agreement.process_count() == 1:
                        raise
                    done.fail(batch, errors.one_line(e), bar)
                    bar.tick(len(batch))
        if config.run.memory_report and many:
            in_use.report("decode")
        return summary.decoded(config, work, chosen, done, bar.seconds, time.perf_counter() - started)


def _read(config: DecodeConfig, work: jobs.Work, batch: list[jobs.Job], shape: tuple[int, ...]):
    """A batch's latents, zero-padded to ``shape``, and the sources that could not be read again (process 0)."""
    if config.output_dir is None:  # one file: read and prepared already
        return work.found.z, {}
    z = np.zeros(shape, np.float32)
    unread: dict[str, str] = {}
    cache: dict[str, np.ndarray] = {}
    for i, job in enumerate(batch):
        try:
            if job.source not in cache:  # files of several videos: read once (checked and warned of by `jobs.scan`)
                cache = {job.source: family_latents.read_for(work.vae, job.source, config.key, layout=config.layout,
                                                             unscale=config.unscale)[0]}
            one = cache[job.source][job.index : job.index + 1]
            if one.shape != job.shape:
                raise ValueError(f"{job.source!r} changed while this command ran (now {one.shape})")
            z[i] = one[0]
        except (ValueError, OSError) as e:
            unread[job.source] = errors.one_line(e)
    return z, unread


class _NoBar:
    """A many-latents run's bars, in a one-file run (or the other way round): none."""

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


class _Done:
    """Decoding and writing a batch, streamed or whole; what was written and what failed."""

    def __init__(self, config: DecodeConfig, work: jobs.Work, kind: str | None, many: bool):
        self.config, self.work, self.vae, self.kind, self.many = config, work, work.vae, kind, many
        self.raw = kind in ("npy", "safetensors")
        self.options = work.video
        self.written: list[str] = []
        self.failed: list[dict[str, Any]] = list(work.failed)
        self.times: dict[str, Any] = {}  # one file: its decode and write seconds, streamed or not

    def fail(self, batch: list[jobs.Job], error: str, bar) -> None:
        """Each video of ``batch`` failed with ``error``: named on stderr (process 0), kept for the summary."""
        for job in batch:
            if agreement.is_primary():
                bar.write(f"failed: {job.source!r} -> {job.outputs[0]!r}: {error}")
            self.failed.append({"input": job.source, "video": job.index, "output": job.outputs[0], "error": error})

    def _rows(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], stack: contextlib.ExitStack):
        """Each row of ``z``: (its writer, its output) or None (padding, or a video failed already: ``problems``)."""
        if not self.many:
            return [(self.work.writer, j) for j in range(z.shape[0])], {}
        rows, problems = [], {}
        for i, job in enumerate(batch):
            try:
                if job.source in unread:
                    raise ValueError(unread[job.source])
                Path(job.outputs[0]).parent.mkdir(parents=False, exist_ok=True)
                rows.append((stack.enter_context(self.work.stage(list(job.outputs), self.kind)), 0))
            except Exception as e:  # this video fails; the batch goes on
                problems[i] = errors.one_line(e)
                rows.append(None)
        return rows + [None] * (z.shape[0] - len(rows)), problems

    def streamed(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], bar) -> None:
        """Decodes latent frame batch by batch, each batch's frames written (on a thread) while the next decodes."""
        config, vae = self.config, self.vae
        frames = family_latents.frames_of(vae, z.shape[2])
        total = z.shape[0] * frames
        failed: dict[int, Exception | None] = {}  # video -> its writer's error, or None: frames not finite
        with contextlib.ExitStack() as stack:
            rows, problems = self._rows(batch, z, unread, stack)
            with _bar(not self.many, "decode", total, "frame", config.run.quiet) as decode, \
                    _bar(not self.many, "write", total, "frame", config.run.quiet) as write:
                # A video's failure (NaN in it, its writer) drops it alone; the decode stops once all have failed
                # (one file: at the first, which ends the run).
                times = stream(rows, vae.decode_stream(z), self.options, on_decoded=decode.tick,
                               on_written=write.tick, poll=interrupts.check_interrupted,
                               failed_video=failed.__setitem__, stop_at_first=not self.many)
            if config.run.memory_report and not self.many:
                in_use.report("decode")
            interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
            for i, error in failed.items():
                if not self.many:  # one file: its outputs are one, and the first failure ends the run
                    raise error or UsageError(out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
                problems.setdefault(i, errors.one_line(error) if error is not None else
                                    out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max())))
            if not self.many:
                self.work.writer.commit()
                self.times = {**times.as_dict(), "frames_per_s": round(total / times.decode_s, 3)}
                return
            for i, job in enumerate(batch):
                self._commit(job, rows[i][0] if i not in problems else None, problems.get(i), bar)

    def _commit(self, job: jobs.Job, writer, error: str | None, bar) -> None:
        """A many-latents run's video moved in (or its failure named); then a signal, if one came, ends the run."""
        if error is None:
            try:
                writer.commit()
                self.written.append(job.outputs[0])
            except Exception as e:
                error = errors.one_line(e)
        if error is not None:
            self.fail([job], error, bar)
        bar.tick()
        interrupts.check_interrupted()

    def whole(self, batch: list[jobs.Job], z: np.ndarray, unread: dict[str, str], bar) -> None:
        """Decodes the batch at once on the memory plan (retried once on a smaller one), then writes each video."""
        config, vae, shape, raw = self.config, self.vae, tuple(z.shape), self.raw
        frames = family_latents.frames_of(vae, z.shape[2])
        videos = z.shape[0]
        started = time.perf_counter()

        def decode_all():
            with _bar(not self.many, "decode", videos * frames, "frame", config.run.quiet) as decode:
                out = _decode(vae, z, raw)  # one program decodes the whole batch: the bar completes when it returns
                decode.tick(videos * frames)
            return decode, out

        # Every process runs the decode; all agree after it (one whose decode failed must not leave the others
        # waiting in the gather).
        # The VAE's calls retry out of memory (agreed); one outside them (the float32 copy) is exit 3 all the same.
        with agreement.together(f"decoding latents of shape {shape}"), \
                out_of_memory.agreed_retry(vae, "decoding latents of", quiet=config.run.quiet), \
                out_of_memory.out_of_memory_as_exit_3("decoding latents of", shape, vae, "decode" if raw else "frames"):
            decode, out = decode_all()
        if config.run.memory_report and not self.many:
            in_use.report("decode")
        host, finite = _gather(out, raw)  # a collective: outside `together`, after all decoded
        del out
        # Every process, as it looks at the weights (which span them all).
        nonfinite = {i: out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max()))
                     for i in range(videos) if not finite[i]}
        if nonfinite and not self.many:
            raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
        per_video = 1 if raw else frames
        with agreement.together("writing the outputs"):
            with _bar(not self.many, "write", videos * per_video, "frame" if per_video > 1 else "file",
                      config.run.quiet) as write:
                if agreement.is_primary():
                    for i, job in enumerate(batch):
                        self._write(i, job, host, unread.get(job.source) or nonfinite.get(i), write, bar)
            if config.run.memory_report and not self.many:
                in_use.report("write")
            interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
        if not self.many:
            # Moved in only once every process has come through the step.
            with agreement.together("moving the outputs in"):
                if self.work.writer is not None:
                    self.work.writer.commit()
            self.times = {"decode_s": round(decode.seconds, 3), "write_s": round(write.seconds, 3),
                          "frames_per_s": round(videos * frames / decode.seconds, 3),
                          # Written whole: the first frame reaches the host with the last.
                          "first_frame_s": round(decode.seconds, 3),
                          "end_to_end_s": round(time.perf_counter() - started, 3), "write_hidden": 0.0}

    def _write(self, i: int, job: jobs.Job, host: np.ndarray, error: str | None, write, bar) -> None:
        if not self.many:  # one file: every video of it into its staged output
            for j, one in enumerate(host):
                self.work.writer.write(j, one, self.options, tick=write.tick)
            return
        if error is None:
            try:  # one video, atomically
                Path(job.outputs[0]).parent.mkdir(parents=False, exist_ok=True)
                with self.work.stage(list(job.outputs), self.kind) as writer:
                    writer.write(0, host[i], self.options)
                    self._commit(job, writer, None, bar)
                return
            except Exception as e:  # this video failed; the run goes on (KeyboardInterrupt still ends it)
                error = errors.one_line(e)
        self._commit(job, None, error, bar)


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
    return command.command(_parser, argv, DecodeConfig.from_args, run, summary.print_decode)
