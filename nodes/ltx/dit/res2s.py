"""The res_2s sampler of the reference's HQ two-stage pipeline (docs/MODEL.md §15.4): a two-stage exponential
Runge-Kutta step (the denoiser at σ and at the midpoint √(σ·σ_next)) with SDE noise injected at the midpoint and
after each step, on the joint audio+video latents. Two denoiser calls per step, plus one final call.

All arithmetic in float64, latents handed to the denoiser and returned in their own dtype. Per step i
(h = ln(σ/σ_next), a21 = c2·φ1(−h·c2), b2 = φ2(−h)/c2, b1 = φ1(−h) − b2, c2 = 1/2):
    d1 = denoise(x, σ);  eps1 = d1 − x;  x_mid = x + h·a21·eps1, re-noised from σ to √(σ·σ_next) (eta 1/2)
    when h < 0.5 and σ > 0.03: 100 fixed-point rounds re-anchoring x on x_mid ("bong" iteration)
    d2 = denoise(x_mid, √(σ·σ_next));  x_next = x + h·(b1·eps1 + b2·(d2 − x)), re-noised from σ to σ_next (eta 1/2)
The last step (to σ = 0) runs to σ = 0.0011 instead, then the denoiser's x0 at 0.0011 is the result.
Re-noising (from σ to σ_n, given the anchor x and the deterministic result y), with σ_up = σ_n·eta:
    eps = (x − y)/(σ − σ_n);  x0 = x − σ·eps;  r = √(σ_n² − σ_up²);  α = 1 − σ_n + r
    result = α·(x0 + (r/α)·eps) + σ_up·noise
The noise: float64 normal, standardized over the whole tensor, then per clip over all its values.
Guides (guides.py): both x0 of a step are held (`GuidedStage.hold`), and so are the midpoint and the next latent after
their noise injection — the reference's `legacy_mode`, which its HQ pipeline runs.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..errors import LTX25Error
from .guides import GuidedStage
from .sampling import (DenoiseFn, OnStep, OnX0, check_noise_layout, check_sigmas, draw_shape, laid_out,
                       start_latents)

ETA = 0.5                  # SDE noise at each step and (always, in the reference) at each midpoint
FINAL_SIGMA = 0.0011       # where a schedule ending at 0 stops stepping and takes x0
C2 = 0.5                   # the midpoint
BONG_ROUNDS = 100
BONG_MAX_H, BONG_MIN_SIGMA = 0.5, 0.03
STEP_SEED_OFFSET, SUBSTEP_SEED_OFFSET = 20000, 30000  # our generators' seeds (see sample_res2s)


def phi(j: int, neg_h: float) -> float:
    """φ_j(z) = (e^z − Σ_{k<j} z^k/k!)/z^j, with its limit 1/j! at z = 0."""
    if abs(neg_h) < 1e-10:
        return 1.0 / math.factorial(j)
    return (math.exp(neg_h) - sum(neg_h**k / math.factorial(k) for k in range(j))) / neg_h**j


def coefficients(h: float, c2: float = C2) -> tuple[float, float, float]:
    """(a21, b1, b2) of the res_2s tableau for a step of log-size h."""
    a21 = c2 * phi(1, -h * c2)
    b2 = phi(2, -h) / c2
    return a21, phi(1, -h) - b2, b2


def renoise(anchor: torch.Tensor, result: torch.Tensor, sigma: float, sigma_next: float, noise: torch.Tensor,
            eta: float = ETA) -> torch.Tensor:
    """The reference's SDE injection taking `result` (deterministic, at σ_next) to a noisy sample at σ_next."""
    sigma_up = min(sigma_next * eta, sigma_next * 0.9999)
    if sigma_up == 0 or sigma_next == 0:
        return result
    residual = math.sqrt(max(sigma_next**2 - sigma_up**2, 0.0))
    alpha = (1 - sigma_next) + residual
    sigma_down = residual / alpha if alpha != 0 else sigma_next
    eps = (anchor - result) / (sigma - sigma_next)
    x0 = anchor - sigma * eps
    return alpha * (x0 + sigma_down * eps) + sigma_up * noise


def step_noise(like: torch.Tensor, generator: torch.Generator, layout: str = "comfy") -> torch.Tensor:
    """Standard normal float64 noise shaped like `like`, standardized over the tensor, then per clip; drawn in the
    noise `layout` (`sampling.draw_shape`: the reference draws on its tokens)."""
    noise = torch.randn(draw_shape(like.shape, layout), generator=generator, dtype=torch.float64)
    noise = (noise - noise.mean()) / noise.std()
    dims = tuple(range(1, noise.ndim))
    noise = (noise - noise.mean(dim=dims, keepdim=True)) / noise.std(dim=dims, keepdim=True)
    return laid_out(noise, like.shape, layout).to(like.device)


def sample_res2s(denoise_fn: DenoiseFn, video: torch.Tensor, audio: torch.Tensor, sigmas: Sequence[float],
                 seed: int, stage: int, on_step: OnStep | None = None, eta: float = ETA,
                 substep_eta: float = ETA, held: GuidedStage | None = None, noise_layout: str = "comfy",
                 on_x0: OnX0 | None = None,
                 noise_skip: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise the latents to `sigmas[0]` (the main generator and `noise_skip` as `sampling.sample_stage`), then
    res_2s steps (`eta`, `substep_eta`: the SDE noise after each step and at each midpoint; the reference's are
    both 1/2); `held`: the stage's guides (see the module docstring), the outputs cropped to the input shapes.

    The SDE noise comes from two CPU generators, seeded `seed + 20000` (steps) and `seed + 30000` (midpoints), one
    draw per modality per use (video, then audio). The reference's HQ pipeline seeds them −1 and 9999 whatever the
    seed (it does not pass its seed to the loop); ours follow the seed, like every other draw of the pack. Every
    draw follows `noise_layout` (`sampling.NOISE_LAYOUTS`). After each step `on_x0(done, total, x0_video)` gets the
    step's latest x0 (the midpoint's; the final call's at the end, float32), then `on_step(done, total)`."""
    check_noise_layout(noise_layout)
    sigmas = check_sigmas(sigmas)  # ends at 0
    if len(sigmas) > 1 and sigmas[-2] <= FINAL_SIGMA:
        raise LTX25Error("sigmas", "the last sigma before 0", sigmas[-2], f"above {FINAL_SIGMA}",
                         "res_2s stops stepping at 0.0011 and takes the x0 there.")
    steps = len(sigmas) - 1
    stepped = list(sigmas[:-1]) + [FINAL_SIGMA]
    step_gen = torch.Generator().manual_seed((seed + STEP_SEED_OFFSET) % 2**64)
    substep_gen = torch.Generator().manual_seed((seed + SUBSTEP_SEED_OFFSET) % 2**64)
    total = steps + 1
    hold = (lambda pair: list(pair)) if held is None else (lambda pair: list(held.hold(*pair)))  # noqa: E731
    with torch.inference_mode():
        latents = list(start_latents(video, audio, sigmas[0], seed, stage, noise_layout, held, noise_skip))
        for i in range(steps):
            sigma, sigma_next = float(stepped[i]), float(stepped[i + 1])
            latents, x0_video = _step(denoise_fn, latents, sigma, sigma_next, (step_gen, eta),
                                      (substep_gen, substep_eta), hold, noise_layout)
            _report(on_x0, on_step, i + 1, total, x0_video if held is None else held.crop(x0_video))
        final = hold(denoise_fn(latents[0], latents[1], FINAL_SIGMA))
        latents = [x0.to(x.dtype) for x, x0 in zip(latents, final)]
        _report(on_x0, on_step, total, total, final[0] if held is None else held.crop(final[0]))
    return (latents[0], latents[1]) if held is None else (held.crop(latents[0]), latents[1])


def _report(on_x0: OnX0 | None, on_step: OnStep | None, done: int, total: int, x0_video: torch.Tensor) -> None:
    if on_x0 is not None:
        on_x0(done, total, x0_video.float())
    if on_step is not None:
        on_step(done, total)


def _step(denoise_fn: DenoiseFn, latents: list[torch.Tensor], sigma: float, sigma_next: float,
          step_noise_of: tuple[torch.Generator, float], substep_noise_of: tuple[torch.Generator, float],
          hold: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]], layout: str = "comfy"
          ) -> tuple[list[torch.Tensor], torch.Tensor]:
    (step_gen, eta), (substep_gen, substep_eta) = step_noise_of, substep_noise_of
    h = -math.log(sigma_next / sigma)
    a21, b1, b2 = coefficients(h)
    sub_sigma = math.sqrt(sigma * sigma_next)
    anchors = [x.double() for x in latents]
    d1 = [x0.double() for x0 in hold(denoise_fn(latents[0], latents[1], sigma))]
    eps1 = [d - x for d, x in zip(d1, anchors)]
    mids = hold([renoise(x, x + h * a21 * e, sigma, sub_sigma, step_noise(x, substep_gen, layout), substep_eta)
                 for x, e in zip(anchors, eps1)])
    if h < BONG_MAX_H and sigma > BONG_MIN_SIGMA:
        for _ in range(BONG_ROUNDS):
            anchors = [m - h * a21 * e for m, e in zip(mids, eps1)]
            eps1 = [d - x for d, x in zip(d1, anchors)]
    d2 = [x0.double() for x0 in hold(denoise_fn(*(m.to(x.dtype) for m, x in zip(mids, latents)), sub_sigma))]
    nexts = [x + h * (b1 * e1 + b2 * (d - x)) for x, e1, d in zip(anchors, eps1, d2)]
    return [y.to(latent.dtype) for y, latent in zip(
        hold([renoise(x, y, sigma, sigma_next, step_noise(x, step_gen, layout), eta)
              for x, y in zip(anchors, nexts)]), latents)], d2[0]

