"""The decoder A/B compare node (nodes.comfy.compare.LTX25DecoderCompare) at a real shape, node and parts: the per-frame
PSNR/SSIM on the compute device, the side-by-side canvas, the preview PNGs (written in the background after the
node returns) — alone and while two H.264 saves encode on threads beside it (as in the A/B graph, where the conv and
diffusion saves are still encoding when the compare starts).

    python bench/bench_compare.py [--frames 121 --size 768x512 --repeats 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodes.comfy import bridge  # noqa: E402
from nodes.comfy import previews  # noqa: E402
from nodes.comfy.compare import LTX25DecoderCompare  # noqa: E402
from nodes.ltx.decode import compare as image_compare  # noqa: E402
from nodes.media import mp4  # noqa: E402


def timed(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return round(statistics.median(seconds), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--size", default="768x512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    g = torch.Generator().manual_seed(0)
    a, b = (torch.rand(args.frames, height, width, 3, generator=g) for _ in range(2))
    device = bridge.compute_device()
    node = LTX25DecoderCompare()
    with torch.inference_mode(), tempfile.TemporaryDirectory() as folder:
        bridge.set_output_dir(folder)
        picks = previews.preview_frame_indices(args.frames)
        parts = {
            "metrics": lambda: image_compare.psnr_and_ssim_per_frame(a, b, device),
            "canvas": lambda: image_compare.side_by_side(a, b, "conv VAE", "diffusion VAE", "side_by_side"),
            "previews": lambda: (previews.write_preview_frames(a, folder, "p", picks), previews.wait_for_previews()),
            "node": lambda: asyncio.run(node.compare(a, b, "conv VAE", "diffusion VAE", "side_by_side", False)),
        }
        row = {"device": str(device), "cpus": os.cpu_count(), "frames": args.frames, "size": args.size}
        for name, fn in parts.items():
            fn()  # warm-up (CUDA context, kernels, allocator)
            row[f"{name}_s"] = timed(fn, args.repeats)
            print(f"[compare] {name}: {row[f'{name}_s']} s", file=sys.stderr, flush=True)

        def encode(frames: torch.Tensor) -> None:
            mp4.save_mp4(mp4.reserve(folder, "save"), frames.numpy(), 24.0)

        loaded = []
        for _ in range(args.repeats):
            encoders = [threading.Thread(target=encode, args=(x,)) for x in (a, b)]
            for thread in encoders:
                thread.start()
            time.sleep(0.2)  # the saves are under way when the compare starts
            loaded.append(timed(parts["node"], 1))
            for thread in encoders:
                thread.join()
        row["node_beside_two_saves_s"] = round(statistics.median(loaded), 3)
        previews.wait_for_previews()  # the node's viewer frames, still being written into `folder`
    print(json.dumps(row))


if __name__ == "__main__":
    main()
