"""H.264 save speed (nodes.media.video_io.write_mp4) on noise-like frames — what random-weight decodes give, x264's worst
case — and on a smooth moving gradient (closer to real video), per x264 threading mode.

    python bench/bench_save_video.py [--frames 121 --size 768x512]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodes.media import mp4_encoder
from nodes.media import video_io


def smooth(frames: int, height: int, width: int) -> torch.Tensor:
    t = torch.arange(frames)[:, None, None, None] / frames
    y = torch.linspace(0, 1, height)[None, :, None, None]
    x = torch.linspace(0, 1, width)[None, None, :, None]
    c = torch.tensor([0.0, 0.33, 0.66])[None, None, None, :]
    return (0.5 + 0.5 * torch.sin(6.28 * (x + y + t + c))).float()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--size", default="768x512")
    parser.add_argument("--segments", default="1", help="comma-separated segment counts to time (write_mp4's "
                        "segments: runs of frames encoded at once by separate x264s)")
    parser.add_argument("--thread-types", default="FRAME", help="comma-separated: SLICE, FRAME")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    contents = {"noise": torch.rand(args.frames, height, width, 3, generator=torch.Generator().manual_seed(0)),
                "smooth": smooth(args.frames, height, width)}
    rows = []
    original = mp4_encoder._THREAD_TYPE
    try:
        for name, frames in contents.items():
            for thread_type in args.thread_types.split(","):
                for segments in (int(n) for n in args.segments.split(",")):
                    mp4_encoder._THREAD_TYPE = thread_type
                    with tempfile.TemporaryDirectory() as folder:
                        path = os.path.join(folder, "x.mp4")
                        cpu, start = os.times(), time.perf_counter()
                        video_io.write_mp4(path, frames, 24.0, segments=segments)
                        seconds, used = time.perf_counter() - start, os.times()
                        cpu_seconds = used.user + used.system - cpu.user - cpu.system
                        rows.append({"content": name, "size": args.size, "thread_type": thread_type,
                                     "segments": segments, "seconds": round(seconds, 3),
                                     "cpu_seconds": round(cpu_seconds, 2), "cores_busy": round(cpu_seconds / seconds, 1),
                                     "megabytes": round(os.path.getsize(path) / 1e6, 1), "cpus": os.cpu_count()})
                    print(f"[save] {json.dumps(rows[-1])}", flush=True)
    finally:
        mp4_encoder._THREAD_TYPE = original


if __name__ == "__main__":
    main()
