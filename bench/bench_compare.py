"""The decoder A/B compare node (nodes.comfy.compare.LTX25DecoderCompare) at a real shape, node and parts: the per-frame
PSNR/SSIM on the compute device, the side-by-side canvas, the preview PNGs (written in the background after the
node returns) — alone and while two H.264 saves run beside it (as in the A/B graph, where the conv and diffusion
saves are still encoding when the compare starts), with the saves on threads of this process and in two other
processes.

    python bench/bench_compare.py [--frames 121 --size 768x512 --repeats 3]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.multiprocessing  # noqa: F401 - shared-memory tensors pickle by handle to the processes

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodes.comfy import bridge
from nodes.comfy.compare import LTX25DecoderCompare  # noqa: E402
from nodes.media import background
from nodes.ltx.decode import compare as image_compare
from nodes.media import video_io


def timed(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return round(statistics.median(seconds), 3)


def _encode_in_a_process(path: str, frames: torch.Tensor) -> None:
    video_io.write_mp4(path, frames, 24.0)


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
        picks = image_compare.preview_frame_indices(args.frames)
        parts = {
            "metrics": lambda: image_compare.psnr_and_ssim_per_frame(a, b, device),
            "canvas": lambda: image_compare.side_by_side(a, b, "conv VAE", "diffusion VAE", "side_by_side"),
            "previews": lambda: (image_compare.write_preview_frames(a, folder, "p", picks),
                                 image_compare.wait_for_previews()),
            "node": lambda: node.compare(a, b, "conv VAE", "diffusion VAE", "side_by_side", False),
        }
        row = {"device": str(device), "cpus": os.cpu_count(), "frames": args.frames, "size": args.size}
        for name, fn in parts.items():
            fn()  # warm-up (CUDA context, kernels, allocator)
            row[f"{name}_s"] = timed(fn, args.repeats)
            print(f"[compare] {name}: {row[f'{name}_s']} s", file=sys.stderr, flush=True)

        def encode(frames: torch.Tensor, path: str) -> None:
            with torch.inference_mode():
                video_io.write_mp4(path, frames, 24.0)

        loaded = []
        for _ in range(args.repeats):
            encoders = [threading.Thread(target=encode, args=(x, os.path.join(folder, f"{i}.mp4")))
                        for i, x in enumerate((a, b))]
            for thread in encoders:
                thread.start()
            time.sleep(0.2)  # the saves are under way when the compare starts
            loaded.append(timed(parts["node"], 1))
            for thread in encoders:
                thread.join()
        row["node_beside_two_saves_s"] = round(statistics.median(loaded), 3)
        # the same with the saves in another process (frames in shared memory): no GIL shared with the compare
        shared = [x.clone().share_memory_() for x in (a, b)]
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=background.lower_priority) as processes:
            list(processes.map(_encode_in_a_process, [os.path.join(folder, "w.mp4")] * 2, [x[:9] for x in shared]))
            loaded = []
            for _ in range(args.repeats):
                jobs = [processes.submit(_encode_in_a_process, os.path.join(folder, f"p{i}.mp4"), x)
                        for i, x in enumerate(shared)]
                time.sleep(0.2)
                loaded.append(timed(parts["node"], 1))
                for job in jobs:
                    job.result()
        row["node_beside_two_saves_in_processes_s"] = round(statistics.median(loaded), 3)
        image_compare.wait_for_previews()  # the node's viewer frames, still being written into `folder`
    print(json.dumps(row))


if __name__ == "__main__":
    main()
