"""Does handing frames to the writer's thread batch by batch cost time? The default writer five ways, alternating.

Run from the project root: ``python docs/results/writer-pace-2026-11-28/handover.py 480x720x49 3``
(video HxWxF, rounds). Prints one JSON line: each variant's seconds per round and their medians.
"""

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the project root
from bench import stand_in  # noqa: E402
from bench.writer_settings import SETTINGS  # noqa: E402

height, width, frames = (int(v) for v in sys.argv[1].split("x"))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
video = stand_in.textured_video(frames, height, width)
batches = list(stand_in.device_batches("cogvideox", frames))
folder = Path(tempfile.mkdtemp())
open_writer = SETTINGS["default"][1]


def alone():  # the whole video in one write call, on this thread
    return stand_in.write_alone(open_writer(folder / "a.mp4", 18, 2), video)


def alone_batched():  # the device's batches, one write call each, on this thread
    writer = open_writer(folder / "b.mp4", 18, 2)
    start, done = time.perf_counter(), 0
    for size in batches:
        writer.write(video[done:done + size])
        done += size
    writer.close()
    return time.perf_counter() - start


def alone_thread():  # the whole video in one write call, on another thread
    writer = open_writer(folder / "c.mp4", 18, 2)
    thread = threading.Thread(target=lambda: stand_in.write_alone(writer, video))
    start = time.perf_counter()
    thread.start()
    thread.join()
    return time.perf_counter() - start


def streamed(fps):  # the decode command's streamed write behind a stand-in of fps frames a second
    return lambda: stand_in.write_streamed(open_writer(folder / "s.mp4", 18, 2), video, fps).end_to_end_s


own = alone()
variants = {"alone": alone, "alone_batched": alone_batched, "alone_thread": alone_thread,
            "streamed_inf": streamed(1e9), "streamed_4x": streamed(4 * frames / own)}
seconds = {k: [] for k in variants}
for _ in range(rounds):
    for name, run in variants.items():
        seconds[name].append(run())
print(json.dumps({"video": sys.argv[1], "load": os.getloadavg()[0],
                  **{k: [round(x, 3) for x in v] for k, v in seconds.items()},
                  "median": {k: round(statistics.median(v), 3) for k, v in seconds.items()}}))
