"""The decode command's ``--output-dir`` mode: many latents, one load, one compile per shape.

Process 0 finds the inputs, reads each once to learn its shape (a file that
cannot be decoded is reported and skipped here), and shares the work list;
then, batch by batch, it reads the latents and shares them, every process
decodes, and process 0 writes each video atomically as soon as it is
decoded. A failure of one batch (out of memory, NaN) is reported for its
files and the run goes on; the exit code is then `errors.EXIT_SOME_FAILED`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cogvideox_torchax.cli import agreement, batch, errors, interrupts, many_inputs, out_of_memory, stages, timeline
from cogvideox_torchax.cli.stages import Stage

if TYPE_CHECKING:
    from cogvideox_torchax.cli.decode_config import DecodeConfig


def run(config: DecodeConfig) -> dict[str, Any]:
    """Decodes every input into ``config.output_dir``; returns the summary (``exit_code`` 4 if some failed)."""
    import jax

    from cogvideox_torchax.memory import in_use
    from cogvideox_torchax.parallel import distributed

    out_dir = Path(config.output_dir)
    sources: list[str] = []
    with agreement.together("finding the inputs"):
        if agreement.is_primary():
            sources = [str(p) for p in many_inputs.find_inputs(config, out_dir)]
    sources = distributed.share_json(sources)

    cache_dir, vae, load = stages.load_together(config.run)
    size = config.batch_size or vae.mesh.shape["dp"]

    work: dict[str, Any] = {}
    with agreement.together("reading the inputs"):
        if agreement.is_primary():
            work = many_inputs.scan(config, vae, sources, out_dir)
    work = distributed.share_json(work)
    items = [batch.Item.from_dict(d) for d in work["items"]]
    failed: list[dict[str, Any]] = list(work["failed"])
    runs = batch.batches(items, size)
    # One program per latent shape, at the batch its runs share.
    counts: dict[tuple[int, ...], int] = {}
    for item in items:
        counts[item.shape] = counts.get(item.shape, 0) + 1
    batch_of = {s: batch.padded_size(n, size, vae.mesh.shape["dp"]) for s, n in counts.items()}
    shapes = sorted((batch_of[s], *s[1:]) for s in counts)

    if config.run.dry_run:
        return _dry_run(config, vae, load, work, shapes, size)

    raw = config.format in ("npy", "safetensors")
    kind = "decode" if raw else "frames"
    written: list[str] = []
    compile_s = 0.0
    # Per shape: the streamed decode's plan, or None and why not (decided at its first batch).
    streams: dict[tuple[int, ...], Any] = {}
    why_not: dict[tuple[int, ...], str] = {}
    with Stage("decode", len(items), "video", config.run.quiet) as bar:
        for run_items in runs:
            shape = (batch_of[run_items[0].shape], *run_items[0].shape[1:])
            z, unread = None, {}
            with agreement.together(f"reading latents for shape {shape}"):
                if agreement.is_primary():
                    z, unread = many_inputs.read_run(config, vae, run_items, shape)
            z = distributed.share_array(z)
            if shape not in streams:
                t0 = time.perf_counter()
                streams[shape], why = _stream_choice(config, vae, shape)
                compile_s += time.perf_counter() - t0
                timeline.record_part("compile", t0, time.perf_counter())
                if why is not None:
                    why_not[shape] = why
            if streams[shape] is not None:
                try:
                    done, failures = _stream_run(config, vae, z, run_items, unread, bar)
                except Exception as e:
                    if config.run.debug:
                        raise
                    if out_of_memory.is_out_of_memory(e) and vae.memory_budget()[1] != "max_memory":
                        # Under "auto", as the one-file run: this shape decodes whole on the planner's plan.
                        streams[shape], why_not[shape] = None, "the streamed decode ran out of memory"
                        bar.write(f"out of memory while streaming latents of shape {shape}; "
                                  "decoding with the memory plan instead")
                    else:
                        failed += many_inputs.failures(run_items, errors.one_line(e), bar)
                        bar.tick(len(run_items))
                        continue
                else:
                    written += done
                    failed += failures
                    continue
            try:
                with agreement.together(f"decoding latents of shape {shape}"):
                    t0 = time.perf_counter()
                    out_of_memory.retry_out_of_memory(
                        vae, shape, kind, "compiling the decode of",
                        lambda: vae.compile_decode(shape, frames=not raw), quiet=config.run.quiet,
                    )
                    compile_s += time.perf_counter() - t0
                    timeline.record_part("compile", t0, time.perf_counter())
                    out = out_of_memory.retry_out_of_memory(
                        vae, shape, kind, "decoding latents of", lambda: _decode(vae, z, raw), quiet=config.run.quiet
                    )
            except Exception as e:  # every process leaves `together` the same way: all go on
                if isinstance(e, errors.PeerFailed) and e.code in errors.SIGNALLED:
                    raise
                if config.run.debug and not isinstance(e, errors.PeerFailed) and jax.process_count() == 1:
                    raise
                failed += many_inputs.failures(run_items, errors.one_line(e), bar)
                bar.tick(len(run_items))
                continue
            host, finite = _gather(out, raw)  # a collective: outside `together`, after all decoded
            del out
            # Every process, as it looks at the weights (which span them all).
            nonfinite = {
                i: out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max()))
                for i in range(len(run_items))
                if not finite[i]
            }
            with agreement.together(f"writing the videos of shape {shape}"):
                if agreement.is_primary():
                    for i, item in enumerate(run_items):
                        error = unread.get(item.source) or nonfinite.get(i)
                        if error is None:
                            error = _write(config, item, host[i], config.fps_for(vae))
                        if error is None:
                            written.append(item.output)
                        else:
                            failed += many_inputs.failures([item], error, bar)
                        bar.tick()
                        interrupts.check_interrupted()
    if config.run.memory_report:
        in_use.report("decode")
    code = errors.EXIT_SOME_FAILED if failed else errors.EXIT_OK
    return {
        "many": True,
        "exit_code": distributed.share_json(code),
        "output_dir": str(out_dir),
        "format": config.format,
        "inputs": len(sources),
        "videos": len(items),
        "written": written,
        "skipped": work["skipped"],
        "failed": failed,
        "shapes": [list(s) for s in shapes],
        "batch_size": size,
        **stages.run_fields(vae, load),
        "memory_plans": _plans(vae, shapes, "decode" if raw else "frames", streams),
        # Each shape's reason, where its videos were decoded whole and then written.
        "stream_why_not": {str(list(s)): why for s, why in why_not.items()},
        # Several shapes compile: the cache is on, each one's hit or miss not told.
        **stages.compile_fields(compile_s, cache_dir, "on"),
        "decode_s": round(bar.seconds, 3),
        "videos_per_s": round(len(written) / bar.seconds, 3) if bar.seconds > 0 else None,
    }


def _plans(vae, shapes: list[tuple[int, ...]], kind: str, streams: dict) -> dict[str, dict[str, Any]]:
    plans = {str(list(s)): streams.get(s) or vae.planned(s, kind=kind) for s in shapes}
    return {k: p.as_dict() for k, p in plans.items() if p is not None}


def _stream_choice(config: DecodeConfig, vae, shape: tuple[int, ...]) -> tuple[Any, str | None]:
    """The streamed decode's plan for a batch shape (its programs compiled), or None and why not."""
    from cogvideox_torchax.cli import stream_choice

    why = stream_choice.why_not(config.stream, config.format, vae, shape)
    if why is not None:
        return None, why
    try:
        plan, _, why = stream_choice.streamed_plan(vae, shape)
    except errors.OutOfMemory:  # under a given --max-memory: the planner's plan may still fit
        return None, "compiling the streamed decode ran out of memory"
    return plan, why


def _stream_run(config: DecodeConfig, vae, z: np.ndarray, items: list[batch.Item], unread: dict[str, str],
                bar: Stage) -> tuple[list[str], list[dict[str, Any]]]:
    """Streams one batch: each video written (staged) while the next latent frames decode. One process only.

    A video that cannot be read, staged or written, or whose frames are not
    finite, fails alone; the others are moved in. Returns the outputs
    written and the failures.
    """
    from cogvideox_torchax.cli import streamed_write
    from cogvideox_torchax.io import outputs

    problems: dict[int, str] = {i: unread[item.source] for i, item in enumerate(items) if item.source in unread}
    nonfinite: set[int] = set()
    written: list[str] = []
    with contextlib.ExitStack() as stack:
        staged: dict[int, outputs.StagedOutputs] = {}
        for i, item in enumerate(items):
            if i in problems:
                continue
            try:
                Path(item.output).parent.mkdir(parents=False, exist_ok=True)
                staged[i] = stack.enter_context(outputs.StagedOutputs([item.output], overwrite=config.overwrite))
            except Exception as e:  # this video fails; the batch goes on
                problems[i] = errors.one_line(e)

        # None: unread, not staged, or the batch's padding.
        temps = [staged[i].temps[0] if i in staged else None for i in range(z.shape[0])]
        open_writer = streamed_write.staged_writers(temps, config.format, fps=config.fps_for(vae), crf=config.crf,
                                                    encoder=config.encoder, preset=config.preset)

        def failed_video(i: int, error: Exception | None) -> None:
            if error is None:
                nonfinite.add(i)
            else:
                problems[i] = errors.one_line(error)

        streamed_write.write_while_decoding(
            vae.decode_stream(z), open_writer, z.shape[0], check=lambda chunk: None, on_decoded=lambda n: None,
            on_written=lambda: None, guard=lambda i, n: outputs.disk_full_named(Path(items[i].output), n),
            failed_video=failed_video,
        )
        for i in nonfinite:
            problems.setdefault(i, out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z[i]).max())))
        failures: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            if i not in problems:
                try:
                    interrupts.commit(staged[i])
                    written.append(item.output)
                except Exception as e:
                    problems[i] = errors.one_line(e)
            if i in problems:
                failures += many_inputs.failures([item], problems[i], bar)
            bar.tick()
            interrupts.check_interrupted()
    return written, failures


def _decode(vae, z: np.ndarray, raw: bool):
    """The batch's output on device, finished (an out-of-memory error surfaces here, not in the gather)."""
    import jax

    if raw:
        return jax.block_until_ready(vae.decode_jax(z).astype(jax.numpy.float32))
    return jax.block_until_ready(vae.decode_frames_jax(z))


def _gather(out, raw: bool) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of `_decode`'s output and its per-video finite flags; every process must call it."""
    from cogvideox_torchax.parallel import distributed

    if raw:
        host = distributed.to_host(out)
        return host, np.isfinite(host).reshape(host.shape[0], -1).all(axis=1)
    frames, finite = out
    return distributed.to_host(frames), distributed.to_host(finite)


def _write(config: DecodeConfig, item: batch.Item, one: np.ndarray, fps: float) -> str | None:
    """Writes one video to its output, atomically; returns why it could not be, or None."""
    from cogvideox_torchax.io import outputs, video

    output = Path(item.output)
    try:
        output.parent.mkdir(parents=False, exist_ok=True)
        with outputs.StagedOutputs([output], overwrite=config.overwrite) as staged:
            with outputs.disk_full_named(output, one.nbytes):
                video.write_video_to(staged.temps[0], config.format, one, fps=fps, crf=config.crf,
                                     encoder=config.encoder, preset=config.preset)
                interrupts.commit(staged)
    except Exception as e:  # this video failed; the run goes on (KeyboardInterrupt still ends it)
        return errors.one_line(e)
    return None


def _dry_run(config: DecodeConfig, vae, load: Stage, work: dict[str, Any], shapes: list[tuple[int, ...]], size: int) -> dict[str, Any]:
    """Plans every batch shape's memory (compiled, not run); writes nothing."""
    kind = "decode" if config.format in ("npy", "safetensors") else "frames"
    plans, why_not = {}, {}
    for shape in shapes:
        with agreement.together("planning"), out_of_memory.out_of_memory_as_exit_3("planning the decode of", shape):
            plan, why = _stream_choice(config, vae, shape)
            if why is not None:
                why_not[str(list(shape))] = why
            plans[str(list(shape))] = (plan or vae.memory_plan(shape, kind=kind)).as_dict()
    return {
        "many": True,
        "dry_run": True,
        # As a real run would end: some inputs cannot be decoded.
        "exit_code": errors.EXIT_SOME_FAILED if work["failed"] else errors.EXIT_OK,
        "videos": len(work["items"]),
        "skipped": work["skipped"],
        "failed": work["failed"],
        "batch_size": size,
        **stages.run_fields(vae, load),
        "memory_plans": plans,
        "stream_why_not": why_not,
    }


def print_summary(s: dict[str, Any]) -> None:
    """The human summary of a many-latents run (``--json`` prints ``s`` itself)."""
    from cogvideox_torchax.io.paths import shown  # names that are not UTF-8 printed, not a failure

    if s.get("dry_run"):
        print(f"{s['videos']} videos to decode ({s['dtype']}, mesh {s['mesh']}, batches of {s['batch_size']}):")
        for shape, plan in s["memory_plans"].items():
            print(f"  {shape}: {plan['name']}, {plan['bytes'] / 2**30:.2f} GiB per device; nothing run")
        for f in s["failed"]:
            errors.say(f"  cannot decode {f['input']!r}: {f['error']}")
        return
    rate = f"{s['videos_per_s']:.3f} videos/s" if s["videos_per_s"] is not None else "-"
    print(
        f"decoded {len(s['written'])} of {s['videos']} videos from {s['inputs']} files into {shown(s['output_dir'])} "
        f"({len(s['skipped'])} skipped as existing, {len(s['failed'])} failed; {s['dtype']}, mesh {s['mesh']}, "
        f"{s['processes']} process(es), {s['device']})"
    )
    print(
        f"  load {s['load_s']:.2f} s | compile {s['compile_s']:.2f} s for {len(s['shapes'])} shape(s) "
        f"(cache {s['compile_cache']}) | decode and write {s['decode_s']:.2f} s ({rate})"
    )
    for line in timeline.lines(s):
        print(line)
    for shape, why in s["stream_why_not"].items() if s["format"] in ("mp4", "png") else ():
        print(f"  {shape}: decoded whole, then written (not streamed: {why})")
    for f in s["failed"]:
        errors.say(f"  failed {f['input']!r}: {f['error']}")
