"""Conv video VAE decode: ours (nodes.ltx.decode.conv_vae.decode_conv) vs diffusers' AutoencoderKLLTX2Video.decode on the
same latent and the same weights, at the real LTX-2.5 conv-VAE config with random bf16 weights.

    python bench/bench_conv_vae.py            # CUDA, real shapes (768×512×121, 1920×1088×121, 1920×1088×241)
    python bench/bench_conv_vae.py --smoke    # CPU, tiny config and shapes (checks the script runs)

Reports per shape: median seconds over --repeats runs, peak device memory (absolute and above the weights), conv
FLOPs and the fraction of ~990 TFLOP/s bf16; ours untiled / auto / manual at diffusers' tile sizes, diffusers untiled
(decode only, and decode + the same RGB-to-CPU post-processing ours includes) and diffusers tiled with its own
tiling; the opt-in variants (channels-last, fused norm+SiLU, compiled) with their max abs difference from ours;
and auto under a forced 24 GiB budget at 121 vs 241 frames (the streaming claim: the peak must not grow with length).
Prints one JSON line at the end.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diffusers import AutoencoderKLLTX2Video  # noqa: E402

from nodes.ltx.decode import conv_vae as cv
from nodes.ltx.decode import host_frames
from nodes.ltx.decode.tiling import TilingRequest  # noqa: E402
from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG
from nodes.tools.tiny.conv_vae import TINY_VAE_CONFIG, encoder_kwargs

PEAK_TFLOPS = 990.0
REAL_SHAPES = {"768x512x121": (16, 16, 24), "1920x1088x121": (16, 34, 60)}
LONG_SHAPES = {"1920x1088x121": (16, 34, 60), "1920x1088x241": (31, 34, 60)}
SMOKE_SHAPES = {"128x64x17": (3, 2, 4)}
SMOKE_LONG = {"128x64x17": (3, 2, 4), "128x64x33": (5, 2, 4)}


def autoencoder_kwargs(vae_config: dict) -> dict:
    """AutoencoderKLLTX2Video arguments equal to our decoder (and the encoder the class insists on building)."""
    config = cv.ConvVAEConfig.from_metadata("bench", {"config": {"vae": vae_config}})
    dec, enc = config.decoder_kwargs(), encoder_kwargs(vae_config)
    return dict(in_channels=3, out_channels=3, latent_channels=128, block_out_channels=enc["block_out_channels"],
                down_block_types=enc["down_block_types"], decoder_block_out_channels=dec["block_out_channels"],
                layers_per_block=enc["layers_per_block"], decoder_layers_per_block=dec["layers_per_block"],
                spatio_temporal_scaling=enc["spatio_temporal_scaling"],
                decoder_spatio_temporal_scaling=dec["spatio_temporal_scaling"],
                decoder_inject_noise=dec["inject_noise"], downsample_type=enc["downsample_type"],
                upsample_type=dec["upsample_type"], upsample_residual=dec["upsample_residual"],
                upsample_factor=dec["upsample_factor"], timestep_conditioning=False, patch_size=dec["patch_size"],
                patch_size_t=1, resnet_norm_eps=1e-6, scaling_factor=1.0, encoder_causal=True,
                decoder_causal=dec["is_causal"], encoder_spatial_padding_mode=enc["spatial_padding_mode"],
                decoder_spatial_padding_mode=dec["spatial_padding_mode"], spatial_compression_ratio=32,
                temporal_compression_ratio=8)


def build(vae_config: dict, device: torch.device, dtype: torch.dtype):
    """(diffusers AutoencoderKLLTX2Video, our ConvVideoVAE sharing its decoder and statistics), random weights."""
    with torch.device(device):
        ref = AutoencoderKLLTX2Video(**autoencoder_kwargs(vae_config)).to(dtype).eval().requires_grad_(False)
        ref.latents_mean.normal_(0, 0.1)
        ref.latents_std.uniform_(0.75, 1.25)
    with torch.device("meta"):
        ours = cv.ConvVideoVAE(cv.ConvVAEConfig.from_metadata("bench", {"config": {"vae": vae_config}}))
    ours.decoder = ref.decoder
    ours.register_buffer("latents_mean", ref.latents_mean.clone())
    ours.register_buffer("latents_std", ref.latents_std.clone())
    return ref, ours.eval()


class PixelNormSiLU(torch.nn.Module):
    """diffusers' `PerChannelRMSNorm` (x / √(mean_c x² + eps), in x's dtype, as the reference) followed by SiLU, as
    one module so `torch.compile` emits one kernel instead of four full-size temporaries."""

    def __init__(self, eps: float = 1e-8, compiled: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self._fn = torch.compile(self._norm_silu, dynamic=True) if compiled else self._norm_silu

    def _norm_silu(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x / torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + self.eps))

    def forward(self, x: torch.Tensor, channel_dim: int | None = None) -> torch.Tensor:
        return self._fn(x)


def optimize_decoder(vae: cv.ConvVideoVAE, channels_last: bool = False, fuse_norm_act: bool = False,
                     compile_norm_act: bool = False) -> cv.ConvVideoVAE:
    """The variants measured against the plain decoder, applied in place (the product uses none of them).

    channels_last: NDHWC weights (cuDNN's fast layout for bf16 conv3d; inputs follow the weights).
    fuse_norm_act: every norm→SiLU pair becomes one `PixelNormSiLU` and the separate SiLU an identity. Valid only
    because the 2.5 decoder has no timestep scale/shift or noise between them (the config refuses both)."""
    decoder = vae.decoder
    if fuse_norm_act:
        fused = PixelNormSiLU(1e-8, compiled=compile_norm_act)
        for block in decoder.modules():
            if block.__class__.__name__ == "LTX2VideoResnetBlock3d":
                block.norm1, block.norm2, block.nonlinearity = fused, fused, torch.nn.Identity()
        decoder.norm_out, decoder.conv_act = fused, torch.nn.Identity()
    if channels_last:
        decoder.to(memory_format=torch.channels_last_3d)
    return vae


def conv_flops(module: torch.nn.Module, run) -> int:
    """FLOPs of every Conv3d in one call of `run` (2 · output elements · input channels · kernel volume)."""
    total = [0]

    def hook(m, _args, out):
        total[0] += 2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1] * \
            m.kernel_size[2]

    hooks = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, torch.nn.Conv3d)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return total[0]


def measure(run, device: torch.device, repeats: int) -> dict:
    """Median seconds of `repeats` calls after one warm-up, and the peak memory of the last call."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    oom = False
    try:
        run()
    except torch.cuda.OutOfMemoryError:
        oom = True
    if oom:  # outside the except: the exception keeps the failed allocations alive
        torch.cuda.empty_cache()
        return {"oom": True}
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return {"seconds": statistics.median(times), "peak_gib": peak / 2**30, "activation_peak_gib": (peak - base) / 2**30}


def to_cpu_frames(video: torch.Tensor) -> torch.Tensor:
    """diffusers' [B, 3, F, H, W] → the IMAGE contract ours returns: float [B·F, H, W, 3] in [0, 1] on the CPU."""
    return ((video.float() + 1) / 2).clamp_(0, 1).permute(0, 2, 3, 4, 1).flatten(0, 1).cpu()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config and shapes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--no-variants", action="store_true", help="skip all opt-in variants")
    parser.add_argument("--shapes", default="", help="comma-separated subset of the shape labels")
    parser.add_argument("--skip-long", action="store_true", help="skip the 121 vs 241 frames streaming case")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    vae_config = TINY_VAE_CONFIG if args.smoke else SHIPPED_CONV_VAE_CONFIG
    shapes, long_shapes = (SMOKE_SHAPES, SMOKE_LONG) if args.smoke else (REAL_SHAPES, LONG_SHAPES)
    repeats = 1 if args.smoke else args.repeats
    if args.shapes:
        shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
    if args.skip_long:
        long_shapes = {}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    ref, ours = build(vae_config, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in ours.decoder.parameters())
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "dtype": str(dtype), "decoder_weights_gib": weights / 2**30,
                     "shapes": {}}
    # diffusers' own tiling defaults (512 px tiles at stride 448, 16 frames at stride 8), and ours at the same sizes
    same_as_diffusers = TilingRequest("manual", tile_frames=16, tile_pixels=512, overlap_frames=8, overlap_pixels=64)

    for name, (f, h, w) in shapes.items():
        z = torch.randn(1, 128, f, h, w, device=device, dtype=torch.float32)
        raw = (z * ours.latents_std.float().view(1, -1, 1, 1, 1) + ours.latents_mean.float().view(1, -1, 1, 1, 1))
        raw = raw.to(dtype)
        row: dict = {}
        with torch.inference_mode():
            flops = conv_flops(ours.decoder, lambda: ours.decoder(raw))
            row["tflop"] = flops / 1e12
            row["estimate_untiled_gib"] = cv.decode_plan(ours, tuple(z.shape), TilingRequest("off"),
                                                         None).estimate_bytes / 2**30
            ref.disable_tiling()
            row["diffusers_untiled"] = measure(lambda: ref.decode(raw), device, repeats)
            row["diffusers_untiled_to_cpu"] = measure(lambda: to_cpu_frames(ref.decode(raw).sample), device, repeats)
            row["ours_off"] = measure(lambda: cv.decode_conv(ours, z, TilingRequest("off")), device, repeats)
            row["ours_auto"] = measure(lambda: cv.decode_conv(ours, z, TilingRequest("auto")), device, repeats)
            ref.enable_tiling()
            ref.use_framewise_decoding = True
            row["diffusers_tiled_own"] = measure(lambda: to_cpu_frames(ref.decode(raw).sample), device, repeats)
            ref.disable_tiling()
            ref.use_framewise_decoding = False
            # tiles of one temporal tile stacked as free memory allows (cv.tile_batch), then as many as fit in
            # diffusers' own activation peak, then one at a time (a budget of just the plan's estimate)
            row["ours_manual_diffusers_sizes"] = measure(lambda: cv.decode_conv(ours, z, same_as_diffusers), device,
                                                         repeats)
            budgets = {"within_diffusers_peak": int(row["diffusers_tiled_own"].get("activation_peak_gib", 0) * 2**30),
                       "one_at_a_time": cv.decode_plan(ours, tuple(z.shape), same_as_diffusers, None).estimate_bytes}
            for label, budget in budgets.items():
                _, stats = cv.decode_conv(ours, z, same_as_diffusers, free_memory=budget)
                row[f"ours_manual_diffusers_sizes_{label}"] = {
                    **measure(lambda: cv.decode_conv(ours, z, same_as_diffusers, free_memory=budget), device,
                              repeats),
                    "tile_batch": stats.extra["tile_batch"]}
            streamed, stats = cv.decode_conv(ours, z, same_as_diffusers)
            row["ours_manual_diffusers_sizes"]["tile_batch"] = stats.extra["tile_batch"]
            # the same decode with plain blocking copies to host memory (the decode's copier swapped for the bench
            # only): time, and that the frames are identical
            with mock.patch.object(cv, "host_copier", functools.partial(host_frames.host_copier, staged=False)):
                blocking, _ = cv.decode_conv(ours, z, same_as_diffusers)
                row["ours_manual_diffusers_sizes_blocking_copy"] = {
                    **measure(lambda: cv.decode_conv(ours, z, same_as_diffusers), device, repeats),
                    "max_abs_diff_vs_streamed": float((blocking - streamed).abs().max())}
                row["ours_off_blocking_copy"] = measure(lambda: cv.decode_conv(ours, z, TilingRequest("off")), device,
                                                        repeats)
            del streamed, blocking
            _, stats = cv.decode_conv(ours, z, TilingRequest("auto"))
            row["ours_auto_plan"] = {"tiles": stats.tile_count, "plan": stats.extra["plan"]}
            baseline, _ = cv.decode_conv(ours, z, TilingRequest("off"))
            variants = {} if args.no_variants else {
                "channels_last": dict(channels_last=True), "fused_norm_silu": dict(fuse_norm_act=True),
                "channels_last_fused": dict(channels_last=True, fuse_norm_act=True)}
            if device.type == "cuda" and not args.no_compile and not args.no_variants:
                variants["channels_last_fused_compiled"] = dict(channels_last=True, fuse_norm_act=True,
                                                                compile_norm_act=True)
            for label, options in variants.items():
                fast = optimize_decoder(copy.deepcopy(ours), **options)
                start = time.perf_counter()
                frames, _ = cv.decode_conv(fast, z, TilingRequest("off"))
                row[f"ours_{label}"] = {**measure(lambda: cv.decode_conv(fast, z, TilingRequest("off")), device,
                                                  repeats),
                                        "first_call_s": time.perf_counter() - start,
                                        "max_abs_diff": float((frames - baseline).abs().max())}
                del fast
        for key, value in row.items():
            if isinstance(value, dict) and "seconds" in value:
                value["tflops_per_s"] = flops / 1e12 / value["seconds"]
                value["fraction_of_peak"] = flops / 1e12 / value["seconds"] / PEAK_TFLOPS
        base = row["diffusers_untiled_to_cpu"].get("seconds")
        if base:
            row["ours_off_vs_diffusers_to_cpu"] = row["ours_off"].get("seconds", float("nan")) / base
        results["shapes"][name] = row
        print(json.dumps({name: row}), file=sys.stderr, flush=True)

    budget = 24 * 2**30 if device.type == "cuda" else 2 * 2**20
    streaming = {}
    for name, (f, h, w) in long_shapes.items():
        z = torch.randn(1, 128, f, h, w, device=device)
        with torch.inference_mode():
            _, stats = cv.decode_conv(ours, z, TilingRequest("auto"), free_memory=budget)
            streaming[name] = {**measure(lambda: cv.decode_conv(ours, z, TilingRequest("auto"), free_memory=budget),
                                         device, 1), "tiles": stats.tile_count, "estimate_gib":
                               stats.extra["estimate_bytes"] / 2**30}
    peaks = [v.get("peak_gib", 0) for v in streaming.values()]
    if len(peaks) == 2:
        streaming["long_over_short_peak"] = peaks[1] / peaks[0] if peaks[0] else None
    results["auto_forced_budget_gib"] = budget / 2**30
    results["streaming"] = streaming
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
