"""The LTX-2.5 video VAE encoder (docs/MODEL.md §17.1, §17.2): pixels → normalized latent, loaded from either
video-VAE file.

Both released video-VAE files bundle the same conv encoder (`encoder.*`) and the latent statistics
(`per_channel_statistics.*`). The conv-VAE file describes the encoder in its flat `config.vae` (`encoder_blocks`,
`latent_channels`, …), the diffusion-VAE file in the nested `config.vae.encoder` (`blocks`, `out_channels`, …); the
reference reads both, and so does `VideoEncoderConfig`. The network is diffusers' `LTX2VideoEncoder3d` (its output
equals the reference's `VideoEncoder` for the 2.5 block layout); the pack adds the config reading, the key map, the
normalization and the tiles.

Native → diffusers. The native encoder is one flat list of nine blocks: res_x(4), compress_space_res(×2), res_x(6),
compress_time_res(×2), res_x(4), compress_all_res(×2), res_x(2), compress_all_res(×1), res_x(2) (the 2.3/2.5 list).
diffusers groups it as four down blocks (resnets, then a downsampler) and a mid block:
`down_blocks.0 → down_blocks.0.resnets`, `1 → down_blocks.0.downsamplers.0`, …, `8 → mid_block.resnets`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoEncoder3d

from ..decode.conv_tiling import CostModel, TilePlan, plan_tiles, temporal_pixels
from ..decode.tiling import TilingRequest, blend_weights
from ..device_memory import free_bytes, weight_bytes
from ..errors import LTX25Error
from ..files.assets import Kind, expect_kind, read_state_dict
from ..files.config import config_field
from ..files.keymap import Drop, KeyMap, check_unread, load_strict
from ..files.vae_layout import (block_params, check_compression, flat_block_renames, statistics_renames,
                                unused_statistics)
from ..geometry import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION, VIDEO_CHANNELS, latent_frames
from ..latents import normalize_video
from ..stop_points import checked_before
from ..cpu_convolutions import float32_convolutions

DOWNSAMPLER_KINDS = {"compress_space_res": "spatial", "compress_time_res": "temporal",
                     "compress_all_res": "spatiotemporal"}
_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}
# Both leave one log-variance channel after the 128 means, which is what diffusers' encoder builds; the means (all
# the pack uses) are the first 128 channels either way.
LOG_VAR_KINDS = ("uniform", "constant")
# The reference refuses tiled encodes with less overlap than this: the tiles' zero-padded borders must fade out.
MIN_OVERLAP_FRAMES, MIN_OVERLAP_PIXELS = 16, 64
READ_PREFIXES = ("encoder.", "per_channel_statistics.")
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")

# native flat `down_blocks.{0..8}` → diffusers' four down blocks (resnets, then their downsampler) and mid block
_ENCODER_MODULES = ("down_blocks.0", "down_blocks.0.downsamplers.0", "down_blocks.1", "down_blocks.1.downsamplers.0",
                    "down_blocks.2", "down_blocks.2.downsamplers.0", "down_blocks.3", "down_blocks.3.downsamplers.0",
                    "mid_block")
KEY_MAP = KeyMap(
    "video VAE encoder",
    renames=flat_block_renames("encoder", "down_blocks", _ENCODER_MODULES) + statistics_renames(),
    drops=(
        Drop(r"decoder\..*", "the file's decoder (conv or diffusion): LTX-2.5 Load Video VAE builds it, the encoder "
                             "uses none of it"),
        unused_statistics("", "dataset statistics the normalization does not use"),
    ),
)


@dataclass(frozen=True)
class VideoEncoderConfig:
    """The encoder's part of `config.vae` (native names), read as the reference reads it: from the flat block of the
    conv-VAE file or from `config.vae.encoder` of the diffusion-VAE file. Defaults are the reference's."""
    latent_channels: int                           # 128
    patch_size: int                                # 4
    res_layers: tuple[int, ...]                    # the five res_x stages, native order: (4, 6, 4, 2, 2)
    downsamplers: tuple[tuple[str, int], ...]      # the four (diffusers kind, channel multiplier), native order
    spatial_padding_mode: str                      # "zeros"
    latent_log_var: str                            # "constant" in the 2.5 files

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any], nested: bool) -> "VideoEncoderConfig":
        """`nested`: the diffusion-VAE layout (`config.vae.encoder` with `blocks`, `out_channels`,
        `base_channels`); else the conv-VAE's flat one (`encoder_blocks`, `latent_channels`,
        `encoder_base_channels`)."""
        config_field(where, metadata, "vae", kind=Mapping, hint="The video VAE file keeps its config there.")
        base = "vae.encoder" if nested else "vae"
        if nested:
            config_field(where, metadata, base, kind=Mapping, hint="The diffusion VAE file describes its bundled "
                         "encoder there; without it the encoder's layout is unknown.")

        def field(key: str, *args, **kwargs):
            return config_field(where, metadata, f"{base}.{key}", *args, **kwargs)

        fixed = {"dims": 3, "in_channels": 3, "norm_layer": "pixel_norm"}
        for key, wanted in fixed.items():
            field(key, wanted, allowed=(wanted,), hint="LTX-2.5 video VAE files ship this value; the file is "
                                                       "from another model.")
        out_key = "out_channels" if nested else "latent_channels"
        latent_channels = field(out_key, VIDEO_CHANNELS, allowed=(VIDEO_CHANNELS,),
                                hint="LTX-2.5 latents have 128 channels.")
        # The reference starts the encoder at the latent width and never reads the base width; ComfyUI core builds
        # from the base width. The released files give both the same value: refuse a file where they would differ.
        field("base_channels" if nested else "encoder_base_channels", latent_channels, allowed=(latent_channels,),
              hint="The encoder's first width equals its latent channels in the LTX-2.5 files.")
        log_var = field("latent_log_var", "uniform", allowed=LOG_VAR_KINDS,
                        hint="LTX-2.5 files ship 'constant'; other kinds change the encoder's output layout.")
        # the flat layout also has an older name for it, which the reference falls back to
        padding = field("spatial_padding_mode", None)
        if padding is None and not nested:
            padding = field("encoder_spatial_padding_mode", None)
        padding = "zeros" if padding is None else padding
        if padding not in PADDING_MODES:
            raise LTX25Error(where, f"config.{base}.spatial_padding_mode", repr(padding), " or ".join(PADDING_MODES))
        blocks_key = "blocks" if nested else "encoder_blocks"
        raw = field(blocks_key, None)
        if raw is None and nested:  # the reference also accepts `encoder_blocks` inside the nested block
            blocks_key, raw = "encoder_blocks", field("encoder_blocks", None)
        if raw is None:
            field("blocks" if nested else "encoder_blocks")  # the missing-value error, naming the key
        blocks = [block_params(where, f"config.{base}.{blocks_key}", b) for b in raw] if isinstance(raw, list) else []
        names = [n for n, _ in blocks]
        if len(blocks) != 9 or any(n != "res_x" for n in names[::2]) or any(n not in DOWNSAMPLER_KINDS
                                                                          for n in names[1::2]):
            raise LTX25Error(where, f"config.{base}.{blocks_key}", names or raw,
                             "nine blocks res_x, compress_*_res, res_x, …, res_x (the 2.3/2.5 layout)")
        # the reference's default multiplier for a *_res block is 2
        downsamplers = tuple((DOWNSAMPLER_KINDS[n], int(p.get("multiplier", 2))) for n, p in blocks[1::2])
        patch = int(field("patch_size", 4))
        check_compression(where, f"config.{base} compression (patch_size × encoder downsamplers)", patch,
                          (_STRIDES[kind] for kind, _ in downsamplers))
        return cls(latent_channels, patch, tuple(int(p["num_layers"]) for _, p in blocks[::2]), downsamplers,
                   padding, log_var)

    def diffusers_kwargs(self) -> dict[str, Any]:
        """`LTX2VideoEncoder3d` arguments, every one passed: each down block widens by its multiplier from the
        latent width (diffusers' `conv_in` maps the patchified pixels to `out_channels`, as the reference does)."""
        widths, width = [], self.latent_channels
        for _, multiplier in self.downsamplers:
            width *= multiplier
            widths.append(width)
        return dict(in_channels=3, out_channels=self.latent_channels, block_out_channels=tuple(widths),
                    down_block_types=("LTX2VideoDownBlock3D",) * 4, spatio_temporal_scaling=(True,) * 4,
                    layers_per_block=self.res_layers, downsample_type=tuple(k for k, _ in self.downsamplers),
                    patch_size=self.patch_size, patch_size_t=1, resnet_norm_eps=1e-6, is_causal=True,
                    spatial_padding_mode=self.spatial_padding_mode)


class VideoEncoder(torch.nn.Module):
    """LTX25_VIDEO_ENCODER: `encoder` (diffusers `LTX2VideoEncoder3d`), the per-channel statistics `latents_mean`,
    `latents_std` `[128]` (from `per_channel_statistics.{mean,std}-of-means`, the ones the decoders undo) and the
    file's `model_version`, which sets the image pre-compression (`image_prep.image_crf`)."""
    kind = "encoder"

    def __init__(self, config: VideoEncoderConfig, model_version: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.model_version = model_version
        self.encoder = LTX2VideoEncoder3d(**config.diffusers_kwargs())
        self.register_buffer("latents_mean", torch.zeros(config.latent_channels))
        self.register_buffer("latents_std", torch.ones(config.latent_channels))


def load_video_encoder(path: str, dtype: torch.dtype | None = None) -> VideoEncoder:
    """Conv-VAE or diffusion-VAE file → `VideoEncoder` (eval, no grad), strictly: every `encoder.*` tensor and both
    statistics used, the decoder's tensors dropped by name. `dtype` casts the weights (None: as stored)."""
    info = expect_kind(path, (Kind.CONV_VAE, Kind.DIFFUSION_VAE))
    if not any(k.startswith("encoder.") for k in info.header.tensors):
        raise LTX25Error(info.path, "the encoder tensors (encoder.*)", "absent", "the bundled conv encoder",
                         "This copy of the file was stripped to its decoder; use the official file.")
    config = VideoEncoderConfig.from_metadata(info.path, info.header.metadata, nested=info.kind is Kind.DIFFUSION_VAE)
    check_unread(info.path, info.header.tensors, READ_PREFIXES, KEY_MAP)
    return load_strict(info.path, lambda: VideoEncoder(config, info.model_version),
                       read_state_dict(info.path, prefixes=READ_PREFIXES), KEY_MAP, dtype)


# ------------------------------------------------------------------------------------------------------ encode
def check_pixels(pixels: object, where: str) -> torch.Tensor:
    """Frames `[B, F, H, W, 3]` (floating, in [0, 1]) the encoder can take: F = 8k + 1, H and W positive multiples
    of 32; else an error naming `where`."""
    if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
        found = f"a {pixels.dtype} tensor" if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise LTX25Error(where, "the frames", found, "a float tensor [B, F, H, W, 3] in [0, 1] (ComfyUI IMAGE "
                         "frames)", "Connect an IMAGE (a Load Image or a video's frames).")
    if pixels.ndim != 5 or pixels.shape[-1] != 3:
        raise LTX25Error(where, "the frames' shape", list(pixels.shape), "[B, F, H, W, 3] (RGB frames)",
                         "A LATENT is already encoded; an IMAGE with an alpha channel needs its RGB only.")
    _batch, frames, height, width, _ = pixels.shape
    if 0 in pixels.shape:
        raise LTX25Error(where, "the frames' shape", list(pixels.shape), "[B ≥ 1, F ≥ 1, H ≥ 32, W ≥ 32, 3]",
                         "An empty image has nothing to encode.")
    if (frames - 1) % TEMPORAL_COMPRESSION:
        lower = (frames - 1) // TEMPORAL_COMPRESSION * TEMPORAL_COMPRESSION + 1
        raise LTX25Error(where, "the frame count", frames, "8k + 1 (1, 9, 17, …, 121, …)",
                         f"The encoder packs the first frame alone and then 8 frames per latent frame; keep {lower} "
                         f"frames or add {lower + TEMPORAL_COMPRESSION - frames}.")
    for name, value in (("height", height), ("width", width)):
        if value % SPATIAL_COMPRESSION:
            lower = value // SPATIAL_COMPRESSION * SPATIAL_COMPRESSION
            raise LTX25Error(where, f"the frames' {name}", value, f"a multiple of {SPATIAL_COMPRESSION} (one latent "
                             f"cell is {SPATIAL_COMPRESSION}×{SPATIAL_COMPRESSION} px)",
                             f"Resize or crop to {max(lower, SPATIAL_COMPRESSION)} or {lower + SPATIAL_COMPRESSION} "
                             "first (the encode node's width/height inputs do it).")
    return pixels


def latent_shape(pixel_shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """`[B, F, H, W(, 3)]` frames → the `[B, 128, F', H/32, W/32]` latent they encode to."""
    batch, frames, height, width = pixel_shape[:4]
    return batch, VIDEO_CHANNELS, latent_frames(frames), height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION


def _cost(encoder: VideoEncoder, batch: int) -> CostModel:
    """Encoder working memory per input pixel·frame: ~12 live maps of the first stage (the latent width at a
    quarter of the resolution: 128/4² values per pixel) plus 24 B of fp32 input copies — the decoders' rule for
    their last stage, pending a measurement (bench/bench_encode.py); the fp32 latent accumulator is 128·4 B per
    8·32·32 pixel voxels."""
    itemsize = next(encoder.encoder.parameters()).element_size()
    per_voxel = 12 * encoder.config.latent_channels / encoder.config.patch_size ** 2 * itemsize + 24
    accumulator = encoder.config.latent_channels * 4 / (TEMPORAL_COMPRESSION * SPATIAL_COMPRESSION ** 2)
    return CostModel(per_voxel * batch, accumulator * batch)


def _check_overlaps(request: TilingRequest, where: str) -> None:
    if request.mode == "off":
        return
    for name, value, least in (("overlap_frames", request.overlap_frames, MIN_OVERLAP_FRAMES),
                               ("overlap_pixels", request.overlap_pixels, MIN_OVERLAP_PIXELS)):
        if value < least:
            raise LTX25Error(f"{where}.{name}", name, value, f"at least {least} when tiling",
                             "The reference refuses smaller encoder overlaps: each tile's zero-padded border must "
                             "fade out inside its neighbour.")


def encode_plan(encoder: VideoEncoder, pixel_shape: tuple[int, ...], request: TilingRequest,
                memory_budget: int | None) -> TilePlan:
    """The tiles `encode_video` will use for frames `[B, F, H, W, 3]`: latent intervals along (F', H', W'), planned
    as the conv decoder plans its tiles (auto: untiled when the estimate fits `memory_budget`, None = ample)."""
    shape = latent_shape(tuple(pixel_shape))
    return plan_tiles(shape[2:], request, memory_budget, _cost(encoder, shape[0]))


def working_memory(encoder: VideoEncoder, pixel_shape: tuple[int, ...], request: TilingRequest | None = None) -> int:
    """Bytes an encode of `[B, F, H, W, 3]` needs beyond the weights: the manual tiles' for a `manual` request, else
    the untiled encode's (what model management is asked to free; auto then tiles only if that much is not free)."""
    request = request if request is not None and request.mode == "manual" else TilingRequest("off")
    return encode_plan(encoder, tuple(pixel_shape), request, None).estimate_bytes


def encode_video(encoder: VideoEncoder, pixels: torch.Tensor, request: TilingRequest = TilingRequest(),
                 free_memory: int | None = None, on_step: Callable[[int, int], None] | None = None,
                 where: str = "encode_video", check: Callable[[], None] | None = None,
                 on_plan: Callable[[str], None] | None = None) -> torch.Tensor:
    """Frames `[B, F, H, W, 3]` in [0, 1] (F = 8k+1, H and W multiples of 32) → NORMALIZED latent
    `[B, 128, (F−1)/8 + 1, H/32, W/32]` float32 on the CPU: `(means − latents_mean) / latents_std` per channel, what
    the decoders un-normalize. The first frame is encoded alone (the causal first latent frame).

    The frames go to the encoder as `2x − 1` in its dtype, tile by tile (`encode_plan`; auto: untiled when the
    estimate fits the request's budget, or `free_memory`, bytes free on the encoder's device with its weights
    loaded, when that is 0; None = ask the device, ample on the CPU). The reference's tiling: tiles cut on the
    latent grid, each encoded on its own from exactly its pixels, blended in latent space with trapezoid weights
    that sum to one; a temporal tile after the first starts one latent frame early and gives that frame weight 0 —
    it is made from the tile's first pixel frame alone. `on_step(done, total)` runs after every tile (it raises to
    interrupt); `check()` before each of the encoder's blocks; `on_plan(line)` gets the plan (`TilePlan.describe`)
    before the first tile. `where` names the node in errors.
    """
    pixels = check_pixels(pixels, f"{where}.pixels")
    request.check(where)
    _check_overlaps(request, where)
    param = next(encoder.encoder.parameters())
    device, dtype = param.device, param.dtype
    budget = request.budget_bytes(weight_bytes(encoder), free_bytes(device) if free_memory is None else free_memory,
                                  where)
    plan = encode_plan(encoder, tuple(pixels.shape), request, budget)
    if on_plan is not None:
        on_plan(plan.describe(where, budget))
    batch, channels, frames, height, width = latent_shape(tuple(pixels.shape))
    weights_t = blend_weights(list(plan.frames), frames, [a > 0 for a, _ in plan.frames])
    weights_h, weights_w = blend_weights(list(plan.rows), height), blend_weights(list(plan.cols), width)
    blocks = [*encoder.encoder.down_blocks, encoder.encoder.mid_block] if check is not None else []
    done = 0
    with torch.inference_mode(), checked_before(blocks, check), float32_convolutions(device):
        means = torch.zeros(batch, channels, frames, height, width, dtype=torch.float32, device=device)
        for (ti, (t0, t1)), (ri, (r0, r1)), (ci, (c0, c1)) in _indexed(plan):
            p0, p1 = temporal_pixels((t0, t1))
            tile = pixels[:, p0:p1, r0 * SPATIAL_COMPRESSION:r1 * SPATIAL_COMPRESSION,
                          c0 * SPATIAL_COMPRESSION:c1 * SPATIAL_COMPRESSION]
            x = tile.to(device, torch.float32).mul(2.0).sub(1.0).permute(0, 4, 1, 2, 3).to(dtype)  # [B, 3, f, h, w]
            out = encoder.encoder(x)[:, :channels].float()      # the means; the log-variance channels follow
            blend = (weights_t[ti].to(device).view(-1, 1, 1) * weights_h[ri].to(device).view(1, -1, 1)
                     * weights_w[ci].to(device).view(1, 1, -1))
            means[:, :, t0:t1, r0:r1, c0:c1].addcmul_(out, blend)
            del x, out
            done += 1
            if on_step is not None:
                on_step(done, plan.count)
        latent = normalize_video(means, encoder.latents_mean, encoder.latents_std)
    return latent.cpu()


def _indexed(plan: TilePlan):
    """(index, interval) per axis for every tile, time-major."""
    for t in enumerate(plan.frames):
        for r in enumerate(plan.rows):
            for c in enumerate(plan.cols):
                yield t, r, c
