"""What the decode command reports of one file: its summary's fields, and the lines it prints of them.

The many-latents run's summary is `cogvideox_torchax.cli.decode_many`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cogvideox_torchax.cli import stages, timeline

if TYPE_CHECKING:
    from cogvideox_torchax.cli.decode_config import DecodeConfig


def summary(config: DecodeConfig, vae, z, kind: str, layout: str, video_shape: list[int], plan) -> dict[str, Any]:
    """What both ways of decoding one file say first: outputs, shapes, layout, the memory plan."""
    from cogvideox_torchax.io import outputs

    return {
        "outputs": [str(p) for p in outputs.output_paths(Path(config.output), z.shape[0])],
        "kind": kind,
        "latents_shape": list(z.shape),
        "layout": layout,
        "unscaled": bool(config.unscale),
        "unscaled_as": vae.family.pipeline_word(),
        "video_shape": video_shape,
        "memory_plan": plan.as_dict(),
    }


def print_summary(s: dict[str, Any]) -> None:
    from cogvideox_torchax.io.paths import shown  # names that are not UTF-8 printed, not a failure

    if s.get("many"):
        from cogvideox_torchax.cli import decode_many

        decode_many.print_summary(s)
        return
    plan = s["memory_plan"]
    if s.get("dry_run"):
        print(
            f"plan for {s['latents_shape']} ({s['dtype']}, mesh {s['mesh']}): {plan['name']}, "
            f"{plan['bytes'] / 2**30:.2f} GiB per device of {plan['budget'] / 2**30:.2f} GiB usable; nothing run"
        )
        if not s["streamed"]:
            print(f"  not streamed: {s['stream_why_not']}")
        stages.print_target(s)
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
