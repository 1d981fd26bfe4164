"""Does an H.264 save slow down while the diffusion decode feeds the GPU from the main thread, and why?

In the A/B graph the conv save encodes on a background thread while the diffusion decode launches its kernels from
the graph's thread; there the save took 1.7 s against 0.6–0.9 s alone. Both threads need the GIL: the decode's
launch loop holds it between kernel launches, the save's threads take it for every frame (conversion, PyAV calls,
muxing). Cases, interleaved round by round at 768×512×121 (noise frames, the real-shape random-weight decoder):
- save alone / decode alone;
- both at once, as in the graph (and with a 0.5 ms GIL switch interval instead of 5 ms);
- both at once with the save in a spawned process (frames in shared memory: no GIL shared with the decode);
- a GIL probe: how long a Python thread waits for the GIL while the decode runs.

    python bench/bench_save_under_decode.py [--rounds 3]
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
import torch.multiprocessing  # noqa: F401 - registers the shared-memory tensor pickling used by the process pool

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder_ratio import seconds  # noqa: E402
from bench_diffusion_vae import RELEASED_METADATA, build  # noqa: E402

from nodes.media import background
from nodes.media import video_io
from nodes.ltx.decode import diffusion_vae as dv


def _child_encode(path: str, frames: torch.Tensor) -> float:
    start = time.perf_counter()
    video_io.write_mp4(path, frames, 24.0)
    return time.perf_counter() - start


def _child_init() -> None:
    background.lower_priority()


class GilProbe:
    """A thread that wakes every 1 ms and records how late it got the GIL back."""

    def __init__(self) -> None:
        self.lates: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            before = time.perf_counter()
            time.sleep(0.001)
            self.lates.append(time.perf_counter() - before - 0.001)

    def __enter__(self) -> "GilProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        lates = sorted(self.lates)
        return {"wakes": len(lates), "late_median_ms": round(1e3 * lates[len(lates) // 2], 3),
                "late_p90_ms": round(1e3 * lates[int(len(lates) * 0.9)], 3), "late_max_ms": round(1e3 * lates[-1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    vae = build(RELEASED_METADATA, torch.device("cuda"), torch.bfloat16)
    latent = torch.randn(1, 128, 16, 16, 24, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    frames = torch.rand(121, 512, 768, 3, generator=torch.Generator().manual_seed(1))
    shared = frames.clone().share_memory_()
    folder = tempfile.mkdtemp()
    counter = iter(range(10**6))
    saves = background.pool("save")
    child = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_init)

    def path() -> str:
        return os.path.join(folder, f"v{next(counter)}.mp4")

    def decode() -> float:
        return seconds(lambda: dv.decode(vae, latent, processor="auto", tiling_mode="off"))

    def save_alone() -> dict:
        start = time.perf_counter()
        saves.submit(video_io.write_mp4, path(), frames, 24.0).result()
        return {"save_s": time.perf_counter() - start}

    def decode_alone() -> dict:
        with GilProbe() as probe:
            took = decode()
        return {"decode_s": took, **probe.summary()}

    def both(switch: float | None = None) -> dict:
        old = sys.getswitchinterval()
        if switch:
            sys.setswitchinterval(switch)
        try:
            start = time.perf_counter()
            job = saves.submit(video_io.write_mp4, path(), frames, 24.0)
            job.add_done_callback(lambda _: ends.append(time.perf_counter()))
            with GilProbe() as probe:
                took = decode()
            job.result()
            return {"decode_s": took, "save_s": ends.pop() - start, **probe.summary()}
        finally:
            sys.setswitchinterval(old)

    def both_subprocess() -> dict:
        start = time.perf_counter()
        job = child.submit(_child_encode, path(), shared)
        job.add_done_callback(lambda _: ends.append(time.perf_counter()))
        with GilProbe() as probe:
            took = decode()
        encode_s = job.result()
        return {"decode_s": took, "save_s": ends.pop() - start, "child_encode_s": encode_s, **probe.summary()}

    ends: list[float] = []
    cases = {"save_alone": save_alone, "decode_alone": decode_alone, "both": both,
             "both_switch_0.5ms": lambda: both(0.0005), "both_save_in_a_process": both_subprocess}
    rows: dict[str, list[dict]] = {}
    with torch.inference_mode():
        child.submit(_child_encode, path(), shared[:9]).result()  # spawn + imports, once
        for round_ in range(args.rounds + 1):  # round 0 warms up (compiles the kernels)
            for name, case in cases.items():
                row = {k: round(v, 4) if isinstance(v, float) else v for k, v in case().items()}
                if round_:
                    rows.setdefault(name, []).append(row)
                print(f"[{'round ' + str(round_) if round_ else 'warm-up'}] {name}: {json.dumps(row)}", flush=True)
    child.shutdown()
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in rows.items()}
    summary = {"cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name(), **medians}
    print("[median] " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
