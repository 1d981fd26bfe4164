"""Distilled sampling of the joint audio+video latents (docs/MODEL.md §7): sigma schedules, the Euler and
Euler-ancestral steps, and the stage loop. One denoiser forward per step (distilled models take no CFG).

Noise (all drawn in float32 on a CPU `torch.Generator`, then moved to the latents' device, so a seed gives the same
video on every device; the reference draws on the GPU, so its bits differ from ours but not its distribution):
- main generator `manual_seed(seed)`: one `randn` per modality, video then audio; the latents are set to
  `lerp(latent, noise, sigmas[0])` (stage 1: zero latents, 1.0 → pure noise; stage 2: the upsampled video AND the
  stage-1 audio, 0.909375; a custom schedule re-noises to its own first sigma). The reference runs both stages
  on one generator, so stage 2 first skips the draws stage 1 made (video at half the size with the same appended
  guide frames, the same audio): with the same seed on both sampler nodes, stage 2 gets fresh noise rather than a
  re-read of stage 1's.
- ancestral generator `manual_seed(seed + 10000)`: one `randn` per modality per step, video then audio.
- layout (`NOISE_LAYOUTS`): 'comfy' (the default) draws each `randn` in the latent's own shape, `[B, C, F, H, W]` /
  `[B, C, T, M]`, as ComfyUI core does, so a seed gives core's noise; 'reference' draws the same sequence in the
  reference's token layout, video `[B, F·H·W, C]` and audio `[B, T, C·M]`, and unpatchifies it, so a seed gives
  ltx-pipelines' noise (up to the device the generator runs on). Both generators follow the layout.
Stage 1 of LTX-2.5 (`model_version >= 2.5`) is Euler-ancestral (eta 1); older models and every stage 2 use Euler.

Guides (guides.py): the stage's `GuidedStage` appends the guide frames' slots before the noise is drawn (so the draws
cover them, as the reference's do), pulls conditioned tokens back to their clean values after noising, holds them in
every step's x0 (and, for Euler-ancestral, in the re-noised latent), and crops the appended frames off the outputs.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .accelerated_denoise import make_denoiser
from .guides import Guides, GuidedStage, resolve
from .positions import unpatchify_audio, unpatchify_video
from ..files.assets import model_version_tuple
from ..errors import LTX25Error
from ..latents import UPSAMPLE_FACTOR

DISTILLED_SIGMAS = (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0)  # stage 1, 8 steps
STAGE2_SIGMAS = (0.909375, 0.725, 0.421875, 0.0)                                          # stage 2, 3 steps
ANCESTRAL_SEED_OFFSET = 10000
ANCESTRAL_SINCE = (2, 5)  # model_version from which the distilled stage 1 is Euler-ancestral
SAMPLERS = ("auto", "euler", "euler_ancestral")
NOISE_LAYOUTS = ("comfy", "reference")  # see the module docstring

DenoiseFn = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
OnStep = Callable[[int, int], None]
OnX0 = Callable[[int, int, torch.Tensor], None]  # (steps done, steps, the step's x0 video latent)


# ---------------------------------------------------------------------------------------------------- schedules
def default_sigmas(stage: int) -> tuple[float, ...]:
    return DISTILLED_SIGMAS if stage == 1 else STAGE2_SIGMAS


def check_sigmas(sigmas: Sequence[float], where: str = "sigmas") -> tuple[float, ...]:
    """A schedule is ≥ 2 values, strictly decreasing, starting in (0, 1], ending at exactly 0."""
    sigmas = tuple(float(s) for s in sigmas)
    if len(sigmas) < 2:
        raise LTX25Error(where, "the number of sigmas", len(sigmas), "at least 2 (one step: e.g. '1.0, 0.0')")
    if not 0 < sigmas[0] <= 1:
        raise LTX25Error(where, "the first sigma", sigmas[0], "in (0, 1] (1.0 = pure noise)")
    if sigmas[-1] != 0:
        raise LTX25Error(where, "the last sigma", sigmas[-1], "0.0", "The schedule must end on the clean latent.")
    for i, (a, b) in enumerate(zip(sigmas, sigmas[1:])):
        if not b < a:
            raise LTX25Error(where, f"sigma {i + 1} ({b}) after {a}", "not smaller", "a strictly decreasing list")
    return sigmas


def parse_sigmas(text: str, where: str = "sigmas") -> tuple[float, ...] | None:
    """'1.0, 0.99, …, 0.0' (commas and/or spaces) → checked tuple; blank → None (use the default schedule)."""
    parts = [p for p in text.replace(",", " ").split()]
    if not parts:
        return None
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise LTX25Error(where, "the entry", repr(part), "a number (a comma-separated list like '0.9, 0.5, 0.0')")
        if not math.isfinite(value):
            raise LTX25Error(where, "the entry", repr(part), "a finite number")
        values.append(value)
    return check_sigmas(values, where)


def resolve_sampler(choice: str, stage: int, model_version: str | None) -> str:
    """'auto' → Euler-ancestral for stage 1 of `model_version >= 2.5`, Euler otherwise; an explicit choice wins."""
    if choice not in SAMPLERS:
        raise LTX25Error("sampler", "the sampler", repr(choice), " / ".join(SAMPLERS))
    if choice != "auto":
        return choice
    return "euler_ancestral" if stage == 1 and model_version_tuple(model_version) >= ANCESTRAL_SINCE else "euler"


def check_cfg(cfg: float, model_name: str, where: str = "cfg") -> None:
    """Distilled checkpoints are trained for one unguided forward per step, so CFG ≠ 1 is refused.

    Dev and distilled files have identical metadata and keys (docs/MODEL.md §1), so "distilled" is read from the file
    name. A file without that hint is still sampled with one forward per step: this node has no negative prompt
    and so no CFG path either way."""
    if cfg == 1.0:
        return
    if "distilled" in model_name.lower():
        raise LTX25Error(where, "cfg", cfg, "1.0",
                         f"{model_name} is a distilled model (by its file name): distilled models take no CFG.")
    raise LTX25Error(where, "cfg", cfg, "1.0", "This sampler runs one unguided forward per step; it has no CFG.")


# ---------------------------------------------------------------------------------------------------- steps
def euler_step(x: torch.Tensor, x0: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
    """Deterministic flow Euler in fp32: `v = (x - x0)/σ`, `x + v·(σ_next - σ)`; returned in `x`'s dtype."""
    xf = x.float()
    velocity = (xf - x0.float()) / sigma
    return (xf + velocity * (sigma_next - sigma)).to(x.dtype)


def ancestral_step(x: torch.Tensor, x0: torch.Tensor, sigma: float, sigma_next: float,
                   noise: torch.Tensor | None) -> torch.Tensor:
    """Rectified-flow Euler-ancestral with eta 1 (docs/MODEL.md §7.3), fp32, returned in `x`'s dtype.

    σ_down = σ_next²/σ; x' = (σ_down/σ)·x + (1 - σ_down/σ)·x0; then x' is rescaled to the σ_next level and fresh
    noise makes up the variance: `x_next = (1-σ_next)/(1-σ_down)·x' + noise·sqrt(σ_next² - σ_down²(1-σ_next)²/(1-σ_down)²)`.
    At σ_next = 0 the result is x0 itself (no noise is drawn for that step: `noise` may be None).
    """
    if sigma_next == 0:
        return x0.to(x.dtype)
    sigma_down = sigma_next**2 / sigma
    ratio = sigma_down / sigma
    x_down = ratio * x.float() + (1 - ratio) * x0.float()
    alpha = (1 - sigma_next) / (1 - sigma_down)
    noise_std = math.sqrt(max(sigma_next**2 - sigma_down**2 * alpha**2, 0.0))
    return (alpha * x_down + noise_std * noise.float()).to(x.dtype)


# ---------------------------------------------------------------------------------------------------- noise
def check_noise_layout(layout: str, where: str = "noise_layout") -> str:
    if layout not in NOISE_LAYOUTS:
        raise LTX25Error(where, "the noise layout", repr(layout), " / ".join(NOISE_LAYOUTS))
    return layout


def draw_shape(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """The shape a layout draws a latent's noise in: the latent's own for 'comfy'; for 'reference' the tokens the
    reference noises, video `[B, F·H·W, C]` and audio `[B, T, C·M]`."""
    shape = tuple(shape)
    if layout == "comfy":
        return shape
    if len(shape) == 5:
        b, c, f, h, w = shape
        return b, f * h * w, c
    b, c, t, m = shape
    return b, t, c * m


def laid_out(noise: torch.Tensor, shape: Sequence[int], layout: str) -> torch.Tensor:
    """Noise drawn in `draw_shape(shape, layout)` laid out as the latent `shape`."""
    if layout == "comfy":
        return noise
    return (unpatchify_video if len(shape) == 5 else unpatchify_audio)(noise, tuple(shape))


def _randn(shape: Sequence[int], generator: torch.Generator, like: torch.Tensor,
           layout: str = "comfy") -> torch.Tensor:
    """One float32 CPU draw of `shape` (`[B, C, F, H, W]` or `[B, C, T, M]`), in `layout` (`draw_shape`)."""
    noise = torch.randn(draw_shape(shape, layout), generator=generator, dtype=torch.float32)
    return laid_out(noise, shape, layout).to(like.device, like.dtype)


def _stage1_shapes(video: torch.Tensor, audio: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes the reference's stage 1 drew before this stage 2: the video at 1/2 size, the same audio."""
    b, c, f, h, w = video.shape
    return (b, c, f, h // UPSAMPLE_FACTOR, w // UPSAMPLE_FACTOR), tuple(audio.shape)


def initial_noise(video: torch.Tensor, audio: torch.Tensor, seed: int, stage: int,
                  layout: str = "comfy", skip: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The main generator's noise for the start of `stage`: video then audio. Stage 2 skips stage 1's draws, which
    use up the same count of values in either layout: `skip`, the counts stage 1 drew (`noise_drawn`; its latents
    held tokens stage 2 does not, an IC-LoRA's reference), else those of stage 2's latents at half size."""
    check_noise_layout(layout)
    generator = torch.Generator().manual_seed(seed % 2**64)
    if stage == 2:
        for shape in (skip or _stage1_shapes(video, audio)):
            torch.randn(shape, generator=generator, dtype=torch.float32)
    return _randn(video.shape, generator, video, layout), _randn(audio.shape, generator, audio, layout)


# ---------------------------------------------------------------------------------------------------- the loop
def noise_drawn(video: torch.Tensor, audio: torch.Tensor, held: GuidedStage | None = None) -> tuple[int, int]:
    """How many values `start_latents` draws for these latents (video with its appended pieces, then audio): what
    a stage 1 hands on for stage 2's `noise_skip`."""
    return (video.numel() if held is None else held.video_clean.numel()), audio.numel()


def start_latents(video: torch.Tensor, audio: torch.Tensor, sigma: float, seed: int, stage: int,
                  noise_layout: str = "comfy", held: GuidedStage | None = None,
                  noise_skip: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The latents noised to `sigma` from the main generator (with `held`: the appended guide slots first, then the
    conditioned tokens pulled back to their clean values, as the reference's noiser does); `noise_skip`: see
    `initial_noise`."""
    if held is not None:
        video = held.extend(video)
    noise_video, noise_audio = initial_noise(video, audio, seed, stage, noise_layout, noise_skip)
    video = torch.lerp(video, noise_video, sigma)
    audio = torch.lerp(audio, noise_audio, sigma)
    return (video, audio) if held is None else held.noised(video, audio)


def sample_stage(denoise_fn: DenoiseFn, video: torch.Tensor, audio: torch.Tensor, sigmas: Sequence[float],
                 sampler: str, seed: int, stage: int, on_step: OnStep | None = None, noise_layout: str = "comfy",
                 on_x0: OnX0 | None = None, held: GuidedStage | None = None,
                 noise_skip: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise the latents to `sigmas[0]` (`noise_skip`: see `initial_noise`), then one
    `denoise_fn(video, audio, σ) → (x0_video, x0_audio)` per step.

    video: `[B, 128, F', H', W']`, audio: `[B, 8, T, 16]` (normalized latents; stage 1: zeros). `sampler` is
    'euler' or 'euler_ancestral' (see `resolve_sampler`); `noise_layout` one of `NOISE_LAYOUTS`; `held`: the stage's
    resolved guides (on the latents' device; `denoise_fn` built for them). After each step,
    `on_x0(done, steps, x0_video)` (e.g. a live preview; guide frames cropped) and then `on_step(done, steps)`.
    Returns the sampled latents in the inputs' dtype/device, shaped as they came in.
    """
    sigmas = check_sigmas(sigmas)
    if sampler not in ("euler", "euler_ancestral"):
        raise LTX25Error("sampler", "the resolved sampler", repr(sampler), "'euler' or 'euler_ancestral'")
    check_noise_layout(noise_layout)
    with torch.inference_mode():
        video, audio = start_latents(video, audio, sigmas[0], seed, stage, noise_layout, held, noise_skip)
        ancestral = torch.Generator().manual_seed((seed + ANCESTRAL_SEED_OFFSET) % 2**64)
        steps = len(sigmas) - 1
        for i, (sigma, sigma_next) in enumerate(zip(sigmas, sigmas[1:])):
            x0_video, x0_audio = denoise_fn(video, audio, sigma)
            if held is not None:
                x0_video, x0_audio = held.hold(x0_video, x0_audio)
            if sampler == "euler":
                video = euler_step(video, x0_video, sigma, sigma_next)
                audio = euler_step(audio, x0_audio, sigma, sigma_next)
            else:
                drawn = (None, None) if sigma_next == 0 else (_randn(video.shape, ancestral, video, noise_layout),
                                                              _randn(audio.shape, ancestral, audio, noise_layout))
                video = ancestral_step(video, x0_video, sigma, sigma_next, drawn[0])
                audio = ancestral_step(audio, x0_audio, sigma, sigma_next, drawn[1])
                if held is not None and sigma_next != 0:  # the fresh noise is taken out of held tokens again
                    video, audio = held.hold(video, audio)
            if on_x0 is not None:
                on_x0(i + 1, steps, x0_video if held is None else held.crop(x0_video))
            if on_step is not None:
                on_step(i + 1, steps)
    return (video, audio) if held is None else (held.crop(video), audio)


REAL_WIDTHS = (4096, 2048)  # LTX-2.5 video / audio stream widths (32×128, 32×64)


def stream_widths(model: torch.nn.Module) -> tuple[int, int]:
    """(video, audio) stream widths from the transformer's config (`TransformerConfig`); the real 2.5 widths for a
    module without one (an over-estimate is the safe side of a memory estimate)."""
    config = getattr(model, "config", None)
    if all(hasattr(config, name) for name in ("heads", "head_dim", "audio_heads", "audio_head_dim")):
        return config.heads * config.head_dim, config.audio_heads * config.audio_head_dim
    return REAL_WIDTHS


PER_TOKEN_ADALN = 14  # values per token and width of a per-token AdaLN: 9 block rows, 4 AV rows, the embedding


def working_memory(model: torch.nn.Module, video_shape: Sequence[int], audio_shape: Sequence[int],
                   context_tokens: int = 1024, per_token: bool = False, attention_tokens: int = 0) -> int:
    """Bytes one DiT forward on `[B, 128, F', H', W']` + `[B, 8, T, 16]` needs beyond the weights: tokens × width ×
    ~16 live values (q/k/v, attention out, the 4× FF hidden, residuals) for both streams and their 1024-token text
    contexts, at the weights' element size; `per_token` (a guided stage, the F' counting its appended guide frames)
    adds the AdaLN modulation each token then carries; `attention_tokens` (a stage whose reference video carries an
    attention strength: `GuidedStage.attention`) the dense `[N, N]` attention bias twice (it and a CUDA graph's
    copy), shared by the batch."""
    (video_width, audio_width), itemsize = stream_widths(model), next(model.parameters()).element_size()
    b, _, f, h, w = video_shape
    tokens = (f * h * w, audio_shape[2])
    adaln = (tokens[0] * video_width + tokens[1] * audio_width) * PER_TOKEN_ADALN if per_token else 0
    return (b * (((tokens[0] + context_tokens) * video_width + (tokens[1] + context_tokens) * audio_width) * 16
                 + adaln) + 2 * attention_tokens ** 2) * itemsize


def guided_stage(guides: Guides | GuidedStage | None, video: torch.Tensor, audio: torch.Tensor, fps: float,
                 device: torch.device, where: str = "guides") -> GuidedStage | None:
    """`guides` resolved for these latents (guides.resolve; a GuidedStage passes through) and moved to `device`."""
    held = guides if isinstance(guides, GuidedStage) else resolve(guides, video, audio, fps, where)
    if held is not None and held.frames != video.shape[2]:
        raise LTX25Error(where, "the guided stage's latent frames", held.frames, f"{video.shape[2]} (the latent's)",
                         "The guides were resolved for another latent.")
    return None if held is None else held.to(device)


def sample_distilled(model: torch.nn.Module, conditioning, video: torch.Tensor, audio: torch.Tensor, *, fps: float,
                     seed: int, stage: int, sampler: str = "auto", sigmas: Sequence[float] | None = None,
                     on_step: OnStep | None = None, output_device: torch.device | None = None,
                     acceleration: str = "auto", denoise: Callable | None = None, noise_layout: str = "comfy",
                     on_x0: OnX0 | None = None, guides: Guides | GuidedStage | None = None,
                     notify: Callable[[str], None] | None = None,
                     noise_skip: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One distilled stage with the LTX-2.5 transformer: `model` (carries `.model_version`), `conditioning`
    (`Conditioning`), video `[B,128,F',H',W']` + audio `[B,8,T,16]` at `fps` → sampled latents on `output_device`
    (default: where they came from), of the input shapes. `guides` (guides.Guides, or one already resolved for these
    latents): what the stage is conditioned on, at this stage's size. The denoiser comes from
    `accelerated_denoise.make_denoiser(…, acceleration, notify)` (`notify` hears when a step compiles or captures);
    `denoise(model, video, audio, sigma, cond, fps[, guided=])`
    replaces it (tests). `noise_layout`, `on_x0` and `noise_skip`: see `sample_stage`."""
    if stage not in (1, 2):
        raise LTX25Error("stage", "the stage", stage, "1 or 2")
    out_device = output_device or video.device
    device = next(model.parameters()).device
    video, audio = video.to(device), audio.to(device)
    held = guided_stage(guides, video, audio, fps, device)
    if denoise is None:
        denoise_fn = make_denoiser(model, conditioning, fps, acceleration, held, notify)
    else:
        extra = {} if held is None else {"guided": held}

        def denoise_fn(v: torch.Tensor, a: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
            return denoise(model, v, a, sigma, conditioning, fps, **extra)

    chosen = resolve_sampler(sampler, stage, model.model_version)
    video, audio = sample_stage(denoise_fn, video, audio, sigmas or default_sigmas(stage), chosen, seed, stage,
                                on_step, noise_layout, on_x0, held, noise_skip)
    return video.to(out_device), audio.to(out_device)
