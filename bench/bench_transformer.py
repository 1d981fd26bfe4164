"""LTX-2.5 DiT step time at the real shapes, random bf16 weights, one GPU.

    python bench/bench_transformer.py            # the 22B config on CUDA (weights built on the GPU: no host copy)
    python bench/bench_transformer.py --smoke    # tiny config on the CPU, to check the script

Per stage (stage 1: video [1,128,16,8,12] + audio [1,8,126,16]; stage 2: [1,128,16,16,24] + audio), side by side
in one run on the same weights and inputs:
- `ours`: `nodes.ltx.dit.transformer.denoise` (eager diffusers blocks, cached positions, [B,1] timesteps);
- `diffusers`: a plain `LTX2VideoTransformer3DModel` forward as diffusers' LTX-2 pipeline calls it (its own coords,
  an all-ones text mask, per-sample timesteps) plus the x0 arithmetic;
- `graphed`: the sampler's `cuda_graph` denoiser (`nodes.ltx.dit.accelerated_denoise.make_denoiser`): the whole DiT
  forward captured in one CUDA graph per shape (static buffers; the host no longer issues ~15k kernel launches per
  step);
- `compiled`: its `compile` mode: `torch.compile` on each transformer block (diffusers' regional compilation);
- `compiled_graphed`: its `compile_cuda_graph` mode: both, inside a cuDNN attention backend context. An
  `--attention-backend` set on the model wins over that context (`native` measures the graph without cuDNN).
Reports the median seconds of `--runs` runs, max |x0 − x0_ours_eager| of each variant, FLOPs of one step (torch's
FlopCounterMode) and the fraction of `--peak-tflops` (bf16 dense), peak memory, and the whole 8 + 3 step distilled
sampling (denoiser calls + Euler updates) for every variant. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodes.ltx.dit import transformer as T
from nodes.tools.tiny.transformer import tiny_config_block
from nodes.ltx.dit.accelerated_denoise import make_denoiser  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit.positions import (first_frame_keyframes_mask, patchify_audio, patchify_video,  # noqa: E402
                                 unpatchify_audio, unpatchify_video)

STAGE1_SIGMAS = (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0)  # docs/MODEL.md §7.1
STAGE2_SIGMAS = (0.909375, 0.725, 0.421875, 0.0)
BASELINE_S_PER_STEP = {"stage1": 0.447, "stage2": 0.500}  # measured earlier: plain eager, same shapes
REAL_SHAPES = {"stage1": ((1, 128, 16, 8, 12), (1, 8, 126, 16)), "stage2": ((1, 128, 16, 16, 24), (1, 8, 126, 16))}
SMOKE_SHAPES = {"stage1": ((1, 128, 3, 2, 2), (1, 8, 5, 16)), "stage2": ((1, 128, 3, 4, 4), (1, 8, 5, 16))}
FPS = 24.0


def build(config: T.TransformerConfig, device: torch.device, dtype: torch.dtype) -> T.LTX25Transformer:
    """The module built directly on `device` in `dtype`, small random weights (norm gains 1): no host copy."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = T.LTX25Transformer(config)
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if p.ndim == 1 and "norm" in name else p.normal_(0.0, 0.02, generator=generator)
    return model.eval().requires_grad_(False)


def stage_setup(smoke: bool) -> tuple[torch.device, torch.dtype, T.TransformerConfig, dict]:
    """(device, dtype, config, {stage: (video, audio) shape}) of a per-stage DiT bench: the released config in bf16
    on CUDA at the two stages' real shapes, or (`smoke`) the tiny config in float32 on the CPU, where compiled modes
    use Dynamo's eager backend (the script's check, not Inductor's)."""
    if smoke:
        from nodes.ltx.dit import accelerated_denoise
        accelerated_denoise.COMPILE_OPTIONS = {**accelerated_denoise.COMPILE_OPTIONS, "backend": "eager"}
    block = tiny_config_block() if smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    return (torch.device("cpu" if smoke else "cuda"), torch.float32 if smoke else torch.bfloat16, config,
            SMOKE_SHAPES if smoke else REAL_SHAPES)


def random_inputs(config: T.TransformerConfig, shapes: dict, device: torch.device,
                  dtype: torch.dtype) -> tuple[Conditioning, dict]:
    """Seed-1 random text features (1024 tokens a stream) and {stage: (video, audio) latents} of `shapes`."""
    g = torch.Generator(device).manual_seed(1)
    cond = Conditioning(torch.randn(1, 1024, config.cross_attention_dim, generator=g, device=device).to(dtype),
                        torch.randn(1, 1024, config.audio_cross_attention_dim, generator=g, device=device).to(dtype))
    inputs = {stage: (torch.randn(v, generator=g, device=device), torch.randn(a, generator=g, device=device))
              for stage, (v, a) in shapes.items()}
    return cond, inputs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device: torch.device, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plain_diffusers(model: T.LTX25Transformer, cond: Conditioning, fps: float):
    """x0 through a bare `LTX2VideoTransformer3DModel` forward, called the way diffusers' LTX-2 pipeline does."""
    dit = model.dit

    def denoise(video, audio, sigma):
        b, _, f, h, w = video.shape
        dtype, t = dit.proj_in.weight.dtype, torch.full((b,), sigma * 1000.0, device=video.device)
        v, a = dit(hidden_states=patchify_video(video).to(dtype), audio_hidden_states=patchify_audio(audio).to(dtype),
                   encoder_hidden_states=cond.video, audio_encoder_hidden_states=cond.audio, timestep=t, sigma=t,
                   encoder_attention_mask=torch.ones(b, cond.video.shape[1], device=video.device),
                   audio_encoder_attention_mask=torch.ones(b, cond.audio.shape[1], device=video.device),
                   num_frames=f, height=h, width=w, fps=fps, audio_num_frames=audio.shape[2],
                   video_keyframes_mask=first_frame_keyframes_mask(b, f, h, w, video.device),
                   use_cross_timestep=True, return_dict=False)
        return (video.float() - unpatchify_video(v, video.shape).float() * sigma,
                audio.float() - unpatchify_audio(a, audio.shape).float() * sigma)
    return denoise


def step_flops(model: T.LTX25Transformer, video, audio, cond: Conditioning) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        T.denoise(model, video, audio, 0.5, cond, FPS)
    return int(counter.get_total_flops())


def distilled_sampling(denoise, shapes: dict, device: torch.device) -> float:
    """Seconds for 8 stage-1 + 3 stage-2 steps (Euler updates, no noise draws: the DiT is the cost)."""
    g = torch.Generator(device).manual_seed(0)
    sync(device)
    start = time.perf_counter()
    for stage, sigmas in (("stage1", STAGE1_SIGMAS), ("stage2", STAGE2_SIGMAS)):
        video_shape, audio_shape = shapes[stage]
        video = torch.randn(video_shape, generator=g, device=device) * sigmas[0]
        audio = torch.randn(audio_shape, generator=g, device=device) * sigmas[0]
        for sigma, sigma_next in zip(sigmas, sigmas[1:]):
            x0_video, x0_audio = denoise(video, audio, sigma)
            video = video + (video - x0_video) / sigma * (sigma_next - sigma)
            audio = audio + (audio - x0_audio) / sigma * (sigma_next - sigma)
    sync(device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", default="ours,diffusers,graphed,compiled,compiled_graphed")
    parser.add_argument("--peak-tflops", type=float, default=990.0, help="bf16 dense peak of the GPU")
    parser.add_argument("--attention-backend", default=None, help="diffusers attention backend, e.g. _native_cudnn")
    args = parser.parse_args(argv)

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    block = tiny_config_block() if args.smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    shapes = SMOKE_SHAPES if args.smoke else REAL_SHAPES
    variants = ["ours"] + [v for v in args.variants.split(",") if v != "ours"]  # ours: the reference of the diffs
    import diffusers
    result = {"bench": "transformer", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "diffusers": diffusers.__version__, "dtype": str(dtype).split(".")[-1],
              "config": "tiny" if args.smoke else f"ltx-2.5 22B ({config.num_layers} layers, "
              f"{config.heads * config.head_dim}/{config.audio_heads * config.audio_head_dim} wide)",
              "runs": args.runs, "baseline_s_per_step": BASELINE_S_PER_STEP, "errors": {}}

    start = time.perf_counter()
    model = build(config, device, dtype)
    if args.attention_backend:
        model.dit.set_attention_backend(args.attention_backend)
    result["build_s"] = round(time.perf_counter() - start, 2)
    result["weights_gb"] = round(sum(p.numel() * p.element_size() for p in model.dit.parameters()) / 1e9, 3)
    cond, inputs = random_inputs(config, shapes, device, dtype)
    ours = lambda video, audio, sigma: T.denoise(model, video, audio, sigma, cond, FPS)  # noqa: E731
    denoisers = {"ours": ours, "diffusers": plain_diffusers(model, cond, FPS)}
    if device.type == "cuda":
        denoisers["graphed"] = make_denoiser(model, cond, FPS, "cuda_graph")
    stats = {stage: {"video": list(shapes[stage][0]), "audio": list(shapes[stage][1])} for stage in shapes}
    reference, sampling = {}, {}
    result["sampling_8_plus_3_s"] = sampling  # per variant, measured right after its steps

    def measure(name: str, denoise) -> None:
        for stage, (video, audio) in inputs.items():
            try:
                with torch.inference_mode():
                    x0 = denoise(video, audio, 0.725)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    seconds = median_seconds(lambda: denoise(video, audio, 0.725), device, args.runs, args.warmup)
                entry = stats[stage]
                entry[f"{name}_s"] = round(seconds, 4)
                if device.type == "cuda":
                    entry[f"{name}_peak_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
                if name == "ours":
                    reference[stage] = x0
                else:
                    entry[f"{name}_max_abs_vs_ours"] = max((a - b).abs().max().item()
                                                           for a, b in zip(x0, reference[stage]))
            except Exception as e:  # a variant that fails is reported, the others still run
                result["errors"][f"{name}/{stage}"] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
        try:
            with torch.inference_mode():
                sampling[name] = round(distilled_sampling(denoise, shapes, device), 3)
        except Exception as e:
            result["errors"][f"{name}/sampling"] = f"{type(e).__name__}: {e}"

    flops = {}
    with torch.inference_mode():  # counted on the eager model, before any compilation
        for stage, (video, audio) in inputs.items():
            try:
                flops[stage] = step_flops(model, video, audio, cond)
            except Exception as e:
                result["errors"][f"flops/{stage}"] = f"{type(e).__name__}: {e}"
    for name in ("ours", "diffusers", "graphed"):
        if name in variants and name in denoisers:
            measure(name, denoisers[name])
    if {"compiled", "compiled_graphed"} & set(variants):
        try:
            compiled = make_denoiser(model, cond, FPS, "compile")
            start = time.perf_counter()
            with torch.inference_mode():  # first calls compile; report that time apart from the steady state
                for video, audio in inputs.values():
                    compiled(video, audio, 0.725)
            result["compile_s"] = round(time.perf_counter() - start, 1)
            denoisers["compiled"] = compiled
            if device.type == "cuda":
                denoisers["compiled_graphed"] = make_denoiser(model, cond, FPS, "compile_cuda_graph")
            for name in ("compiled", "compiled_graphed"):
                if name in variants and name in denoisers:
                    measure(name, denoisers[name])
        except Exception as e:
            result["errors"]["compile"] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)

    with torch.inference_mode():
        for stage, count in flops.items():
            stats[stage]["gflop_per_step"] = round(count / 1e9, 3)
            for key in [k for k in stats[stage] if k.endswith("_s")]:
                stats[stage][key[:-2] + "_fraction_of_peak"] = round(
                    count / stats[stage][key] / (args.peak_tflops * 1e12), 4)
        result.update(stats)
    if device.type == "cuda":
        result["peak_memory_gb"] = max([v for entry in stats.values() for k, v in entry.items()
                                        if k.endswith("_peak_gb")], default=None)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
