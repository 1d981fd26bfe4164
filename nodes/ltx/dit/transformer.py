"""The LTX-2.5 transformer file: the 22B audio+video DiT and its two embeddings connectors (docs/MODEL.md §5, §4).

One module per file: `LTX25Transformer` holds `.dit` (diffusers `LTX2VideoTransformer3DModel`, configured from the
file's `config.transformer`) and `.connectors` (connector.py). `denoise` is the x0 denoiser the sampler calls once
per step. Positions, patchify and the keyframe mask are pure functions in positions.py.

diffusers vs the reference (ltx-core), checked line by line for what the distilled sampler feeds it:
- positions: diffusers takes `[start, end)` bounds and uses their midpoints, seconds for video time — the same as
  ltx-core. We build the bounds ourselves (positions.py, cached per shape) and pass `video_coords/audio_coords`.
- AV cross-attention AdaLN: ltx-core feeds scale/shift the stream's OWN per-token timesteps and the gate the OTHER
  stream's σ × `av_ca_timestep_scale_multiplier`; diffusers uses one of the two for both (`use_cross_timestep`).
  We call it with `use_cross_timestep=True` (the gate) and swap the scale/shift input for the stream's own timesteps
  (compat.av_scale_shift_from_own_timesteps): the two differ once tokens are conditioned (guides.py).
- RoPE: diffusers applies cos/sin in float32; ltx-core casts them to the stream dtype (bf16) first. Same math,
  diffusers is the more precise of the two.
- keyframe marker: diffusers adds `keyframes_abs_pos_embedding` only when given `video_keyframes_mask`; the
  reference marks the first latent frame's tokens unconditionally, so we always pass that mask.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from diffusers import LTX2VideoTransformer3DModel

from .. import compat
from . import attention
from ..files.assets import Kind, expect_kind, read_state_dict
from ..files.config import REQUIRED, config_field
from ..conditioning import Conditioning
from .connector import CONNECTOR_PREFIXES, CONNECTOR_RENAMES, ConnectorConfig, LTX25Connectors, positive_ints
from ..errors import LTX25Error
from ..files.keymap import KeyMap, Rename, load_strict
from ..kernels.quantized_linear import fp8_compute_, load_keeping_quantized
from ..release import MODEL_VERSION
from .guides import Grid, GuidedStage, Timesteps, uniform_timesteps
from .reference_attention import biased_video_self_attention
from .positions import (AUDIO_LATENT_DOWNSAMPLE, AUDIO_SAMPLE_RATE, MEL_HOP_LENGTH, VIDEO_SCALE,
                        audio_position_bounds, first_frame_keyframes_mask, patchify_audio, patchify_video,
                        unpatchify_audio, unpatchify_video, video_position_bounds)

# Invariants ltx-core's configurator checks (`check_config_value`); a file holding another value is refused.
FIXED_VALUES: Mapping[str, Any] = {
    "dropout": 0.0, "attention_bias": True, "num_vector_embeds": None, "activation_fn": "gelu-approximate",
    "num_embeds_ada_norm": 1000, "use_linear_projection": False, "only_cross_attention": False,
    "cross_attention_norm": True, "double_self_attention": False, "upcast_attention": False,
    "standardization_norm": "rms_norm", "norm_elementwise_affine": False, "qk_norm": "rms_norm",
    "positional_embedding_type": "rope", "use_audio_video_cross_attention": True, "share_ff": False,
    "av_cross_ada_norm": True, "use_middle_indices_grid": True, "rope_type": "split",
    "caption_proj_before_connector": True,  # 2.3+: the Gemma projection lives in the text-encoder file
}

# The released `config.transformer` of ltx-2.5-22b-{distilled,dev}-transformer-*.safetensors (docs/MODEL.md §5.1, §4.2).
SHIPPED_CONFIG: Mapping[str, Any] = {
    **FIXED_VALUES,
    "num_layers": 48, "num_attention_heads": 32, "attention_head_dim": 128, "in_channels": 128, "out_channels": 128,
    "cross_attention_dim": 4096, "caption_channels": 3840, "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64, "audio_in_channels": 128, "audio_out_channels": 128,
    "audio_cross_attention_dim": 2048, "positional_embedding_theta": 10000.0,
    "positional_embedding_max_pos": [20, 2048, 2048], "audio_positional_embedding_max_pos": [20],
    "timestep_scale_multiplier": 1000, "av_ca_timestep_scale_multiplier": 1000.0, "frequencies_precision": "float64",
    "norm_eps": 1e-06, "apply_gated_attention": True, "cross_attention_adaln": True,
    "causal_temporal_positioning": True, "caption_projection_first_linear": False,
    "caption_projection_second_linear": False, "caption_proj_input_norm": False,
    "text_encoder_norm_type": "PER_TOKEN_RMS", "connector_num_layers": 8, "connector_num_attention_heads": 32,
    "connector_attention_head_dim": 128, "audio_connector_attention_head_dim": 64,
    "connector_num_learnable_registers": 128, "connector_positional_embedding_max_pos": [4096],
    "connector_norm_output": True, "connector_apply_gated_attention": True,
    "ff_bias": False, "use_keyframes_abs_pos_embedding": True,  # the two 2.5 changes
}


@dataclass(frozen=True)
class TransformerConfig:
    """`config.transformer` of the file (ltx-core configurator names in comments; defaults are ltx-core's)."""
    num_layers: int                        # num_layers
    heads: int                             # num_attention_heads
    head_dim: int                          # attention_head_dim
    in_channels: int
    out_channels: int
    cross_attention_dim: int
    caption_channels: int                  # unused by 2.3+ (projection in the text-encoder file)
    audio_heads: int                       # audio_num_attention_heads (must equal num_attention_heads)
    audio_head_dim: int
    audio_in_channels: int
    audio_out_channels: int
    audio_cross_attention_dim: int
    theta: float                           # positional_embedding_theta
    max_pos: tuple                         # positional_embedding_max_pos (t s, y px, x px)
    audio_max_pos: tuple                   # audio_positional_embedding_max_pos
    timestep_scale_multiplier: float       # 1000
    av_ca_timestep_scale_multiplier: float  # 1000.0 shipped; ltx-core's default 1 is wrong — no default here
    double_precision: bool                 # frequencies_precision == "float64"
    norm_eps: float
    gated_attention: bool                  # apply_gated_attention
    cross_attention_adaln: bool
    use_prompt_adaln_single: bool          # absent in 2.5 ⇒ true
    ff_bias: bool                          # false in 2.5 (video FF only)
    audio_ff_bias: bool                    # absent in 2.5 ⇒ true
    use_keyframes_abs_pos_embedding: bool  # true in 2.5
    connector: ConnectorConfig

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any]) -> "TransformerConfig":
        """Parse `metadata["config"]["transformer"]`; an unsupported value raises LTX25Error naming its key."""
        config_field(where, metadata, "transformer", kind=Mapping,
                     hint="The metadata was stripped; use the official transformer file.")
        field = lambda key, *a, **k: config_field(where, metadata, f"transformer.{key}", *a, **k)  # noqa: E731
        for key, expected in FIXED_VALUES.items():
            # ltx-core refuses a missing invariant too; we accept absence except where its default means 2.0.
            default = REQUIRED if key == "caption_proj_before_connector" else expected
            field(key, default, allowed=(expected,))
        num, flag = (int, float), bool
        get = lambda key, default, kind=int: field(key, default, kind=kind)  # noqa: E731
        config = cls(
            num_layers=get("num_layers", 48), heads=get("num_attention_heads", 32),
            head_dim=get("attention_head_dim", 128), in_channels=get("in_channels", 128),
            out_channels=get("out_channels", 128), cross_attention_dim=get("cross_attention_dim", 4096),
            caption_channels=get("caption_channels", 3840), audio_heads=get("audio_num_attention_heads", 32),
            audio_head_dim=get("audio_attention_head_dim", 64), audio_in_channels=get("audio_in_channels", 128),
            audio_out_channels=get("audio_out_channels", 128),
            audio_cross_attention_dim=get("audio_cross_attention_dim", 2048),
            theta=get("positional_embedding_theta", 10000.0, num),
            max_pos=positive_ints(where, metadata, "transformer.positional_embedding_max_pos", 3, [20, 2048, 2048]),
            audio_max_pos=positive_ints(where, metadata, "transformer.audio_positional_embedding_max_pos", 1, [20]),
            timestep_scale_multiplier=get("timestep_scale_multiplier", 1000, num),
            av_ca_timestep_scale_multiplier=field("av_ca_timestep_scale_multiplier", kind=num),
            double_precision=field("frequencies_precision", "float32", allowed=("float64", "float32")) == "float64",
            norm_eps=get("norm_eps", 1e-6, num), gated_attention=get("apply_gated_attention", False, flag),
            cross_attention_adaln=get("cross_attention_adaln", False, flag),
            use_prompt_adaln_single=get("use_prompt_adaln_single", True, flag), ff_bias=get("ff_bias", True, flag),
            audio_ff_bias=get("audio_ff_bias", True, flag),
            use_keyframes_abs_pos_embedding=get("use_keyframes_abs_pos_embedding", False, flag),
            connector=ConnectorConfig.from_metadata(where, metadata))
        config._check(where)
        return config

    def _check(self, where: str) -> None:
        pairs = (("audio_num_attention_heads", self.audio_heads, self.heads, "num_attention_heads (the AV "
                  "cross-attention RoPE uses one head count for both streams)"),
                 ("connector video width", self.connector.video_width, self.cross_attention_dim,
                  "cross_attention_dim"),
                 ("connector audio width", self.connector.audio_width, self.audio_cross_attention_dim,
                  "audio_cross_attention_dim"))
        for what, found, expected, name in pairs:
            if found != expected:
                raise LTX25Error(where, f"config.transformer {what}", found, f"{expected} ({name})")

    def diffusers_kwargs(self) -> dict[str, Any]:
        """`LTX2VideoTransformer3DModel(**kwargs)`: every argument set from the file or from a fixed fact, never
        left to a class default (diffusers' defaults are LTX-2.0's in several places)."""
        return dict(
            in_channels=self.in_channels, out_channels=self.out_channels, patch_size=1, patch_size_t=1,
            num_attention_heads=self.heads, attention_head_dim=self.head_dim,
            cross_attention_dim=self.cross_attention_dim, vae_scale_factors=VIDEO_SCALE,
            pos_embed_max_pos=self.max_pos[0], base_height=self.max_pos[1], base_width=self.max_pos[2],
            gated_attn=self.gated_attention, cross_attn_mod=self.cross_attention_adaln,
            audio_in_channels=self.audio_in_channels, audio_out_channels=self.audio_out_channels,
            audio_patch_size=1, audio_patch_size_t=1, audio_num_attention_heads=self.audio_heads,
            audio_attention_head_dim=self.audio_head_dim, audio_cross_attention_dim=self.audio_cross_attention_dim,
            audio_scale_factor=AUDIO_LATENT_DOWNSAMPLE, audio_pos_embed_max_pos=self.audio_max_pos[0],
            audio_sampling_rate=AUDIO_SAMPLE_RATE, audio_hop_length=MEL_HOP_LENGTH,
            audio_gated_attn=self.gated_attention, audio_cross_attn_mod=self.cross_attention_adaln,
            num_layers=self.num_layers, activation_fn="gelu-approximate", qk_norm="rms_norm_across_heads",
            norm_elementwise_affine=False, norm_eps=self.norm_eps, caption_channels=self.caption_channels,
            attention_bias=True, attention_out_bias=True, rope_theta=self.theta,
            rope_double_precision=self.double_precision, causal_offset=1,
            timestep_scale_multiplier=self.timestep_scale_multiplier,
            cross_attn_timestep_scale_multiplier=self.av_ca_timestep_scale_multiplier,  # the AV gate ×1000
            rope_type="split", use_prompt_embeddings=False, perturbed_attn=False, ff_bias=self.ff_bias,
            audio_ff_bias=self.audio_ff_bias, use_prompt_adaln_single=self.use_prompt_adaln_single,
            use_keyframes_abs_pos_embedding=self.use_keyframes_abs_pos_embedding)


# Native (`model.diffusion_model.*`) → module names, applied in order; `to_native` runs them backwards.
KEY_MAP = KeyMap("LTX-2.5 transformer (DiT + connectors)", renames=CONNECTOR_RENAMES + (
    Rename("model.diffusion_model", "dit"),
    Rename("dit.patchify_proj", "dit.proj_in"),
    Rename("dit.audio_patchify_proj", "dit.audio_proj_in"),
    Rename("dit.adaln_single", "dit.time_embed"),
    Rename("dit.audio_adaln_single", "dit.audio_time_embed"),
    Rename("dit.prompt_adaln_single", "dit.prompt_adaln"),
    Rename("dit.audio_prompt_adaln_single", "dit.audio_prompt_adaln"),
    Rename("dit.av_ca_video_scale_shift_adaln_single", "dit.av_cross_attn_video_scale_shift"),
    Rename("dit.av_ca_audio_scale_shift_adaln_single", "dit.av_cross_attn_audio_scale_shift"),
    Rename("dit.av_ca_a2v_gate_adaln_single", "dit.av_cross_attn_video_a2v_gate"),
    Rename("dit.av_ca_v2a_gate_adaln_single", "dit.av_cross_attn_audio_v2a_gate"),
    Rename("scale_shift_table_a2v_ca_video", "video_a2v_cross_attn_scale_shift_table", anywhere=True),
    Rename("scale_shift_table_a2v_ca_audio", "audio_a2v_cross_attn_scale_shift_table", anywhere=True),
    Rename("q_norm", "norm_q", anywhere=True),
    Rename("k_norm", "norm_k", anywhere=True),
))


class LTX25Transformer(torch.nn.Module):
    """`.dit` (LTX2VideoTransformer3DModel), `.connectors` (LTX25Connectors), `.config`, `.model_version`."""

    def __init__(self, config: TransformerConfig, model_version: str = MODEL_VERSION) -> None:
        super().__init__()
        self.config, self.model_version = config, model_version
        self.dit = LTX2VideoTransformer3DModel(**config.diffusers_kwargs())
        attention.install(self.dit)
        self.connectors = LTX25Connectors(config.connector)
        self._grids: dict[tuple, Grid] = {}
        self._context: tuple | None = None  # (conditioning, device, dtype, (video, audio))

    def streamable_blocks(self) -> list[torch.nn.ModuleList]:
        """The repeated blocks weight streaming may keep on the host (streaming.py): the DiT's transformer blocks."""
        return [self.dit.transformer_blocks]

    def release_caches(self) -> None:
        """Forget the cached positions and conditioning copy (they sit on the compute device)."""
        self._grids.clear()
        self._context = None

    def grid(self, batch: int, frames: int, height: int, width: int, audio_frames: int, fps: float,
             device: torch.device) -> Grid:
        """Positions and keyframe mask for one latent shape, built once and reused every step."""
        key = (batch, frames, height, width, audio_frames, float(fps), str(device))
        if key not in self._grids:
            if len(self._grids) >= 8:
                self._grids.clear()
            self._grids[key] = Grid(video_position_bounds(batch, frames, height, width, fps, device),
                                    audio_position_bounds(batch, audio_frames, device),
                                    first_frame_keyframes_mask(batch, frames, height, width, device))
        return self._grids[key]

    def context(self, cond: Conditioning, device: torch.device, dtype: torch.dtype,
                batch: int = 1) -> tuple[torch.Tensor, ...]:
        """The text context on the DiT's device/dtype for `batch` latents, moved once per conditioning rather than
        every step; one prompt's context serves every latent of the batch, as in ComfyUI."""
        key = (device, dtype, batch)
        if self._context is None or self._context[0] is not cond or self._context[1] != key:
            video, audio = cond.video.to(device, dtype), cond.audio.to(device, dtype)
            if video.shape[0] == 1 and batch > 1:
                video, audio = video.expand(batch, -1, -1), audio.expand(batch, -1, -1)
            self._context = (cond, key, (video, audio))
        return self._context[2]


def _require_connectors(info) -> None:
    """Presence decides: the file's keys, not its config, say whether it carries the connectors."""
    present = [p for p in CONNECTOR_PREFIXES if any(k.startswith(p) for k in info.header.tensors)]
    if len(present) == 2:
        return
    found = "absent" if not present else f"only {present[0].rstrip('.').rsplit('.', 1)[-1]}"
    raise LTX25Error(info.path, "the embeddings connectors", found,
                     "both model.diffusion_model.video_embeddings_connector.* and …audio_embeddings_connector.*",
                     "The file carries no connectors; LTX-2.5 split transformer files carry both (a DiT-only "
                     "repack cannot condition on a prompt)." if not present else
                     "Half of the connector pair is missing: the file is damaged or a partial repack; re-download it.")


def load_transformer(path: str | os.PathLike, dtype: torch.dtype | None = torch.bfloat16,
                     fp8_compute: bool = False) -> LTX25Transformer:
    """Inspect → parse config → read → strict load. A float `dtype`: the whole file in it, quantized weights
    dequantized. None ('as stored'): quantized Linears stay quantized on the device (QuantizedLinear), the rest bf16.
    `fp8_compute` (opt-in, with bf16): after the bf16 load, the DiT blocks' Linears become FP8 layers with per-row
    weight scales (`quantized_linear.fp8_compute_`); everything outside the 48 blocks stays bf16."""
    if fp8_compute and dtype != torch.bfloat16:
        raise LTX25Error(path, "the weight dtype for FP8 compute", dtype, "torch.bfloat16",
                         "FP8 compute quantizes a bf16 model: its GEMMs take bf16 activations.")
    info = expect_kind(path, Kind.TRANSFORMER)
    config = TransformerConfig.from_metadata(info.path, info.header.metadata)
    _require_connectors(info)
    build = lambda: LTX25Transformer(config, info.model_version or MODEL_VERSION)  # noqa: E731
    if dtype is None:
        # denoise reads proj_in's weight for the compute device and dtype: it stays a float Linear.
        return load_keeping_quantized(info.path, build, read_state_dict(info.path, keep_quantized=True),
                                      info.header.metadata, KEY_MAP, keep_float=("dit.proj_in",))
    model = load_strict(info.path, build, read_state_dict(info.path, dtype), KEY_MAP, dtype)
    if fp8_compute:
        fp8_compute_(model.dit.transformer_blocks)
    return model


def check_denoise_inputs(config: TransformerConfig, video: torch.Tensor, audio: torch.Tensor, cond: Conditioning,
                         where: str = "denoise") -> None:
    """Shapes the DiT accepts; a one-prompt conditioning serves a batch of any size."""
    b = video.shape[0]
    cb = b if cond.video.shape[0] != 1 else 1
    checks = (("video latent", tuple(video.shape[:2]), (b, config.in_channels), video.ndim == 5),
              ("audio latent", (audio.shape[0], audio.shape[1] * audio.shape[3]) if audio.ndim == 4 else None,
               (b, config.audio_in_channels), audio.ndim == 4),
              ("video context", (cond.video.shape[0], cond.video.shape[2]), (cb, config.cross_attention_dim), True),
              ("audio context", (cond.audio.shape[0], cond.audio.shape[2]), (cb, config.audio_cross_attention_dim),
               True))
    for what, found, expected, ok in checks:
        if not ok or found != expected:
            raise LTX25Error(where, f"the {what} (batch, channels)", found, expected,
                             "Latents are [B,128,F',H',W'] and [B,8,T,16]; the conditioning holds one prompt or "
                             "one per latent of the batch (prompts separated by --- lines, batch on Empty Latent).")


def velocity(model: LTX25Transformer, video_tokens: torch.Tensor, audio_tokens: torch.Tensor, steps: Timesteps,
             context: tuple[torch.Tensor, torch.Tensor], grid: Grid,
             attention: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One DiT forward on tokens: video `[B, N, 128]`, audio `[B, T, 128]` (weights' dtype), timesteps `steps` (σ
    units, float32; `guides.uniform_timesteps` for text-to-video) → velocities of the same shapes. `attention`: the
    video self-attention's additive bias `[N, N]` (`GuidedStage.attention_bias`; None: unmasked). Pure tensor work
    (no host syncs), so it can be captured in a CUDA graph with `steps`, `grid` and `attention` as its inputs."""
    scale = model.config.timestep_scale_multiplier
    # Per-token timesteps are σ·denoise_mask; a stream whose tokens share one σ passes it once per sample, which
    # diffusers broadcasts: the same numbers at 1/N of the AdaLN cost.
    t_video, t_audio = steps.video * scale, steps.audio * scale
    with compat.av_scale_shift_from_own_timesteps(model.dit, t_video, t_audio), \
            biased_video_self_attention(model.dit.transformer_blocks, attention):
        return model.dit(hidden_states=video_tokens, audio_hidden_states=audio_tokens,
                         encoder_hidden_states=context[0], audio_encoder_hidden_states=context[1], timestep=t_video,
                         audio_timestep=t_audio, sigma=steps.video_sigma * scale, audio_sigma=steps.audio_sigma * scale,
                         video_coords=grid.video_coords, audio_coords=grid.audio_coords,
                         video_keyframes_mask=grid.keyframes, use_cross_timestep=True, return_dict=False)


def forward_inputs(model: LTX25Transformer, video: torch.Tensor, audio: torch.Tensor, sigma: float, fps: float,
                   guided: GuidedStage | None, device: torch.device) -> tuple[Timesteps, Grid]:
    """The timesteps and positions of one forward on `[B, 128, F, H', W']` / `[B, 8, T, 16]` latents at `sigma`:
    uniform and the cached grid without guides, the guided stage's per-token ones with."""
    b, _, f, h, w = video.shape
    if guided is None:
        sigma_t = torch.full((b,), float(sigma), dtype=torch.float32, device=device)
        return uniform_timesteps(sigma_t), model.grid(b, f, h, w, audio.shape[2], fps, device)
    guided.check_latents(video, audio)
    return guided.timesteps(sigma), guided.grid


def denoise(model: LTX25Transformer, video: torch.Tensor, audio: torch.Tensor, sigma: float, cond: Conditioning,
            fps: float, guided: GuidedStage | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 predictions for noisy latents at `sigma`: video `[B, 128, F', H', W']`, audio `[B, 8, T, 16]` (normalized
    latents, any float dtype) → (x0 video, x0 audio), same layouts, float32, on the inputs' devices. With `guided`
    (guides.GuidedStage, on the DiT's device) the video carries its appended guide frames, every token gets its
    own timestep σ·mask, and a reference's attention strength biases the video self-attention.

    `x0 = latent − v·t` per token in float32 (the reference X0Model). The text context gets no mask (docs/MODEL.md
    §4.1 step 5). The blend that keeps conditioned tokens (`GuidedStage.hold`) is the sampler's, after guidance.
    """
    check_denoise_inputs(model.config, video, audio, cond)
    with torch.inference_mode():
        weight = model.dit.proj_in.weight
        device, dtype = weight.device, weight.dtype
        steps, grid = forward_inputs(model, video, audio, sigma, fps, guided, device)
        attention = None if guided is None else guided.attention_bias(dtype, device)
        v, a = velocity(model, patchify_video(video).to(device, dtype), patchify_audio(audio).to(device, dtype),
                        steps, model.context(cond, device, dtype, video.shape[0]), grid, attention)
        return x0_from_velocity(video, audio, v, a, sigma, device, guided)


def x0_from_velocity(video: torch.Tensor, audio: torch.Tensor, v: torch.Tensor, a: torch.Tensor, sigma: float,
                     device: torch.device, guided: GuidedStage | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference X0Model: `x0 = latent − v·t` in float32 with t = σ (or σ·mask per token with `guided`), from
    velocity tokens `v` [B, T, 128] and `a`, back in the latent layouts on the inputs' devices. Shared by the eager
    and the CUDA-graph denoisers (bit-identical)."""
    t_video, t_audio = (float(sigma), float(sigma)) if guided is None else guided.token_sigmas(sigma)
    x0_video = video.to(device, torch.float32) - unpatchify_video(v, video.shape).float() * t_video
    x0_audio = audio.to(device, torch.float32) - unpatchify_audio(a, audio.shape).float() * t_audio
    return x0_video.to(video.device), x0_audio.to(audio.device)
