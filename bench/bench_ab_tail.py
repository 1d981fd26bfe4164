"""The A/B graph's CPU tail without the models: what follows the GPU work, under each save policy.

In the A/B graph (bench/bench_ab_graph.py) the conv save starts when the conv decode ends, the diffusion decode then
holds the event loop for about a second, and after it the compare runs and the side-by-side save starts; the run
ends when the last encode does. Here the decodes are replaced by noise frames (what random weights decode to) and
the diffusion decode by a 1 s wait, and the tail — compare + the three encodes — is timed from the diffusion
decode's end, per policy (patched for the bench only): the pack's defaults (encodes in helper processes); the
encodes on threads of this process (as before `encoder_process`); the viewer's frames at the saves' priority (not
on idle cores only); the encodes one at a time; the compare's uploads from pageable memory (as before `_upload`);
its canvas in pinned memory (reused, no page faults). The policies on x264's segments and the encodes' priority
timed in the fifth run are gone: those patches do not reach the helper processes.

    python bench/bench_ab_tail.py [--repeats 3]
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
from nodes.comfy import bridge
from nodes.comfy import output
from nodes.comfy.compare import LTX25DecoderCompare  # noqa: E402
from nodes.media import background
from nodes.media import encoder_process
from nodes.ltx.decode import compare as image_compare
from nodes.media import video_io
from nodes.comfy.output import LTX25SaveVideo  # noqa: E402

DIFFUSION_DECODE_S = 1.0


async def tail(a: torch.Tensor, b: torch.Tensor, ends: dict) -> dict:
    loop = asyncio.get_running_loop()
    conv = asyncio.ensure_future(LTX25SaveVideo().save(a, 24.0, "conv"))
    await asyncio.sleep(0)
    time.sleep(DIFFUSION_DECODE_S)  # the diffusion decode holds the loop (and feeds the GPU from this thread)
    start = time.perf_counter()
    diffusion = asyncio.ensure_future(LTX25SaveVideo().save(b, 24.0, "diffusion"))
    await asyncio.sleep(0)
    canvas, report = LTX25DecoderCompare().compare(a, b, "conv VAE", "diffusion VAE", "side_by_side", False)["result"]
    compare_end = time.perf_counter()
    side = asyncio.ensure_future(LTX25SaveVideo().save(canvas, 24.0, "side", metadata=report))
    await asyncio.gather(conv, diffusion, side)
    end = time.perf_counter()
    del loop
    return {"compare_s": round(compare_end - start, 3), "tail_s": round(end - start, 3),
            **{f"{k}_ends_s": round(v - start, 3) for k, v in ends.items()}}


class _PinnedEmpty:
    """`torch` for image_compare, whose `empty` (the canvas) comes from the pinned cache: no page faults."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, device=None, **kw):  # the canvas is made on the host
        return torch.empty(*shape, **kw, pin_memory=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--policies", default="", help="comma-separated subset (default: all)")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    a, b = (torch.rand(args.frames, 512, 768, 3, generator=g) for _ in range(2))
    ends: dict = {}
    encode = output._encode

    def timed_encode(path, *rest):
        encode(path, *rest)
        ends[os.path.basename(path).split("_")[0]] = time.perf_counter()

    one_at_a_time = threading.Lock()

    def serial_encode(path, *rest):
        with one_at_a_time:
            timed_encode(path, *rest)

    in_helpers, upload, preview_nice = encoder_process.write_mp4, image_compare._upload, background.PREVIEW_NICE
    make_pool = background.pool

    def busy_cores_pool(*args, **kwargs):  # the previews' pool without SCHED_IDLE
        return make_pool(*args, **{**kwargs, "idle": False})
    policies = {
        "defaults": {},
        "encodes_on_threads_of_this_process": {"write_mp4": video_io.write_mp4},
        "previews_at_the_saves_priority": {"preview_nice": background.NICE, "preview_idle": False},
        "one_encode_at_a_time": {"serial": True},
        "pageable_uploads": {"upload": lambda t, device, dtype: t.to(device, dtype, non_blocking=True)},
        "pinned_canvas": {"torch": _PinnedEmpty()},
    }
    if args.policies:
        policies = {name: policies[name] for name in args.policies.split(",")}
    rows = {}
    with torch.inference_mode(), tempfile.TemporaryDirectory() as folder:
        bridge.set_output_dir(folder)
        for repeat in range(args.repeats + 1):  # the first round warms up
            for name, policy in policies.items():
                encoder_process.write_mp4 = policy.get("write_mp4", in_helpers)
                image_compare._upload = policy.get("upload", upload)
                image_compare.torch = policy.get("torch", torch)
                output._encode = serial_encode if policy.get("serial") else timed_encode
                for stale in background._POOLS.values():
                    stale.shutdown()
                background._POOLS.clear()  # fresh threads at this policy's priority
                background.PREVIEW_NICE = policy.get("preview_nice", preview_nice)
                background.pool = make_pool if policy.get("preview_idle", True) else busy_cores_pool
                ends.clear()
                try:
                    row = asyncio.run(tail(a, b, ends))
                finally:
                    background.PREVIEW_NICE, output._encode = preview_nice, encode
                    encoder_process.write_mp4 = in_helpers
                    background.pool = make_pool
                    image_compare._upload, image_compare.torch = upload, torch
                    image_compare.wait_for_previews()
                if repeat:
                    rows.setdefault(name, []).append(row)
                    print(f"[tail] {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    summary = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rows.items()}
    print(json.dumps({"cpus": os.cpu_count(), "frames": args.frames, "median": summary}))


if __name__ == "__main__":
    main()
