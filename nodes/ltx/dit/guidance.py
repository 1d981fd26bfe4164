"""Multimodal guidance for the full (dev) transformer (docs/MODEL.md §15.1-§15.3): per-modality classifier-free
guidance, spatio-temporal guidance (STG), modality (audio↔video) guidance and the rescale, combined as the reference's
`MultiModalGuider` combines them, and the denoiser that runs the forward passes they need.

Per step and modality, from the x0 of up to four passes (all float32):
    pred = cond + (cfg − 1)·(cond − uncond) + stg·(cond − perturbed) + (modality − 1)·(cond − isolated)
    rescale ≠ 0:  pred ·= rescale·std(cond)/std(pred) + (1 − rescale)     (std over the whole tensor, unbiased)
The passes: cond (the prompt); uncond (the negative prompt) when a modality's cfg ≠ 1; perturbed (the prompt, with
the video self-attention of the video's STG blocks and the audio self-attention of the audio's STG blocks passing
their values through) when a modality's stg ≠ 0; isolated (the prompt, no audio↔video cross-attention in any block)
when a modality's modality scale ≠ 1. A pass one modality does not use still runs for the other, as in the reference.
With every scale neutral the denoiser IS the unguided one (one forward, the same bits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import torch

from ..conditioning import Conditioning
from ..errors import LTX25Error
from . import accelerated_denoise
from .guides import Grid, GuidedStage, Timesteps, uniform_timesteps
from .perturbation import A2V, AUDIO_SELF, NONE, V2A, VIDEO_SELF, Masks, Perturbation, build_masks, perturbed
from .positions import patchify_audio, patchify_video

DenoiseFn = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
ACCELERATIONS = ("auto", "eager", "cuda_graph")  # torch.compile would trace the perturbation processors
PASS_BATCHING = ("sequential", "batched")


@dataclass(frozen=True)
class ModalityGuidance:
    """One modality's scales (the reference's `MultiModalGuiderParams`); the defaults are neutral (no guidance).
    `stg_blocks`: DiT block indices whose self-attention the perturbed pass skips; None means every block."""
    cfg: float = 1.0
    stg: float = 0.0
    stg_blocks: tuple[int, ...] | None = ()
    rescale: float = 0.0
    modality: float = 1.0

    def uses_uncond(self) -> bool:
        return not math.isclose(self.cfg, 1.0)

    def uses_perturbed(self) -> bool:
        return not math.isclose(self.stg, 0.0)

    def uses_isolated(self) -> bool:
        return not math.isclose(self.modality, 1.0)


# The reference's defaults for the 2.5 dev model (2.3 lineage: STG on block 28; docs/MODEL.md §7.6).
DEV_VIDEO = ModalityGuidance(cfg=3.0, stg=1.0, stg_blocks=(28,), rescale=0.7, modality=3.0)
DEV_AUDIO = ModalityGuidance(cfg=7.0, stg=1.0, stg_blocks=(28,), rescale=0.7, modality=3.0)


def combine(params: ModalityGuidance, cond: torch.Tensor, uncond: torch.Tensor | float = 0.0,
            perturbed_x0: torch.Tensor | float = 0.0, isolated: torch.Tensor | float = 0.0) -> torch.Tensor:
    """The guided x0 of one modality from its passes' x0 (an unused pass may be 0.0), float32."""
    cond = cond.float()
    lift = (lambda t: t.float() if isinstance(t, torch.Tensor) else t)  # noqa: E731
    pred = cond + (params.cfg - 1) * (cond - lift(uncond)) + params.stg * (cond - lift(perturbed_x0)) \
        + (params.modality - 1) * (cond - lift(isolated))
    if params.rescale != 0:
        factor = cond.std() / pred.std()
        pred = pred * (params.rescale * factor + (1 - params.rescale))
    return pred


class Pass(NamedTuple):
    name: str                   # "cond", "uncond", "perturbed", "isolated"
    negative: bool              # the negative prompt's context (else the positive one)
    perturbation: Perturbation


@dataclass(frozen=True)
class Guidance:
    """LTX25_GUIDER: the prompts and each modality's scales."""
    positive: Conditioning
    negative: Conditioning | None = None
    video: ModalityGuidance = field(default_factory=ModalityGuidance)
    audio: ModalityGuidance = field(default_factory=ModalityGuidance)

    def passes(self) -> tuple[Pass, ...]:
        """The forward passes per step, in the reference's order."""
        passes = [Pass("cond", False, NONE)]
        if self.video.uses_uncond() or self.audio.uses_uncond():
            passes.append(Pass("uncond", True, NONE))
        skips = [(kind, None if params.stg_blocks is None else frozenset(params.stg_blocks))
                 for kind, params in ((VIDEO_SELF, self.video), (AUDIO_SELF, self.audio)) if params.uses_perturbed()]
        if skips:
            passes.append(Pass("perturbed", False, Perturbation(tuple(skips))))
        if self.video.uses_isolated() or self.audio.uses_isolated():
            passes.append(Pass("isolated", False, Perturbation(((A2V, None), (V2A, None)))))
        return tuple(passes)

    def check(self, num_blocks: int | None = None, where: str = "guider") -> None:
        """A negative prompt where CFG needs one; STG blocks inside a model of `num_blocks` (None: not checked)."""
        if self.negative is None and any(p.negative for p in self.passes()):
            raise LTX25Error(f"{where}.negative", "the negative conditioning", "not connected",
                             "a conditioning when video_cfg or audio_cfg is not 1",
                             "Encode the negative prompt (it may be empty) and run it through LTX-2.5 Connector.")
        for name, params in (("video", self.video), ("audio", self.audio)):
            bad = [b for b in params.stg_blocks or () if num_blocks is not None and not 0 <= b < num_blocks]
            if params.uses_perturbed() and bad:
                raise LTX25Error(f"{where}.{name}_stg_blocks", "the block", bad[0], f"0 … {num_blocks - 1}",
                                 f"This transformer has {num_blocks} blocks (the released LTX-2.5 has 48; the "
                                 "reference perturbs block 28).")


def parse_blocks(text: str, where: str) -> tuple[int, ...] | None:
    """'28' / '27, 28' → block indices; 'all' → None (every block); blank → () (none)."""
    text = text.strip()
    if text.lower() == "all":
        return None
    try:
        return tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise LTX25Error(where, "the block list", repr(text), "block numbers like '28' or '27, 28', or 'all'")


# ---------------------------------------------------------------------------------------------------- the denoiser
def check_acceleration(mode: str, device: torch.device, where: str = "acceleration") -> None:
    """A guided stage's `mode` is one of `ACCELERATIONS` and possible on `device` (see
    `accelerated_denoise.resolve_mode`); `where`: the node input named in the error."""
    if mode not in ACCELERATIONS:
        raise LTX25Error(where, "the mode", repr(mode), " / ".join(ACCELERATIONS),
                         "torch.compile is not offered for guided sampling.")
    accelerated_denoise.resolve_mode(mode, device, where)


def make_guided_denoiser(model: torch.nn.Module, guidance: Guidance, fps: float, mode: str = "auto",
                         batching: str = "sequential", guided: GuidedStage | None = None,
                         check: Callable[[], None] | None = None) -> DenoiseFn:
    """`(video [B,128,F',H',W'], audio [B,8,T,16], σ) → (guided x0 video, guided x0 audio)` float32 on the inputs'
    devices. `batching`: 'sequential' runs the passes one forward each (the reference's default, max batch 1);
    'batched' runs them as one forward of passes × B rows. `mode`: 'auto', 'eager' or 'cuda_graph'. `guided`: the
    stage's guides (every pass gets their timesteps and positions; the sampler holds the tokens after combining).
    `check()` runs before each forward (it raises to interrupt): a guided step is up to four full forwards, eight
    with res_2s, and a check once per step left a Stop waiting for all of them."""
    check_acceleration(mode, next(model.parameters()).device)
    if batching not in PASS_BATCHING:
        raise LTX25Error("pass_batching", "the choice", repr(batching), " / ".join(PASS_BATCHING))
    passes = guidance.passes()
    if len(passes) == 1:  # neutral scales: the unguided denoiser itself
        plain = accelerated_denoise.make_denoiser(model, guidance.positive, fps, mode, guided)
        return plain if check is None else (lambda video, audio, sigma: check() or plain(video, audio, sigma))
    guidance.check(len(model.dit.transformer_blocks))
    weight = model.dit.proj_in.weight
    device, dtype = weight.device, weight.dtype
    graphed = (not accelerated_denoise.streamed(model)
               and accelerated_denoise.resolve_mode(mode, device) == "cuda_graph")
    contexts = {False: _context(guidance.positive, device, dtype), True: None}
    if guidance.negative is not None:
        contexts[True] = _context(guidance.negative, device, dtype)
    groups = [passes] if batching == "batched" else [(p,) for p in passes]

    def denoise(video: torch.Tensor, audio: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
        from .transformer import check_denoise_inputs, x0_from_velocity
        for conditioning in filter(None, (guidance.positive, guidance.negative)):
            check_denoise_inputs(model.config, video, audio, conditioning)
        # No compile here: blocks a compiled stage of this model left compiled run plain (as an eager denoiser does)
        accelerated_denoise._set_compiled(model, False)
        with torch.inference_mode():
            b, _, f, h, w = video.shape
            tokens = (patchify_video(video).to(device, dtype), patchify_audio(audio).to(device, dtype))
            attention = None if guided is None else guided.attention_bias(dtype, device)  # shared by every row
            x0 = {}
            for group in groups:
                if check is not None:
                    check()
                rows = len(group) * b
                context = tuple(_rows(contexts[group[0].negative][i], b) if len(group) == 1 else
                                torch.cat([_rows(contexts[p.negative][i], b) for p in group]) for i in (0, 1))
                samples = [p.perturbation for p in group for _ in range(b)]
                if guided is None:
                    grid = model.grid(rows, f, h, w, audio.shape[2], fps, device)
                    steps = uniform_timesteps(torch.full((rows,), float(sigma), dtype=torch.float32, device=device))
                else:
                    guided.check_latents(video, audio)
                    steps, grid = guided.timesteps(sigma, rows), Grid(*(_repeat(t, len(group)) for t in guided.grid))
                inputs = tuple(t.repeat(len(group), 1, 1) if len(group) > 1 else t for t in tokens)
                # Streaming may start mid-run (model management moving blocks out): streamed blocks run eagerly
                forward = _graph_forward if graphed and not accelerated_denoise.streamed(model) else _eager_forward
                v, a = forward(model, samples, inputs, steps, context, grid, (f, h, w, fps), attention)
                for p, v_i, a_i in zip(group, v.chunk(len(group)), a.chunk(len(group))):
                    x0[p.name] = x0_from_velocity(video, audio, v_i, a_i, sigma, device, guided)
        video_x0 = combine(guidance.video, x0["cond"][0], *(_pass(x0, n, 0) for n in ("uncond", "perturbed",
                                                                                      "isolated")))
        audio_x0 = combine(guidance.audio, x0["cond"][1], *(_pass(x0, n, 1) for n in ("uncond", "perturbed",
                                                                                      "isolated")))
        return video_x0, audio_x0
    return denoise


def _pass(x0: dict, name: str, stream: int) -> torch.Tensor | float:
    return x0[name][stream] if name in x0 else 0.0


def _context(cond: Conditioning, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt's text context on the DiT's device and dtype, moved once per denoiser."""
    return cond.video.to(device, dtype), cond.audio.to(device, dtype)


def _repeat(t: torch.Tensor, times: int) -> torch.Tensor:
    """A per-clip tensor for a forward of `times` passes of the batch (rows pass-major, as the contexts)."""
    return t if times == 1 else t.repeat(times, *([1] * (t.ndim - 1)))


def _rows(context: torch.Tensor, batch: int) -> torch.Tensor:
    """One prompt serves every clip of the batch (as `LTX25Transformer.context` expands it)."""
    return context.expand(batch, -1, -1) if context.shape[0] == 1 and batch > 1 else context


def _perturbed_velocity(model, masks: Masks, tokens, steps, context, grid,
                        attention=None) -> tuple[torch.Tensor, torch.Tensor]:
    from .transformer import velocity
    with perturbed(model.dit.transformer_blocks, masks):
        return velocity(model, tokens[0], tokens[1], steps, context, grid, attention)


def _eager_forward(model, samples: Sequence[Perturbation], tokens, steps, context, grid, _shape, attention=None):
    masks = build_masks(samples, len(model.dit.transformer_blocks), steps.video.device)
    return _perturbed_velocity(model, masks, tokens, steps, context, grid, attention)


@dataclass
class _GuidedGraph:
    replay: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    statics: tuple[torch.Tensor, ...]  # video tokens, audio tokens, 4 timesteps, 2 contexts, 3 grid tensors
    held: tuple                        # the keep masks the graph reads: their memory stays theirs
    attention: torch.Tensor | None = None  # the video self-attention's bias (reference_attention.py)


def _graph_forward(model, samples: Sequence[Perturbation], tokens, steps, context, grid, shape, attention=None):
    """The group's forward replayed from a CUDA graph per (shapes, perturbations), captured on first use with the
    perturbation processors in place; inputs (tokens, timesteps, both contexts, positions, the attention bias) are
    copied into its static buffers."""
    cache = accelerated_denoise.graph_cache(model)
    values = (*tokens, *steps, *context, *grid)
    key = ("guided", tuple(samples), tuple(tuple(t.shape) for t in values), shape, tokens[0].dtype,
           str(tokens[0].device), attention is not None)
    if key not in cache.graphs:
        cache.make_room()
        statics = tuple(t.detach().clone().contiguous() for t in values)
        bias = accelerated_denoise.static_like(attention)
        masks = build_masks(samples, len(model.dit.transformer_blocks), tokens[0].device)
        replay = accelerated_denoise.record_graph(
            lambda: _perturbed_velocity(model, masks, statics[:2], Timesteps(*statics[2:6]), statics[6:8],
                                        Grid(*statics[8:11]), bias), cache, tokens[0].device)
        cache.graphs[key] = _GuidedGraph(replay, statics, (masks,), bias)
    graph = cache.graphs[key]
    for static, value in zip(graph.statics, values):
        static.copy_(value)
    if attention is not None:
        graph.attention.copy_(attention)
    return graph.replay()
