"""H.264 save speed (nodes.media.mp4.save_mp4) on noise-like frames — what random-weight decodes give, x264's worst
case — and on a smooth moving gradient (closer to real video).

    python bench/bench_save_video.py [--frames 121 --size 768x512 --repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodes.media import mp4  # noqa: E402


def smooth(frames: int, height: int, width: int) -> np.ndarray:
    t = np.arange(frames, dtype=np.float32)[:, None, None, None] / frames
    y = np.linspace(0, 1, height, dtype=np.float32)[None, :, None, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, None, :, None]
    c = np.array([0.0, 0.33, 0.66], dtype=np.float32)[None, None, None, :]
    return (0.5 + 0.5 * np.sin(6.28 * (x + y + t + c))).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--size", default="768x512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    contents = {"noise": np.random.default_rng(0).random((args.frames, height, width, 3), dtype=np.float32),
                "smooth": smooth(args.frames, height, width)}
    audio = np.zeros((2, round(args.frames / 24 * 48000)), dtype=np.float32)
    for name, frames in contents.items():
        seconds, cpu_seconds = [], []
        with tempfile.TemporaryDirectory() as folder:
            for _ in range(args.repeats):
                reserved = mp4.reserve(folder, "bench")
                cpu, start = os.times(), time.perf_counter()
                path = mp4.save_mp4(reserved, frames, 24.0, audio)
                seconds.append(time.perf_counter() - start)
                used = os.times()
                cpu_seconds.append(used.user + used.system - cpu.user - cpu.system)
            row = {"content": name, "size": args.size, "frames": args.frames,
                   "seconds": round(statistics.median(seconds), 3),
                   "cpu_seconds": round(statistics.median(cpu_seconds), 2),
                   "cores_busy": round(statistics.median(cpu_seconds) / statistics.median(seconds), 1),
                   "megabytes": round(os.path.getsize(path) / 1e6, 1), "cpus": os.cpu_count()}
        print(f"[save] {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()
