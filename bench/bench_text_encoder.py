"""Benchmark the LTX-2.5 prompt encoder at the real shapes: Gemma-4 12B (docs/MODEL.md §3.3) + the V2 projection
(188160 → 4096 / 2048), random bf16 weights built on the GPU (no file I/O), prompts of 1024 tokens, batch 1 and 4.

    python bench/bench_text_encoder.py            # CUDA, real config
    python bench/bench_text_encoder.py --smoke    # CPU, the tiny file's config

Compared in one run on the same weights and inputs:
- ours:  `nodes.ltx.text.encoder.run_encoder` (inference mode, no KV cache, hidden states folded into the
         [B, T, D·L] stack layer by layer and freed as they go);
- plain: the reference's transformers path: `model.model(ids, mask, output_hidden_states=True)` (default KV cache),
         then feature extractor V2 as the reference writes it (stack all 49 states, RMS over D, reshape, where,
         rescale, Linear).
Reports median seconds, peak memory above the weights, memory left allocated after the call (must be 0 for
ours), FLOPs and the fraction of ~990 TFLOP/s bf16; the last line is one JSON object. `--grad-demo` also measures
what the plain path retains with autograd on and trainable parameters (issue #310).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodes.ltx.text import encoder as te
from nodes.tools.tiny.common import TINY_DIMS  # noqa: E402
from nodes.tools.tiny.text_encoder import tiny_gemma_config  # noqa: E402
from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedConfig  # noqa: E402

PEAK_BF16_FLOPS = 990e12
TOKENS = 1024
# Gemma-4 12B text config of the shipped text-encoder file (docs/MODEL.md §3.3); projection widths 4096 / 2048.
REAL_TEXT_CONFIG = dict(
    hidden_size=3840, num_hidden_layers=48, intermediate_size=15360, num_attention_heads=16, head_dim=256,
    global_head_dim=512, num_key_value_heads=8, num_global_key_value_heads=1, attention_k_eq_v=True,
    vocab_size=262144, sliding_window=1024, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
    attention_bias=False, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    num_kv_shared_layers=0, layer_types=["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(48)],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1_000_000.0}})


def build(config: Gemma4UnifiedConfig, video_dim: int, audio_dim: int, device: torch.device,
          dtype: torch.dtype) -> te.TextEncoderModule:
    """The same module the loader builds, with random weights made directly on `device`."""
    with torch.device("meta"):
        module = te.TextEncoderModule(config, video_dim, audio_dim)
    module = module.to_empty(device=device).to(dtype)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if name.endswith("layer_scalar"):
                tensor.uniform_(0.1, 1.0, generator=g)  # real values 0.005–0.93
            elif tensor.ndim == 1 and "norm" in name:
                tensor.fill_(1.0)  # Gemma-4 RMSNorm multiplies by the weight itself
            else:
                tensor.normal_(0.0, 0.02, generator=g)
    te.init_buffers(module)
    return module.to(device).eval().requires_grad_(False)


def plain_encode(module: te.TextEncoderModule, ids: torch.Tensor, mask: torch.Tensor):
    """The reference's path through transformers, for comparison."""
    proj = module.text_embedding_projection
    out = module.gemma(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    encoded = torch.stack(out.hidden_states, dim=-1)  # [B, T, D, L]
    b, t, d, n = encoded.shape
    normed = encoded * torch.rsqrt(torch.mean(encoded ** 2, dim=2, keepdim=True) + 1e-6)
    normed = normed.reshape(b, t, d * n)
    normed = torch.where(mask.bool().unsqueeze(-1), normed, torch.zeros_like(normed))
    video = proj.video_aggregate_embed(normed * math.sqrt(proj.video_aggregate_embed.out_features / d))
    audio = proj.audio_aggregate_embed(normed * math.sqrt(proj.audio_aggregate_embed.out_features / d))
    return video, audio


def flop_count(module: te.TextEncoderModule, batch: int) -> float:
    """Linear FLOPs of every layer + causal attention (QKᵀ and PV) + the two projections."""
    language = module.gemma.language_model
    linear_params = sum(m.weight.numel() for m in language.layers.modules() if isinstance(m, torch.nn.Linear))
    attention = 0.0
    for layer in language.layers:
        attn = layer.self_attn
        heads = attn.o_proj.in_features // attn.head_dim
        attention += 4 * heads * attn.head_dim * TOKENS * (TOKENS + 1) / 2
    proj = module.text_embedding_projection
    projection = 2 * TOKENS * proj.video_aggregate_embed.in_features * (
        proj.video_aggregate_embed.out_features + proj.audio_aggregate_embed.out_features)
    return batch * (2 * TOKENS * linear_params + attention + projection)


def inputs(batch: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """1024 valid tokens per prompt (BOS first), the longest prompt the encoder takes."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, TOKENS), generator=g)
    ids[:, 0] = 2
    return ids.to(device), torch.ones(batch, TOKENS, dtype=torch.int64, device=device)


def timed(fn, runs: int, device: torch.device) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs + 1):  # first run warms up kernels and allocator
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), result


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak_above(device: torch.device, fn) -> tuple[int, object]:
    if device.type != "cuda":
        return 0, fn()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--grad-demo", action="store_true", help="measure the #310 retention of the plain path")
    args = parser.parse_args()
    if args.smoke:
        device, runs = torch.device("cpu"), min(args.runs, 2)
        config = Gemma4UnifiedConfig.from_dict(tiny_gemma_config(vocab_size=460))
        dims = (TINY_DIMS["video_inner"], TINY_DIMS["audio_inner"])
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
            return 2
        device, runs = torch.device("cuda"), args.runs
        config = Gemma4UnifiedConfig(text_config=REAL_TEXT_CONFIG, gemma_version="gemma4-12b-ltx-v1")
        dims = (4096, 2048)
    module = build(config, *dims, device, torch.bfloat16)
    weights = allocated(device)
    vocab = config.text_config.vocab_size
    results = []
    for batch in args.batches:
        ids, mask = inputs(batch, vocab, device)
        before = allocated(device)

        def ours():
            video, audio = te.run_encoder(module, ids, mask)
            return video.to("cpu", copy=True), audio.to("cpu", copy=True)  # what encode_prompts keeps

        def plain():
            with torch.inference_mode():
                video, audio = plain_encode(module, ids, mask)
                return video.cpu(), audio.cpu()

        ours_s, (video, audio) = timed(ours, runs, device)
        ours_left = allocated(device) - before
        plain_s, (pvideo, paudio) = timed(plain, runs, device)
        ours_peak, _ = peak_above(device, ours)
        plain_peak, _ = peak_above(device, plain)
        flops = flop_count(module, batch)
        diff = max((video.float() - pvideo.float()).abs().max().item() / pvideo.float().abs().max().item(),
                   (audio.float() - paudio.float()).abs().max().item() / paudio.float().abs().max().item())
        results.append(dict(batch=batch, ours_s=round(ours_s, 4), plain_s=round(plain_s, 4),
                            speedup=round(plain_s / ours_s, 3), ours_peak_gib=round(ours_peak / 2**30, 3),
                            plain_peak_gib=round(plain_peak / 2**30, 3), ours_left_bytes=ours_left,
                            tflop=round(flops / 1e12, 2), ours_tflops=round(flops / ours_s / 1e12, 1),
                            frac_of_peak=round(flops / ours_s / PEAK_BF16_FLOPS, 3), max_rel_diff=diff))
        print(f"batch {batch}: ours {ours_s:.3f}s (peak +{ours_peak / 2**30:.2f} GiB, left {ours_left} B) | "
              f"plain {plain_s:.3f}s (peak +{plain_peak / 2**30:.2f} GiB) | {flops / 1e12:.1f} TFLOP, "
              f"{flops / ours_s / PEAK_BF16_FLOPS:.1%} of bf16 peak | rel diff {diff:.2e}", file=sys.stderr)
    report = dict(bench="text_encoder", device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  torch=torch.__version__, smoke=args.smoke, weights_gib=round(weights / 2**30, 2),
                  runs=runs, tokens=TOKENS, results=results)
    if args.grad_demo and device.type == "cuda":
        module.requires_grad_(True)  # the reference's load keeps requires_grad=True
        ids, mask = inputs(1, vocab, device)
        before = allocated(device)
        kept = plain_encode(module, ids, mask)  # autograd on, no inference mode: the graph holds activations
        report["plain_grad_retained_gib"] = round((allocated(device) - before) / 2**30, 3)
        del kept
        module.requires_grad_(False)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
