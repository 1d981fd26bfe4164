"""Where the diffusion-VAE decode spends its time, and what each neighborhood-attention variant costs per call.

    python bench/profile_diffusion_vae.py            # CUDA: 768×512×121, released config, random bf16 weights
    python bench/profile_diffusion_vae.py --smoke    # CPU, the tiny config (checks the script runs)

1. One untiled decode with CUDA events around stages 1-3, stage 4 and each stage-5 step, and inside every attention
   call around Q/K/V projection (+norm, RoPE), the window attention, and the output projection, per (grid, heads,
   kernel), for --processor (default auto): how much is attention, how much the rest.
2. A torch.profiler table of one decode (top kernels by device time).
3. Per attention shape seen in 1: seconds per call of each variant — blocked SDPA at several query blocks and
   comfy-kitchen's fused na3d — and the max abs difference from the default.
Writes `profile_diffusion_vae.json` and `profile_table.txt` into $OUT (or --out-dir).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_diffusion_vae import RELEASED_METADATA, TINY_METADATA, build  # noqa: E402

from nodes.ltx import compat
from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.kernels import na_attention as na


class Clock:
    """CUDA-event (or wall-clock on the CPU) spans, summed per label; read after one synchronize."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[str, object, object]] = []

    @contextlib.contextmanager
    def span(self, label: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            import time
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.spans.append((label, start, end))

    def totals(self) -> dict[str, dict]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, dict] = collections.defaultdict(lambda: {"seconds": 0.0, "calls": 0})
        for label, start, end in self.spans:
            out[label]["seconds"] += start.elapsed_time(end) / 1e3 if self.cuda else end - start
            out[label]["calls"] += 1
        return dict(out)


class TimedProcessor(na.NeighborhoodAttnProcessor):
    """`inner` with its three parts timed per (grid, heads, kernel); records the shapes seen. It takes on the inner
    processor's fused passes, so the decode runs the path the product runs with `inner`."""

    def __init__(self, inner: na.NeighborhoodAttnProcessor, clock: Clock) -> None:
        self.inner, self.clock, self.shapes, self.name = inner, clock, {}, inner.name
        self.fused_projection, self.fused_block = inner.fused_projection, inner.fused_block

    def __call__(self, attn, hidden_states, block_mask=None):
        b, t, h, w, c = hidden_states.shape
        key = f"{(t, h, w)} heads={attn.heads} k={tuple(attn.kernel_size)}"
        self.shapes[key] = ((b, t, h, w, attn.heads, attn.head_dim), tuple(attn.kernel_size))
        with self.clock.span(f"attn.qkv {key}"):
            q, k, v = na.project_qkv(attn, hidden_states, self.fused_projection)
        with self.clock.span(f"attn.na3d {key}"):
            out = self.inner.na3d(q, k, v, tuple(attn.kernel_size))
        with self.clock.span(f"attn.out {key}"):
            return attn.to_out[0](out.reshape(b, t, h, w, c))

    def na3d(self, q, k, v, kernel):
        return self.inner.na3d(q, k, v, kernel)

    def na3d_over_query(self, q, k, v, kernel):
        # the lean blocks (fused_block) call this, not __call__: their projections are timed as part of the blocks
        b, t, h, w, heads, _ = q.shape
        with self.clock.span(f"attn.na3d {(t, h, w)} heads={heads} k={tuple(kernel)}"):
            return self.inner.na3d_over_query(q, k, v, kernel)


def timed_decode(vae, latent, clock: Clock, processor: na.NeighborhoodAttnProcessor) -> dict:
    """One untiled decode with the stages wrapped in spans; returns the per-label totals."""
    decoder = vae.model.decoder
    originals = {name: getattr(decoder, name) for name in ("forward_diffusion_step",)}
    stages, stage_4 = compat.stages_1_to_3_before_last_upsample, compat.stage_4

    def wrap(label, fn):
        def run(*args, **kwargs):
            with clock.span(label):
                return fn(*args, **kwargs)
        return run

    for name, fn in originals.items():
        setattr(decoder, name, wrap(name, fn))
    compat.stages_1_to_3_before_last_upsample = wrap("stages_1_to_3", stages)
    compat.stage_4 = wrap("forward_stage_4", stage_4)
    try:
        with clock.span("decode total"):
            dv.decode(vae, latent, processor=processor, request=TilingRequest("off"))
    finally:
        for name in originals:
            delattr(decoder, name)
        compat.stages_1_to_3_before_last_upsample, compat.stage_4 = stages, stage_4
    return clock.totals()


def time_call(fn, device: torch.device, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        clock = Clock(device)
        with clock.span("x"):
            fn()
        times.append(clock.totals()["x"]["seconds"])
    return statistics.median(times)


def attention_variants(shape, kernel, device, dtype, blocks: list[tuple[int, int, int]]) -> dict:
    """Seconds per call and max abs diff from the default, per variant, on random Q/K/V of `shape`."""
    gen = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(3))
    q = q * shape[-1] ** -0.5
    reference = na.na3d_sdpa(q, k, v, kernel)
    rows = {}

    def record(name, fn):
        try:
            seconds = time_call(fn, device)
            diff = (fn().float() - reference.float()).abs().max().item()
            rows[name] = {"seconds": seconds, "max_abs_diff": diff}
        except Exception as error:  # noqa: BLE001 - a variant that cannot run is reported, not fatal
            rows[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        print(f"[profile] {shape} k={kernel} {name}: {rows[name]}", file=sys.stderr, flush=True)

    for block in [None, *blocks]:
        record(f"sdpa{block or ' default'}", lambda b=block: na.na3d_sdpa(q, k, v, kernel, b))
    if na.comfy_kitchen_backends():
        proc = na.ComfyKitchenNAProcessor()
        record("comfy_kitchen", lambda: proc.na3d(q, k, v, kernel))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--latent", default="16,16,24", help="latent T,H,W (16,16,24 → 768×512×121)")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    parser.add_argument("--skip-profiler", action="store_true")
    parser.add_argument("--skip-variants", action="store_true", help="no per-shape attention variants (part 3)")
    parser.add_argument("--processor", default="auto", help="the processor decoded with (a na_attention name)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    vae = build(TINY_METADATA if args.smoke else RELEASED_METADATA, device, dtype)
    thw = (3, 3, 3) if args.smoke else tuple(int(n) for n in args.latent.split(","))
    latent = torch.randn(1, 128, *thw, device=device, dtype=dtype)
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "latent": thw}

    clock = Clock(device)
    timed = TimedProcessor(na.make_processor(args.processor, device), clock)
    dv.decode(vae, latent, processor=timed.inner, request=TilingRequest("off"))  # warm-up
    results["breakdown"] = timed_decode(vae, latent, clock, timed)
    for label, row in sorted(results["breakdown"].items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"[profile] {row['seconds']:8.4f} s  {row['calls']:4d}×  {label}", file=sys.stderr, flush=True)

    if not args.skip_profiler:
        activities = [torch.profiler.ProfilerActivity.CPU] + \
            ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as prof:
            dv.decode(vae, latent, processor=timed.inner, request=TilingRequest("off"))
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=45, max_name_column_width=90)
        with open(os.path.join(args.out_dir, "profile_table.txt"), "w") as f:
            f.write(table)
        print(table, file=sys.stderr, flush=True)

    blocks = [(1, 1)] if args.smoke else [(4, 8), (8, 16), (16, 16), (4, 4)]
    results["attention"] = {}
    for key, (shape, kernel) in ({} if args.skip_variants else timed.shapes).items():
        results["attention"][key] = attention_variants(shape, kernel, device, dtype, blocks)
        with open(os.path.join(args.out_dir, "profile_diffusion_vae.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
