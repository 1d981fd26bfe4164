"""Guided sampling with the full (dev) transformer (docs/MODEL.md §15.3, §15.4): the reference's dev sigma schedule
and one guided stage with the sampler the reference offers for 2.5 — Euler (its two-stage pipeline's stage 1),
Euler-ancestral (its distilled stage 1) or res_2s (its HQ pipeline). Noise follows `sampling.py`'s conventions.

The dev schedule (the reference's `LTX2Scheduler`, float32): `s = linspace(1, 0, steps + 1)`, each non-zero s
shifted to `e^μ/(e^μ + 1/s − 1)` with `μ = tokens·(2.05 − 0.95)/(4096 − 1024) + 0.95 − 1024·(that slope)`, then
stretched so the last non-zero value is 0.1: `1 − (1 − s)/((1 − s_last)/(1 − 0.1))`. The two-stage pipeline leaves
`tokens` at 4096 (μ = 2.05); its HQ variant passes the stage-1 latent, so `tokens = F'·H'·W'`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..errors import LTX25Error
from . import res2s, sampling
from .guidance import Guidance, make_guided_denoiser
from .guides import Guides, GuidedStage

DEV_STEPS = 30                       # the 2.3-lineage default, which 2.4 and 2.5 inherit
BASE_SHIFT, MAX_SHIFT = 0.95, 2.05
BASE_TOKENS, MAX_TOKENS = 1024, 4096  # the shift is linear in the token count between these anchors
TERMINAL = 0.1
SAMPLERS = ("euler", "euler_ancestral", "res_2s")


def dev_sigmas(steps: int = DEV_STEPS, tokens: int = MAX_TOKENS) -> tuple[float, ...]:
    """The dev schedule: `steps + 1` values from 1.0 down to 0.0 (float32 values, as the reference computes them)."""
    if not 1 <= steps <= 1000:
        raise LTX25Error("steps", "the number of steps", steps, "1 … 1000")
    slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_TOKENS - BASE_TOKENS)
    intercept = BASE_SHIFT - slope * BASE_TOKENS
    shift = math.exp(tokens * slope + intercept)
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    sigmas = torch.where(sigmas != 0, shift / (shift + (1 / sigmas - 1)), 0)
    nonzero = sigmas != 0
    one_minus = 1.0 - sigmas[nonzero]
    sigmas[nonzero] = 1.0 - one_minus / (one_minus[-1] / (1.0 - TERMINAL))
    return tuple(sigmas.to(torch.float32).tolist())


def latent_tokens(video_shape: Sequence[int]) -> int:
    """F'·H'·W' of a `[B, 128, F', H', W']` video latent (the HQ pipeline's token count for the shift)."""
    return math.prod(video_shape[2:])


def sample_guided(model: torch.nn.Module, guidance: Guidance, video: torch.Tensor, audio: torch.Tensor, *, fps: float,
                  seed: int, sigmas: Sequence[float], sampler: str = "euler", stage: int = 1,
                  on_step: sampling.OnStep | None = None, output_device: torch.device | None = None,
                  acceleration: str = "auto", batching: str = "sequential", denoise: Callable | None = None,
                  guides: Guides | GuidedStage | None = None, noise_layout: str = "comfy",
                  on_x0: sampling.OnX0 | None = None,
                  noise_skip: Sequence[int] | None = None,
                  check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One guided stage: video `[B,128,F',H',W']` + audio `[B,8,T,16]` (normalized; stage 1: zeros) at `fps` →
    sampled latents on `output_device` (default: where they came from), of the input shapes. `guides`: as for
    `sampling.sample_distilled`. `denoise(video, audio, σ) → x0` replaces the guided denoiser (tests; it then gets
    the latents with the appended guide frames). `noise_layout` and `on_x0` (each step's guided x0 video, e.g. a
    live preview) and `noise_skip`: as the distilled sampler's (`sampling.sample_stage`); res_2s reports its final
    x0 as one more step. `check()`: before each of the guided denoiser's forwards (it raises to interrupt)."""
    if sampler not in SAMPLERS:
        raise LTX25Error("sampler", "the sampler", repr(sampler), " / ".join(SAMPLERS))
    if stage not in (1, 2):
        raise LTX25Error("stage", "the stage", stage, "1 or 2")
    sampling.check_noise_layout(noise_layout)
    out_device = output_device or video.device
    device = next(model.parameters()).device
    video, audio = video.to(device), audio.to(device)
    held = sampling.guided_stage(guides, video, audio, fps, device)
    denoise_fn = denoise or make_guided_denoiser(model, guidance, fps, acceleration, batching, held, check)
    if sampler == "res_2s":
        video, audio = res2s.sample_res2s(denoise_fn, video, audio, sigmas, seed, stage, on_step, held=held,
                                          noise_layout=noise_layout, on_x0=on_x0, noise_skip=noise_skip)
    else:
        video, audio = sampling.sample_stage(denoise_fn, video, audio, sigmas, sampler, seed, stage, on_step,
                                             noise_layout, on_x0, held=held, noise_skip=noise_skip)
    return video.to(out_device), audio.to(out_device)


def progress_total(sigmas: Sequence[float], sampler: str) -> int:
    """The number of `on_step` reports a stage makes: one per step, and res_2s's final x0."""
    return len(sigmas) - 1 + (1 if sampler == "res_2s" else 0)
