"""What the commands report: each run's summary (``--json`` prints it) and the lines printed of it.

A decode of one file says its outputs, shapes, layout, memory plan and
timings; a many-latents run (``"many": true``) what it wrote, skipped and
failed, per shape; an encode its input, latents and timings. Every summary
holds `run_fields` and `compile_fields`; the command adds the ``timeline``.
"""

from __future__ import annotations

from typing import Any

from cogvideox_torchax.cli import errors, timeline
from cogvideox_torchax.io import family_latents
from cogvideox_torchax.io.paths import shown  # names that are not UTF-8 printed, not a failure
from cogvideox_torchax.parallel import distributed


def run_fields(vae, load) -> dict[str, Any]:
    """What every command's summary says of the run: dtype, mesh, processes, device, plan, load seconds."""
    import jax  # loaded already by now; imported here so that the command's own import needs no framework

    return {
        "model": vae.family.class_name,
        "dtype": vae.options.dtype,
        "mesh": dict(vae.mesh.shape),
        "processes": jax.process_count(),
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "plan": vae.plan.as_dict(),
        "load_s": round(load.seconds, 3),
    }


def compile_fields(seconds: float, cache_dir: Any, status: str) -> dict[str, Any]:
    """The compile seconds and JAX compile cache: ``status`` (as the run saw it), ``"off"`` without a cache."""
    return {
        "compile_s": round(seconds, 3),
        "compile_cache": status if cache_dir else "off",
        "compile_cache_dir": str(cache_dir) if cache_dir else None,
    }


def decoded(config, work, plans, done, decode_s: float, total_s: float) -> dict[str, Any]:
    """A decode run's summary: one file's outputs, shapes and timings, or a many-latents run's counts per shape."""
    vae = work.vae
    fields = {**run_fields(vae, work.load), **compile_fields(plans.compile_s, work.cache_dir, plans.cache)}
    if config.output_dir is None:
        (job,) = work.jobs
        plan = plans.by_shape[job.shape]
        return {
            "outputs": list(job.outputs),
            "kind": done.kind,
            "latents_shape": list(job.shape),
            "layout": work.layout,
            "unscaled": bool(config.unscale),
            "unscaled_as": vae.family.pipeline_word(),
            "video_shape": [job.shape[0], 3, family_latents.frames_of(vae, job.shape[2]),
                            *family_latents.frame_size(vae, job.shape)],
            "memory_plan": (plan.streamed or vae.planned(job.shape, kind=plan.program)).as_dict(),
            "streamed": plan.streamed is not None,
            "stream_why_not": plan.why_not,
            **fields,
            "end_to_end_s": round(total_s, 3),
            **done.times,
        }
    memory = {str(list(s)): p.streamed or vae.planned(s, kind=p.program) for s, p in plans.by_shape.items()}
    return {
        "many": True,
        "exit_code": distributed.share_json(errors.EXIT_SOME_FAILED if done.failed else errors.EXIT_OK),
        "output_dir": str(config.output_dir),
        "format": config.format,
        "inputs": work.inputs,
        "videos": len(work.jobs),
        "written": done.written,
        "skipped": work.skipped,
        "failed": done.failed,
        "shapes": [list(s) for s in plans.by_shape],
        "batch_size": config.batch_size or vae.mesh.shape["dp"],
        **fields,
        "memory_plans": {k: p.as_dict() for k, p in memory.items() if p is not None},
        # Each shape's reason, where its videos were decoded whole and then written.
        "stream_why_not": _why_not(plans),
        "decode_s": round(decode_s, 3),
        "videos_per_s": round(len(done.written) / decode_s, 3) if decode_s > 0 else None,
    }


def planned(config, work, plans) -> dict[str, Any]:
    """``--dry-run``'s summary: each shape's plan, compiled, nothing run (and ``--target``'s report)."""
    fields = {"dry_run": True, **run_fields(work.vae, work.load)}
    if config.output_dir is not None:
        return {
            "many": True,
            **fields,
            # As a real run would end: some inputs cannot be decoded.
            "exit_code": errors.EXIT_SOME_FAILED if work.failed else errors.EXIT_OK,
            "videos": len(work.jobs),
            "skipped": work.skipped,
            "failed": work.failed,
            "batch_size": config.batch_size or work.vae.mesh.shape["dp"],
            "memory_plans": {str(list(s)): p.memory.as_dict() for s, p in plans.by_shape.items()},
            "stream_why_not": _why_not(plans),
        }
    ((shape, plan),) = plans.by_shape.items()
    return {**fields, "memory_plan": plan.memory.as_dict(), "plan_s": round(plan.plan_s, 3),
            "latents_shape": list(shape), "layout": work.layout, "streamed": plan.streamed is not None,
            "stream_why_not": plan.why_not, "outputs": list(work.jobs[0].outputs), **plan.target}


def _why_not(plans) -> dict[str, str]:
    return {str(list(s)): p.why_not for s, p in plans.by_shape.items() if p.why_not is not None}


def print_decode(s: dict[str, Any]) -> None:
    """The human lines of a decode's summary (``--json`` prints ``s`` itself)."""
    if s.get("many"):
        _print_many(s)
    else:
        _print_one(s)


def _print_one(s: dict[str, Any]) -> None:
    plan = s["memory_plan"]
    if s.get("dry_run"):
        _print_plan(s, str(s["latents_shape"]))
        if not s["streamed"]:
            print(f"  not streamed: {s['stream_why_not']}")
        print_target(s)
        return
    print(
        f"decoded {s['latents_shape']} ({s['layout']}, {s['unscaled_as'] if s['unscaled'] else 'as given'}) -> "
        f"{s['video_shape']} ({s['dtype']}, mesh {s['mesh']}, {s['device']})"
    )
    print(
        f"  load {s['load_s']:.2f} s | compile {s['compile_s']:.2f} s (cache {s['compile_cache']}) | "
        f"decode {s['decode_s']:.2f} s ({s['frames_per_s']:.2f} frames/s) | write {s['write_s']:.2f} s"
    )
    for line in timeline.lines(s):
        print(line)
    print(f"  memory plan: {plan['name']}, {plan['bytes'] / 2**30:.2f} GiB per device")
    if s.get("streamed"):
        print(f"  streamed: first frame after {s['first_frame_s']:.2f} s, done after {s['end_to_end_s']:.2f} s, "
              f"{100 * s['write_hidden']:.0f} % of the write hidden behind the decode")
    elif s.get("stream_why_not"):
        print(f"  not streamed ({s['stream_why_not']}): done after {s['end_to_end_s']:.2f} s")
    for path in s["outputs"]:
        print(f"  wrote {shown(path)}")


def _print_many(s: dict[str, Any]) -> None:
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


def print_encode(s: dict[str, Any]) -> None:
    """The human lines of an encode's summary."""
    if s.get("dry_run"):
        _print_plan(s, f"video {s['video_shape']}")
        print_target(s)
        return
    frames, height, width = s["input_shape"]
    _, _, used, used_h, used_w = s["video_shape"]
    print(
        f"encoded {shown(s['input'])} ({frames} frames {height}x{width}; used {used} frames {used_h}x{used_w}) -> "
        f"{s['latents_shape']} ({s['layout']}, "
        f"{'x' + format(s['scaling_factor'], 'g') if 'scaling_factor' in s else s['normalization']}, "
        f"posterior {s['posterior']}; "
        f"{s['dtype']}, mesh {s['mesh']}, {s['device']})"
    )
    print(
        f"  read {s['read_s']:.2f} s | load {s['load_s']:.2f} s | compile {s['compile_s']:.2f} s "
        f"(cache {s['compile_cache']}) | encode {s['encode_s']:.2f} s ({s['frames_per_s']:.2f} frames/s) | "
        f"write {s['write_s']:.2f} s"
    )
    for line in timeline.lines(s):
        print(line)
    print(f"  wrote {shown(s['output'])}")


def _print_plan(s: dict[str, Any], what: str) -> None:
    plan = s["memory_plan"]
    print(f"plan for {what} ({s['dtype']}, mesh {s['mesh']}): {plan['name']}, {plan['bytes'] / 2**30:.2f} GiB per "
          f"device of {plan['budget'] / 2**30:.2f} GiB usable; nothing run")


def print_target(s: dict[str, Any]) -> None:
    """The human lines of `plans.target_report`'s fields (nothing without ``--target``)."""
    if "target" not in s:
        return
    b, c = s["per_device_bytes"], s["compiled"]
    extra = s["memory_plan"].get("allowance") or 0
    print(f"  target {s['target']['name']} ({s['target']['description']}), compiled by its own compiler: "
          f"temp {b['temp'] / 2**30:.2f} GiB, arguments {b['arguments'] / 2**30:.2f} GiB, "
          f"outputs {b['outputs'] / 2**30:.2f} GiB per device"
          + (f"; the plan adds {extra / 2**30:.2f} GiB for the cuDNN workspaces autotuning picks on the device"
             if extra else ""))
    print(f"  {c['convolutions']} convolutions {c['conv_layouts']} -> {c['conv_output_dtypes']}; "
          f"activations moved to another layout {c['activation_layout_changes']} ({c['layout_changes']} moves in "
          f"all), copied {c['activation_copies']} ({c['copies']}); collectives {c['collectives'] or 'none'}; "
          f"planning (trace, lower and compile of each plan tried) {s['plan_s']:.2f} s")
