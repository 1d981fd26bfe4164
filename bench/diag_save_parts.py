"""Where a save's time goes: the frame conversion (float RGB → uint8 → yuv420p), x264 alone on converted frames,
the whole `save_mp4`, one clip alone and the A/B graph's three at once (two W×H clips and the 2W×H side by side, on
threads as the graph's async saves run), on noise (random-weight decodes) and a smooth gradient.

    python bench/diag_save_parts.py [--frames 121 --size 768x512] [--contents noise,smooth] [--converters 1,3]
                                    [--out FILE.json]

`--converters` runs the whole saves once per count of conversion threads (`mp4.CONVERTERS`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_save_video import smooth  # noqa: E402
from nodes.media import mp4  # noqa: E402


def timed(work) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) of `work()`."""
    cpu, start = os.times(), time.perf_counter()
    work()
    used = os.times()
    return time.perf_counter() - start, used.user + used.system - cpu.user - cpu.system


def convert_all(frames: np.ndarray) -> list:
    return [mp4._picture(frames, index) for index in range(frames.shape[0])]


def x264_only(path: str, pictures: list, width: int, height: int, options: dict) -> None:
    with av.open(path, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "17", "preset": mp4.X264_PRESET, **options}
        stream.codec_context.thread_type = "FRAME"
        for picture in pictures:
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--size", default="768x512")
    parser.add_argument("--contents", default="noise,smooth")
    parser.add_argument("--converters", default=str(mp4.CONVERTERS))
    parser.add_argument("--out")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    rows = []

    def report(**row) -> None:
        row = {key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()}
        rows.append(row)
        print(f"[save-parts] {json.dumps(row)}", flush=True)

    audio = np.zeros((2, round(args.frames / 24 * 48000)), dtype=np.float32)
    for content in args.contents.split(","):
        single = (np.random.default_rng(0).random((args.frames, height, width, 3), dtype=np.float32)
                  if content == "noise" else smooth(args.frames, height, width))
        wide = np.concatenate([single, single[:, :, ::-1]], axis=2)
        with tempfile.TemporaryDirectory() as folder:
            for name, frames in (("single", single), ("side_by_side", wide)):
                pictures = []
                wall, cpu = timed(lambda: pictures.extend(convert_all(frames)))
                report(content=content, clip=name, part="convert", seconds=wall, cpu_seconds=cpu)
                for label, options in (("veryfast", {}), ("veryfast_cavlc", {"x264-params": "cabac=0"})):
                    path = os.path.join(folder, f"{name}_{label}.mp4")
                    wall, cpu = timed(lambda: x264_only(path, pictures, frames.shape[2], frames.shape[1], options))
                    report(content=content, clip=name, part=f"x264_{label}", seconds=wall, cpu_seconds=cpu,
                           megabytes=os.path.getsize(path) / 1e6)
                for converters in (int(n) for n in args.converters.split(",")):
                    mp4.CONVERTERS = converters
                    wall, cpu = timed(lambda: mp4.save_mp4(mp4.reserve(folder, name), frames, 24.0, audio))
                    report(content=content, clip=name, part="save_mp4", converters=converters, seconds=wall,
                           cpu_seconds=cpu)

            ends: dict[str, float] = {}

            def save(label: str, frames: np.ndarray, start: float) -> None:
                mp4.save_mp4(mp4.reserve(folder, label), frames, 24.0, audio)
                ends[label] = time.perf_counter() - start

            def three() -> None:
                ends.clear()
                start = time.perf_counter()
                with ThreadPoolExecutor(3) as pool:
                    saves = [pool.submit(save, label, frames, start)
                             for label, frames in (("conv", single), ("diffusion", single), ("compare", wide))]
                for done in saves:
                    done.result()  # a failed save fails the diag rather than being timed

            for converters in (int(n) for n in args.converters.split(",")):
                mp4.CONVERTERS = converters
                wall, cpu = timed(three)
                report(content=content, clip="three_at_once", part="save_mp4", converters=converters, seconds=wall,
                       cpu_seconds=cpu, ends={key: round(value, 3) for key, value in ends.items()})
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"frames": args.frames, "size": args.size, "cpus": os.cpu_count(), "rows": rows}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
