"""The opt-in FP8 compute mode of the DiT (issue 24) against bf16 on the same weights and inputs: step time per stage
and the error of the velocity, real shapes, random weights, one GPU.

    python bench/bench_fp8_compute.py --out $OUT/bench_fp8_compute.json   # CUDA (about 3 minutes on an H200)
    python bench/bench_fp8_compute.py --smoke --out /tmp/fp8.json          # CPU, tiny config (checks the script)

One bf16 model (bench_transformer.build), then the same model with its blocks' Linears turned into FP8 layers in
place (`quantized_linear.fp8_compute_`: E4M3, one scale per output row; activations per token; attention bf16).
For each: the velocity at stage 1 (video [1,128,16,8,12]) and stage 2 ([1,128,16,16,24]) with audio [1,8,126,16]
at σ = 1.0 and 0.725, eager and `compile_cuda_graph`; the median step time of `compile_cuda_graph` (`--runs`); the
8 + 3 step distilled sampling (Euler, the same noise for both) in seconds and its final latents. Errors of FP8
against bf16, velocity and final latents, video and audio apart: `max_rel` = max|Δ| / max|bf16|, `mean_rel` =
mean|Δ| / mean|bf16|, `rms_rel` = ‖Δ‖ / ‖bf16‖; beside them, the same figures for bf16 compile_cuda_graph against
bf16 eager (the rounding noise of compilation, for scale). Random weights have no outlier channels, so the error with
the released weights can differ: measure it again on them before relying on these figures. Decoded frames are not
compared here (that needs the released decoders to mean anything). Writes JSON to --out (rewritten as it goes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from nodes.ltx.dit import accelerated_denoise as A  # noqa: E402
from nodes.ltx.kernels.quantized_linear import fp8_compute_  # noqa: E402

FPS = 24.0
SIGMAS = (1.0, 0.725)
GIB = 2**30


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    got, want = got.float(), want.float()
    delta = got - want
    return {"max_rel": float(delta.abs().max() / want.abs().max()),
            "mean_rel": float(delta.abs().mean() / want.abs().mean()),
            "rms_rel": float(delta.norm() / want.norm())}


def velocities(denoise, inputs: dict) -> dict:
    """{(stage, σ): (v video, v audio)} float32: v = (latent − x0) / σ, since the denoiser returns x0 = latent − v·σ."""
    out = {}
    with torch.inference_mode():
        for stage, (video, audio) in inputs.items():
            for sigma in SIGMAS:
                x0_video, x0_audio = denoise(video, audio, sigma)
                out[stage, sigma] = ((video.float() - x0_video) / sigma, (audio.float() - x0_audio) / sigma)
    return out


def sampling(denoise_for, shapes: dict, device: torch.device) -> tuple[float, tuple]:
    """(seconds, final (video, audio) of stage 2) of 8 + 3 Euler steps from fixed noise (seed 5)."""
    g = torch.Generator(device).manual_seed(5)
    bt.sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for stage, sigmas in (("stage1", bt.STAGE1_SIGMAS), ("stage2", bt.STAGE2_SIGMAS)):
            video_shape, audio_shape = shapes[stage]
            denoise = denoise_for()
            video = torch.randn(video_shape, generator=g, device=device) * sigmas[0]
            audio = torch.randn(audio_shape, generator=g, device=device) * sigmas[0]
            for sigma, sigma_next in zip(sigmas, sigmas[1:]):
                x0_video, x0_audio = denoise(video, audio, sigma)
                video = video + (video - x0_video) / sigma * (sigma_next - sigma)
                audio = audio + (audio - x0_audio) / sigma * (sigma_next - sigma)
    bt.sync(device)
    return time.perf_counter() - start, (video, audio)


def compare(got: dict, want: dict) -> dict:
    return {f"{stage}_sigma{sigma}": {"video": errors(got[stage, sigma][0], want[stage, sigma][0]),
                                      "audio": errors(got[stage, sigma][1], want[stage, sigma][1])}
            for stage, sigma in want}


def reset_compiled(model: torch.nn.Module) -> None:
    """Forget the compiled blocks and graphs, so the next compiled denoiser compiles the blocks as they are now."""
    A.release(model)
    vars(model).pop("_ltx25_compiled", None)
    for block in model.dit.transformer_blocks:
        block._compiled_call_impl = None
    torch._dynamo.reset()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_fp8_compute.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    device, dtype, config, shapes = bt.stage_setup(args.smoke)
    compiled_mode = "compile" if args.smoke else "compile_cuda_graph"
    result: dict = {"bench": "fp8_compute", "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                    else "cpu", "torch": torch.__version__, "compiled_mode": compiled_mode, "errors": {}}
    if device.type == "cuda":
        result["capability"] = list(torch.cuda.get_device_capability(device))

    def write() -> None:
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)

    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, shapes, device, dtype)
    runs: dict = {}
    try:
        for name in ("bf16", "fp8"):
            if name == "fp8":
                reset_compiled(model)
                result["fp8_layers"] = fp8_compute_(model.dit.transformer_blocks)
            row = runs[name] = {"weights_gib": sum(t.numel() * t.element_size() for t in
                                                   [*model.parameters(), *model.buffers()]) / GIB}
            row["eager_v"] = velocities(A.make_denoiser(model, cond, FPS, "eager"), inputs)
            start = time.perf_counter()
            row["compiled_v"] = velocities(A.make_denoiser(model, cond, FPS, compiled_mode), inputs)  # compiles
            row["first_compiled_s"] = round(time.perf_counter() - start, 2)
            for stage, (video, audio) in inputs.items():
                denoise = A.make_denoiser(model, cond, FPS, compiled_mode)
                with torch.inference_mode():
                    row[f"{stage}_s_per_step"] = round(bt.median_seconds(lambda: denoise(video, audio, 0.725), device,
                                                                         args.runs, warmup=1), 4)
            row["sampling_8_3_s"], row["final"] = sampling(lambda: A.make_denoiser(model, cond, FPS, compiled_mode),
                                                           shapes, device)
            row["sampling_8_3_s"] = round(row["sampling_8_3_s"], 3)
            result[name] = {k: v for k, v in row.items() if k not in ("eager_v", "compiled_v", "final")}
            print(f"[fp8] {name}: {result[name]}", file=sys.stderr, flush=True)
            write()
        bf16, fp8 = runs["bf16"], runs["fp8"]
        result["velocity_error_fp8_vs_bf16"] = {"eager": compare(fp8["eager_v"], bf16["eager_v"]),
                                               "compiled": compare(fp8["compiled_v"], bf16["compiled_v"])}
        result["velocity_error_bf16_compiled_vs_eager"] = compare(bf16["compiled_v"], bf16["eager_v"])
        result["final_latent_error_fp8_vs_bf16"] = {"video": errors(fp8["final"][0], bf16["final"][0]),
                                                    "audio": errors(fp8["final"][1], bf16["final"][1])}
        result["speedup"] = {stage: round(bf16[f"{stage}_s_per_step"] / fp8[f"{stage}_s_per_step"], 3)
                             for stage in shapes}
    except Exception as error:  # what ran is kept; the traceback goes to stderr
        traceback.print_exc()
        result["errors"]["run"] = f"{type(error).__name__}: {error}"
    write()
    print(json.dumps({k: v for k, v in result.items() if k != "velocity_error_fp8_vs_bf16"}))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
