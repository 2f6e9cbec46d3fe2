"""A stand-in for the device: real frames yielded on a schedule, as `TorchaxVAE.decode_stream` yields them.

`textured_video` makes a deterministic video with texture and motion (a
fractal-noise landscape under a slow pan, zoom and turn, and a textured
disc crossing it): content an encoder must work on, unlike flat colour or
gradients, and unlike noise, which no encoder can predict. `StandIn`
yields it in the batches the device would (CogVideoX: 9 frames, then 8 per
latent frame pair; Wan: 1, then 4 per latent frame) at a set speed, so the
writer sees what it would see behind a device of that speed, with none of
the host's cores used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _fractal(rng: np.random.Generator, height: int, width: int, octaves: int = 9, decay: float = 0.72) -> np.ndarray:
    """A ``(height, width)`` float32 field in [0, 1] with a 1/f spectrum, as natural images have."""
    from PIL import Image

    out = np.zeros((height, width), np.float32)
    total = 0.0
    for o in range(octaves):
        cells = 2 ** (o + 2)
        grid = rng.random((max(2, cells * height // width), cells), dtype=np.float32)
        up = np.asarray(Image.fromarray(grid, mode="F").resize((width, height), Image.BICUBIC))
        weight = decay**o
        out += weight * up
        total += weight
    out /= total
    lo, hi = np.percentile(out, (1, 99))
    return np.clip((out - lo) / (hi - lo), 0, 1)


def textured_video(frames: int, height: int, width: int, seed: int = 0, camera: bool = True) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8: a textured scene, the same for the same arguments (a longer one's prefix).

    ``camera``: the camera pans, zooms and turns (else it stands still and
    only the disc moves, where libx264's lookahead and macroblock tree gain
    most).
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    # The scene, larger than the view so the camera can move over it.
    sh, sw = int(height * 1.5), int(width * 1.5)
    scene = np.stack([_fractal(rng, sh, sw) for _ in range(3)], axis=-1)
    scene = 0.55 * scene + 0.45 * scene.mean(axis=-1, keepdims=True)  # colours, not three unrelated fields
    # Edges, as objects have: a coarser field cut at its median darkens half the scene with a sharp border.
    regions = _fractal(rng, sh, sw, 4)
    scene *= np.where(regions > np.median(regions), 1.0, 0.55)[..., None]
    scene = Image.fromarray((scene * 255).astype(np.uint8), mode="RGB")
    disc_size = height // 3
    disc = Image.fromarray((np.stack([_fractal(rng, disc_size, disc_size, 5)] * 3, -1)
                            * np.array([255, 180, 90])).astype(np.uint8), mode="RGB")
    yy, xx = np.mgrid[0:disc_size, 0:disc_size]
    r = disc_size / 2
    mask = Image.fromarray((((yy - r) ** 2 + (xx - r) ** 2 < r * r) * 255).astype(np.uint8), mode="L")
    out = np.empty((frames, height, width, 3), np.uint8)
    for i in range(frames):
        t = i if camera else 0
        # Camera: a pan of about 1.5 px a frame, a zoom of 0.2 % and a turn of 0.05 degrees a frame.
        angle = np.deg2rad(0.05 * t)
        scale = 1.0 / (1.0 + 0.002 * t)
        cx, cy = sw / 2 - width / 2 + 1.3 * t, sh / 2 - height / 2 + 0.7 * t
        a, b = scale * np.cos(angle), -scale * np.sin(angle)
        c, d = scale * np.sin(angle), scale * np.cos(angle)
        # PIL's affine maps output (x, y) to input (a x + b y + tx, c x + d y + ty), about the view's centre.
        tx = cx + width / 2 - (a * width / 2 + b * height / 2)
        ty = cy + height / 2 - (c * width / 2 + d * height / 2)
        view = scene.transform((width, height), Image.AFFINE, (a, b, tx, c, d, ty), resample=Image.BILINEAR)
        x = int(-disc_size + (width + disc_size) * i / 48)  # across the view in 48 frames, whatever the length
        y = int(height / 2 - disc_size / 2 + height / 6 * np.sin(i / 7))
        view.paste(disc, (x, y), mask)
        out[i] = np.asarray(view)
    return out


def _tiny_presets() -> dict[str, str]:
    # Each family's tiny test preset, named in its record: "tiny" or "<something>-tiny".
    from cogvideox_torchax import families

    return {name: next(p for p in family.presets if p == "tiny" or p.endswith("-tiny"))
            for name, family in families.FAMILIES.items()}


# The preset whose upstream module `device_batches` reads each family's batches on (its tiny config).
BATCH_PRESETS = _tiny_presets()


@functools.cache
def device_batches(family: str, frames: int) -> tuple[int, ...]:
    """The frames of each batch `decode_stream` yields for a ``frames``-frame video of ``family``.

    Read from the family's record (`Family.stream_batches` over
    `Family.frames_of`) on its tiny preset's upstream module: CogVideoX's 9,
    then 8 a batch; Wan's 1, then 4; the families that decode in one call
    (LTX, HunyuanVideo) the whole video.

    Raises:
        ValueError: an unknown family, or a frame count its videos cannot have.
    """
    from cogvideox_torchax import families
    from cogvideox_torchax.loading import random_upstream

    if family not in BATCH_PRESETS:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(BATCH_PRESETS)})")
    module = random_upstream(BATCH_PRESETS[family])
    record, config = families.get(family), module.config
    counts = {record.frames_of(config, t): t for t in range(frames, 0, -1)}  # the fewest latents win
    if frames not in counts:
        raise ValueError(f"no {family} decode gives {frames} frames (its videos have {record.frame_rule(config)})")

    def total(t: int) -> int:
        return 0 if t == 0 else record.frames_of(config, t)

    return tuple(total(stop) - total(start) for start, stop in record.stream_batches(module, counts[frames]))


@dataclasses.dataclass(frozen=True)
class Chunk:
    """What the writer takes from `decode_stream`: ``data`` uint8 ``(B, F, H, W, 3)``, ``finite`` ``(B,)``."""

    data: np.ndarray
    finite: np.ndarray
    start: int
    frames: int


class StandIn:
    """Yields ``video``'s frames in the device's batches, batch ``k`` when a device of ``fps`` frames a second has it.

    The schedule is kept from the first ``next``: a batch comes at its
    planned time or, if the consumer asked late, at once (as a device whose
    results wait on the host). Sleeping, it takes none of the host's cores.
    """

    def __init__(self, video: np.ndarray, fps: float, batches: list[int] | None = None):
        self.video, self.fps = video, fps
        self.batches = batches or list(device_batches("cogvideox", len(video)))

    def __iter__(self) -> Iterator[Chunk]:
        start = time.perf_counter()
        done = 0
        for size in self.batches:
            due = start + (done + size) / self.fps
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            yield Chunk(self.video[None, done:done + size], np.ones(1, bool), done, size)
            done += size

    def seconds(self) -> float:
        """The decode's own time: when the last batch is due."""
        return len(self.video) / self.fps


# -- measuring a writer behind the stand-in -------------------------------------------------------


def read_back(path: Path, source: np.ndarray) -> tuple[int, float]:
    """Frames the mp4 at ``path`` decodes to, and their PSNR (dB, RGB) against ``source`` (inf if equal)."""
    import av

    with av.open(str(path)) as container:
        got = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])
    if got.shape != source.shape:
        return len(got), float("nan")
    mse = float(np.mean((got.astype(np.float64) - source) ** 2))
    return len(got), float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def held_back(writer: Any, video: np.ndarray, batches: list[int]) -> int:
    """The most frames ``writer`` held back after any of the device's batches: given, but waiting for a later frame.

    libx264 hands a frame back encoded once it has the frames its lookahead
    needs; a segmented writer starts a segment's encode once it has the
    segment (its ``held``).
    """
    most, start = 0, 0
    for size in batches:
        writer.write(video[start:start + size])
        start += size
        most = max(most, writer.held if hasattr(writer, "held") else writer.count - writer.encoded)
    writer.close()
    return most


def write_alone(writer: Any, video: np.ndarray) -> float:
    """Seconds ``writer`` takes for the whole video given at once: the writer's own time."""
    start = time.perf_counter()
    writer.write(video)
    writer.close()
    return time.perf_counter() - start


def write_streamed(writer: Any, video: np.ndarray, fps: float, batches: list[int] | None = None) -> Any:
    """The decode command's streamed write (`write_while_decoding`) behind a `StandIn` of ``fps``: its `StreamTimes`."""
    from cogvideox_torchax.io.writer import write_while_decoding

    return write_while_decoding(iter(StandIn(video, fps, batches)), lambda i: writer, 1)


@contextlib.contextmanager
def cores(count: int | None) -> Iterator[int]:
    """Runs the block on the first ``count`` cores this process may use (threads started inside inherit them)."""
    allowed = sorted(os.sched_getaffinity(0))
    if count is None or count >= len(allowed):
        yield len(allowed)
        return
    os.sched_setaffinity(0, allowed[:count])
    try:
        yield count
    finally:
        os.sched_setaffinity(0, allowed)


def quiet(max_load: float | None, timeout_s: float = 3600) -> float:
    """Waits until the 1-minute load average is below ``max_load`` (None: no wait); returns the load then."""
    deadline = time.monotonic() + timeout_s
    while max_load is not None and os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5)
    return round(os.getloadavg()[0], 2)


def equal_psnr_size(points: list[tuple[int, float]], psnr: float) -> float | None:
    """Bytes at ``psnr`` on a setting's (bytes, PSNR) points over crfs, log-linear between the two around it."""
    points = sorted(points, key=lambda p: p[1])
    for (s0, p0), (s1, p1) in zip(points, points[1:], strict=False):
        if p0 <= psnr <= p1 and p1 > p0:
            return float(np.exp(np.log(s0) + (psnr - p0) / (p1 - p0) * (np.log(s1) - np.log(s0))))
    return None


# -- python -m bench.stream --stand-in ... -----------------------------------------------------------


def add_arguments(p: Any) -> None:
    """``bench.stream``'s stand-in options."""
    g = p.add_argument_group("stand-in device (--stand-in): the writer behind real frames on a schedule")
    g.add_argument("--stand-in", metavar="FPS", help="device speeds, comma list: frames per second, or Nx for N "
                   "times the writer's own frames per second (e.g. 4x,0.5x: a device 4 times faster, and 2 times "
                   "slower); alone: the writer alone only")
    g.add_argument("--videos", default="480x720x49,768x1360x81", help="--stand-in: HxWxF videos, comma list")
    g.add_argument("--content", default="pan", help="--stand-in: pan (the camera moves) and/or still, comma list")
    g.add_argument("--settings", default="default,before",
                   help="--stand-in: writer settings (bench.writer_settings.SETTINGS), comma list")
    g.add_argument("--batches", default="cogvideox", help="--stand-in: the device's batches, as a family's decode "
                   "yields them (cogvideox: 9 frames, then 8; wan: 1, then 4), comma list of "
                   f"{', '.join(BATCH_PRESETS)}")
    g.add_argument("--cores", default="2", help="--stand-in: cores given to the writer, comma list (first N)")
    g.add_argument("--rd-crfs", default="", help="--stand-in: crfs to encode each setting at too, for its size at "
                   "the 'before' setting's PSNR at --crf (e.g. 12,14,16,18,20,22)")
    g.add_argument("--max-load", type=float, default=None,
                   help="--stand-in: wait before each timed run until the 1-minute load average is below this")


def environment() -> dict:
    """The machine and the versions that write: CPU, cores, Python, PyAV and its libx264."""
    import importlib.metadata as md
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    import av

    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "av": md.version("av"), "libavcodec": ".".join(map(str, av.library_versions["libavcodec"])),
            "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def _speeds(text: str) -> list[str]:
    return [] if text == "alone" else text.split(",")


def _speed(text: str, writer_fps: float) -> float:
    return float(text[:-1]) * writer_fps if text.endswith("x") else float(text)


def run(args: Any) -> dict:
    """Every row of a ``--stand-in`` run: the writer alone, then streamed behind each device speed."""
    import tempfile

    rows: list[dict] = []
    unknown = sorted(set(args.batches.split(",")) - set(BATCH_PRESETS))
    if unknown:
        raise SystemExit(f"--batches: unknown {', '.join(unknown)} (known: {', '.join(BATCH_PRESETS)})")
    with tempfile.TemporaryDirectory() as d:
        for text in args.videos.split(","):
            height, width, frames = (int(v) for v in text.split("x"))
            for content in args.content.split(","):
                video = textured_video(frames, height, width, camera=content == "pan")
                for family in args.batches.split(","):
                    base = {"video": text, "content": content, "crf": args.crf, "batches": family}
                    rows += _video_rows(args, video, list(device_batches(family, frames)), base, Path(d) / "v.mp4")
    return {"rows": rows}


def _progress(row: dict) -> dict:
    import json
    import sys

    print(json.dumps(row), file=sys.stderr, flush=True)  # each row as it is measured: a long run's partial result
    return row


def _video_rows(args: Any, video: np.ndarray, batches: list[int], base: dict, dest: Path) -> list[dict]:
    import statistics

    from bench.writer_settings import SETTINGS

    frames = len(video)
    counts = [int(c) for c in args.cores.split(",")]
    crfs = [int(c) for c in args.rd_crfs.split(",") if c]
    rows, rd = [], {}
    for name in args.settings.split(","):
        open_writer = SETTINGS[name][1]
        with cores(counts[0]) as given:  # sizes and PSNR over crfs: no clock, no quiet machine needed
            for crf in crfs:
                write_alone(open_writer(dest, crf, given), video)
                rd.setdefault(name, []).append((dest.stat().st_size, read_back(dest, video)[1]))
                _progress({**base, "setting": name, "cores": given, "kind": "rd", "rd_crf": crf,
                           "bytes": rd[name][-1][0], "psnr_db": round(rd[name][-1][1], 3)})
        for count in counts:
            with cores(count) as given:
                held = held_back(open_writer(dest, args.crf, given), video, batches)
                loads = [quiet(args.max_load) for _ in range(args.repeats)]
                seconds = statistics.median(write_alone(open_writer(dest, args.crf, given), video) for _ in loads)
                read, psnr = read_back(dest, video)
                row = {**base, "setting": name, "cores": given}
                rows.append(_progress({**row, "kind": "alone", "seconds": round(seconds, 3),
                                       "fps": round(frames / seconds, 2), "bytes": dest.stat().st_size,
                                       "psnr_db": round(psnr, 3), "frames_read": read, "held_back": held,
                                       "load": max(loads)}))
                for speed in _speeds(args.stand_in):
                    fps = _speed(speed, frames / seconds)
                    runs = []
                    for _ in range(args.repeats):
                        load = quiet(args.max_load)
                        runs.append((write_streamed(open_writer(dest, args.crf, given), video, fps, batches), load))
                    t, load = sorted(runs, key=lambda r: r[0].end_to_end_s)[len(runs) // 2]
                    rows.append(_progress({**row, "kind": "streamed", "device": speed, "device_fps": round(fps, 2),
                                           **_bounds(t, seconds, batches, frames / fps),
                                           "frames_read": read_back(dest, video)[0], "load": load}))
    if "before" in rd:  # each setting's size at the PSNR the writer before had at --crf
        target = next(r["psnr_db"] for r in rows if r["kind"] == "alone" and r["setting"] == "before"
                      and r["cores"] == counts[0])
        for r in rows:
            if r["kind"] == "alone" and r["setting"] in rd:
                same = equal_psnr_size(rd[r["setting"]], target)
                r["bytes_at_before_psnr"] = None if same is None else round(same)
    return rows


def _bounds(t: Any, alone: float, batches: list[int], device: float) -> dict:
    """A streamed run against the writer's own time ``alone``: the issue's bound, and the floor no writer beats.

    ``device`` is the stand-in's own decode time; ``t.decode_s``, when the
    last batch was taken, is later where the writer held the decode back
    (at most two batches wait for it, as behind a real device).
    """
    frames = sum(batches)
    fast = device < alone
    bound = 1.1 * alone if fast else t.decode_s + 0.1 * alone
    # No writer ends before it has written every frame from the first's arrival, nor before it has written the
    # last batch from its arrival (at its own rate per frame).
    floor = max(t.first_frame_s + alone, t.decode_s + alone * batches[-1] / frames)
    return {"regime": "device faster" if fast else "device slower", "device_s": round(device, 3),
            "first_frame_s": round(t.first_frame_s, 3), "decode_s": round(t.decode_s, 3),
            "write_busy_s": round(t.write_s, 3), "end_to_end_s": round(t.end_to_end_s, 3), "alone_s": round(alone, 3),
            "over_alone": round(t.end_to_end_s / alone, 3),
            "after_decode_of_alone": round((t.end_to_end_s - t.decode_s) / alone, 3),
            "tail_frames": round((t.end_to_end_s - t.decode_s) / alone * frames, 1),
            "bound_s": round(bound, 3), "met": t.end_to_end_s <= bound, "floor_s": round(floor, 3)}


def print_report(report: dict) -> None:
    alone = [r for r in report["rows"] if r["kind"] == "alone"]
    print("video          content  setting        cores  alone s  frames/s  bytes      PSNR dB  held  load")
    for r in alone:
        print(f"{r['video']:<14} {r['content']:<8} {r['setting']:<14} {r['cores']:>5} {r['seconds']:>8.2f} "
              f"{r['fps']:>9.1f}  {r['bytes']:<10} {r['psnr_db']:>7.2f} {r['held_back']:>5}  {r['load']}")
    print()
    print("video          batches    setting        cores  device   decode s  first s  end s  alone s  end/alone  "
          "(end-decode)/alone  bound s  met  floor s  load")
    for r in report["rows"]:
        if r["kind"] == "streamed":
            print(f"{r['video']:<14} {r.get('batches', 'cogvideox'):<10} {r['setting']:<14} {r['cores']:>5}  "
                  f"{r['device']:<7} {r['decode_s']:>8.2f} "
                  f"{r['first_frame_s']:>8.2f} {r['end_to_end_s']:>6.2f} {r['alone_s']:>8.2f} {r['over_alone']:>10.3f}"
                  f"  {r['after_decode_of_alone']:>18.3f} {r['bound_s']:>8.2f}  {'yes' if r['met'] else 'no ':<3}"
                  f" {r['floor_s']:>8.2f}  {r['load']}")
