"""The LTX-2.5 conv VAE decoder (docs/MODEL.md §9, §12): diffusers' `LTX2VideoDecoder3d`, configured from the file's
flat `config.vae` (`_class_name: CausalVideoAutoencoder`), loaded strictly, with the file's per-channel statistics.

The container holds the decoder and the statistics; the file's `encoder.*` tensors are on the drop list here (the
encoder is loaded on its own, by `nodes/ltx/encode/video_encoder.py`). `decode_conv` runs the tiles
`conv_tiling.plan_tiles` lays out.

Native → diffusers. The native decoder is one flat list of nine blocks, run in reverse: res_x(2), compress_all(×2),
res_x(2), compress_all(×1), res_x(4), compress_time(×2), res_x(6), compress_space(×2), res_x(4) (the 2.3/2.5 list).
diffusers groups it as `mid_block` + four `up_blocks`, each an upsampler followed by its resnets, so
`up_blocks.0 → mid_block`, `1 → up_blocks.0.upsamplers.0`, `2 → up_blocks.0.resnets`, …, `8 → up_blocks.3.resnets`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoDecoder3d

from ..files.assets import Kind, expect_kind, read_state_dict
from ..files.config import config_field
from .conv_tiling import CostModel, TilePlan, plan_tiles, spatial_pixels, temporal_pixels, tile_batch
from .tiling import TilingRequest, work_ratio
from .stats import DecodeStats
from ..errors import LTX25Error
from ..files.keymap import Drop, KeyMap, load_strict
from ..files.vae_layout import (block_params, check_compression, flat_block_renames, statistics_renames,
                                unused_statistics)
from ..latents import check_video_latent, denormalize_video
from ..device_memory import free_bytes, start_meter, weight_bytes
from ..geometry import VIDEO_CHANNELS as LATENT_CHANNELS
from .host_frames import HostFrames, host_copier
from ..stop_points import checked_before
from ..cpu_convolutions import float32_convolutions

UPSAMPLER_KINDS = {"compress_all": "spatiotemporal", "compress_time": "temporal", "compress_space": "spatial"}
_STRIDES = {"spatiotemporal": (2, 2, 2), "temporal": (2, 1, 1), "spatial": (1, 2, 2)}
# Native decoder block index → diffusers module, for the nine-block 2.3/2.5 layout (checked by the config).
_DECODER_MODULES = ("mid_block", "up_blocks.0.upsamplers.0", "up_blocks.0", "up_blocks.1.upsamplers.0", "up_blocks.1",
                    "up_blocks.2.upsamplers.0", "up_blocks.2", "up_blocks.3.upsamplers.0", "up_blocks.3")

KEY_MAP = KeyMap(
    "conv video VAE decoder",
    renames=flat_block_renames("decoder", "up_blocks", _DECODER_MODULES) + statistics_renames(),
    drops=(
        Drop(r"encoder\..*", "the bundled encoder: LTX-2.5 Load Video Encoder builds it (encode/)"),
        unused_statistics("", "dataset statistics the decoder does not use (diffusers' converter drops them too)"),
    ),
)


@dataclass(frozen=True)
class ConvVAEConfig:
    """The file's flat `config.vae` (native names), decoder side. Defaults are the reference builder's ([L]
    `_build_conv_video_decoder`), never diffusers' (whose decoder pads `reflect`, is causal in
    `AutoencoderKLLTX2Video`, and has residual ×2 upsamplers — the 2.0 layout)."""
    latent_channels: int
    patch_size: int
    decoder_base_channels: int
    causal_decoder: bool
    spatial_padding_mode: str
    res_layers: tuple[int, ...]                # the five res_x stages, native order
    upsamplers: tuple[tuple[str, int, bool], ...]  # the four upsamplers, native order: (name, multiplier, residual)

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any]) -> "ConvVAEConfig":
        field = lambda key, *a, **k: config_field(where, metadata, f"vae.{key}", *a, **k)  # noqa: E731
        config_field(where, metadata, "vae", kind=Mapping, hint="The conv VAE file keeps its config there.")
        class_name = field("_class_name", None)
        if class_name != "CausalVideoAutoencoder":
            raise LTX25Error(where, "config.vae._class_name", class_name, "'CausalVideoAutoencoder'",
                             "A CausalDiffusionVAE file is the diffusion decoder: load it for the Diffusion VAE "
                             "Decode node." if class_name == "CausalDiffusionVAE" else "")
        fixed = {"dims": (3, 3), "in_channels": (3, 3), "out_channels": (3, 3),
                 "norm_layer": ("pixel_norm", "pixel_norm"), "timestep_conditioning": (True, False),
                 "latent_channels": (LATENT_CHANNELS, LATENT_CHANNELS)}
        for key, (default, wanted) in fixed.items():
            field(key, default, allowed=(wanted,),
                  hint="LTX-2.5 conv VAE files ship this value; the file is from another model.")
        blocks = [block_params(where, "config.vae.decoder_blocks", b) for b in field("decoder_blocks", [])]
        names = [n for n, _ in blocks]
        if len(blocks) != 9 or any(n != "res_x" for n in names[::2]) or any(n not in UPSAMPLER_KINDS
                                                                          for n in names[1::2]):
            raise LTX25Error(where, "config.vae.decoder_blocks", names,
                             "nine blocks res_x, compress_*, res_x, …, res_x (the 2.3/2.5 layout)")
        if any(p.get("inject_noise", False) for _, p in blocks[::2]):
            raise LTX25Error(where, "config.vae.decoder_blocks inject_noise", True, "false (LTX-2.5)")
        upsamplers = tuple((n, int(p.get("multiplier", 1)), bool(p.get("residual", False))) for n, p in blocks[1::2])
        patch = int(field("patch_size", 4))
        check_compression(where, "config.vae compression (patch_size × decoder upsamplers)", patch,
                          (_STRIDES[UPSAMPLER_KINDS[n]] for n, _, _ in upsamplers))
        padding = field("spatial_padding_mode", "reflect", allowed=("zeros", "reflect", "replicate", "circular"))
        return cls(LATENT_CHANNELS, patch, int(field("decoder_base_channels", 128)),
                   bool(field("causal_decoder", False)), padding,
                   tuple(int(p["num_layers"]) for _, p in blocks[::2]), upsamplers)

    def decoder_kwargs(self) -> dict[str, Any]:
        """`LTX2VideoDecoder3d` arguments, every one passed. diffusers reverses the per-block tuples itself (so they
        go in native order) EXCEPT `upsample_type`, which it reads in decoding order."""
        factors = [m for _, m, _ in self.upsamplers]
        bottleneck = self.decoder_base_channels * math.prod(factors)
        widths = [bottleneck]                       # input width of each upsampler, decoding order
        for factor in reversed(factors[1:]):
            widths.append(widths[-1] // factor)
        return dict(
            in_channels=self.latent_channels, out_channels=3, block_out_channels=tuple(reversed(widths)),
            spatio_temporal_scaling=(True,) * 4, layers_per_block=self.res_layers,
            upsample_type=tuple(UPSAMPLER_KINDS[n] for n, _, _ in reversed(self.upsamplers)),
            patch_size=self.patch_size, patch_size_t=1, resnet_norm_eps=1e-6, is_causal=self.causal_decoder,
            inject_noise=(False,) * 5, timestep_conditioning=False,
            upsample_residual=tuple(r for _, _, r in self.upsamplers), upsample_factor=tuple(factors),
            spatial_padding_mode=self.spatial_padding_mode)


class ConvVideoVAE(torch.nn.Module):
    """LTX25_VIDEO_VAE of kind "conv": `decoder` (diffusers `LTX2VideoDecoder3d`) and the per-channel statistics
    `latents_mean`, `latents_std` `[128]` (from `per_channel_statistics.{mean,std}-of-means`), which the latent
    upsampler reads from whichever video VAE is connected."""
    kind = "conv"

    def __init__(self, config: ConvVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = LTX2VideoDecoder3d(**config.decoder_kwargs())
        self.register_buffer("latents_mean", torch.zeros(config.latent_channels))
        self.register_buffer("latents_std", torch.ones(config.latent_channels))


def load_conv_vae(path: str, dtype: torch.dtype | None = None) -> ConvVideoVAE:
    """Native conv video VAE file → `ConvVideoVAE` (eval, no grad). Refuses a diffusion-VAE or other file by kind."""
    info = expect_kind(path, Kind.CONV_VAE)
    config = ConvVAEConfig.from_metadata(info.path, info.header.metadata)
    return load_strict(info.path, lambda: ConvVideoVAE(config), read_state_dict(info.path), KEY_MAP, dtype)


# ------------------------------------------------------------------------------------------------------ decode
def decode_plan(vae: ConvVideoVAE, latent_shape: tuple[int, ...], request: TilingRequest,
                memory_budget: int | None) -> TilePlan:
    """The tiles `decode_conv` will use for a `[B, 128, F', H', W']` latent (batch items decode together)."""
    return plan_tiles(tuple(latent_shape[2:]), request, memory_budget, _cost(vae, latent_shape[0]))


def working_memory(vae: ConvVideoVAE, latent_shape: tuple[int, ...], request: TilingRequest | None = None) -> int:
    """Bytes a decode of `[B, 128, F', H', W']` needs beyond the weights: the manual tiles' for a `manual` request,
    else the untiled decode's — what model management is asked to free before the decode (auto then tiles only if
    even that much is not free)."""
    request = request if request is not None and request.mode == "manual" else TilingRequest("off")
    return decode_plan(vae, tuple(latent_shape), request, None).estimate_bytes


def tiles_within(vae: ConvVideoVAE, latent_shape: tuple[int, ...], request: TilingRequest,
                 budget: int) -> tuple[int, float] | None:
    """(estimated bytes, work ratio) of the `auto` tiles `decode_conv` plans within `budget` bytes of working
    memory (the request's overlaps), None when even its smallest tiles do not fit."""
    plan = decode_plan(vae, tuple(latent_shape), dataclasses.replace(request, mode="auto"), budget)
    if plan.estimate_bytes > budget:
        return None
    spans = [[stop - start for start, stop in axis] for axis in (plan.frames, plan.rows, plan.cols)]
    return plan.estimate_bytes, work_ratio(spans, plan.latent_shape)


def _cost(vae: ConvVideoVAE, batch: int) -> CostModel:
    """Decoder working memory per output pixel·frame: ~12 live maps of the last stage (base width at a quarter of
    the resolution: base/patch² values per pixel) — measured 7.6 GiB for 768×512×121 bf16 (diffusers, 2.0 layout,
    same last stage) — plus 24 B of fp32 RGB output copies; 12 B per voxel of the fp32 group buffer."""
    itemsize = next(vae.decoder.parameters()).element_size()
    per_voxel = 12 * vae.config.decoder_base_channels / vae.config.patch_size ** 2 * itemsize + 24
    return CostModel(per_voxel * batch, 12.0 * batch)


READBACK_FRAMES = 8   # frames per piece when a shifted last tile's overlap comes back from host memory


def decode_conv(vae: ConvVideoVAE, latent: torch.Tensor, request: TilingRequest = TilingRequest(),
                free_memory: int | None = None, on_step: Callable[[int, int], None] | None = None,
                where: str = "decode_conv", stack_tiles: bool | None = None,
                check: Callable[[], None] | None = None,
                on_plan: Callable[[str], None] | None = None) -> tuple[torch.Tensor, DecodeStats]:
    """Normalized latent `[B, 128, F', H', W']` → frames `[B·F, H, W, 3]` float32 in [0, 1] on the CPU, with
    F = 8(F'−1)+1, H = 32H', W = 32W'; and the `DecodeStats` (decoder "conv").

    The latent is un-normalized with the file's statistics, cut into the tiles of `decode_plan` (auto: untiled when
    the estimate fits the request's memory budget, or `free_memory`, bytes free on the decoder's device with the
    weights loaded, when that is 0; None = ask the device, ample on the CPU), each tile decoded and mapped to
    (x+1)/2 — the equal-shaped spatial tiles of one temporal tile stacked into batches as memory allows
    (`tile_batch`) — and blended on the device, then clamped to [0, 1] (blend, then clamp, as the reference: a tile
    clamped first pulls the overlap towards its clipped values); that group's finished frames are streamed into the
    CPU output (on CUDA through `DeviceToHost`'s pinned staging on a side stream) while its overlap with the next
    group stays on the device: host memory holds the output plus one group. `on_step(done, total)` runs after every
    tile (progress; it raises to interrupt); `check()` before each of the decoder's blocks (it raises to interrupt
    inside a tile: an untiled decode is one tile). `where` names the node in errors. `stack_tiles` (default: on CUDA
    only, where small tiles leave the GPU waiting on launches; on the CPU it only adds memory) allows the stacking.
    `on_plan(line)` gets the plan (`TilePlan.describe`) before the first tile runs.
    """
    check_video_latent(latent, f"{where}.latent")
    request.check(where)
    param = next(vae.decoder.parameters())
    device, dtype = param.device, param.dtype
    memory_budget = request.budget_bytes(weight_bytes(vae), free_bytes(device) if free_memory is None else free_memory,
                                         where)
    plan = decode_plan(vae, tuple(latent.shape), request, memory_budget)
    if on_plan is not None:
        on_plan(plan.describe("Conv VAE decode", memory_budget))
    stacking = device.type == "cuda" if stack_tiles is None else stack_tiles
    stack = tile_batch(plan, _cost(vae, latent.shape[0]), memory_budget) if stacking else 1
    weights_t, weights_h, weights_w = plan.axis_weights()
    batch, (frames, height, width) = latent.shape[0], plan.pixel_shape
    meter, done = start_meter(device), 0
    to_host = host_copier(device)
    blocks = [vae.decoder.mid_block, *vae.decoder.up_blocks] if check is not None else []
    with torch.inference_mode(), contextlib.ExitStack() as cleanup, checked_before(blocks, check), \
            float32_convolutions(device):
        cleanup.callback(to_host.finish)
        z = denormalize_video(latent, vae.latents_mean, vae.latents_std, device).to(dtype)
        host = HostFrames((batch, frames, height, width, 3), prefault=device.type != "cpu")  # [B, F, H, W, 3]
        carry, readback = None, 0       # the next group's partial first frames: on the device / count on the host
        spatial = list(itertools.product(enumerate(plan.rows), enumerate(plan.cols)))
        for ti, t_interval in enumerate(plan.frames):
            p0, p1 = temporal_pixels(t_interval)
            group = None
            for first in range(0, len(spatial), stack):
                chunk = spatial[first:first + stack]  # tiles of one shape, stacked on the batch axis
                tiles = vae.decoder(torch.cat([z[:, :, t_interval[0]:t_interval[1], r0:r1, c0:c1]
                                               for (_, (r0, r1)), (_, (c0, c1)) in chunk]))
                rgb = tiles.float().add_(1.0).mul_(0.5).permute(0, 2, 3, 4, 1)  # [kB,f,h,w,3], clamped once blended
                for j, ((ri, rows), (ci, cols)) in enumerate(chunk):
                    if len(spatial) == 1:
                        group = rgb
                    else:
                        if group is None:
                            group = torch.zeros(batch, p1 - p0, height, width, 3, dtype=torch.float32, device=device)
                        (y0, y1), (x0, x1) = spatial_pixels(rows), spatial_pixels(cols)
                        blend = weights_h[ri].to(device).view(-1, 1, 1) * weights_w[ci].to(device).view(1, -1, 1)
                        group[:, :, y0:y1, x0:x1].addcmul_(rgb[j * batch:(j + 1) * batch], blend)
                    done += 1
                    if on_step is not None:
                        on_step(done, plan.count)
                del tiles, rgb
            if len(plan.frames) > 1:
                group.mul_(weights_t[ti].to(device).view(1, -1, 1, 1, 1))  # group is this tile's own buffer
            out = host.ready()
            if readback:  # the earlier groups' share of this group's first frames: beyond the steady overlap ...
                to_host.finish_moves()
                for f0 in range(0, readback, READBACK_FRAMES):  # small pieces: no group-sized temporary
                    f1 = min(readback, f0 + READBACK_FRAMES)
                    group[:, f0:f1] += out[:, p0 + f0:p0 + f1].to(device)
            if carry is not None:  # ... from the host, the rest kept on the device
                group[:, readback:readback + carry.shape[1]] += carry
                carry = None
            # Frames no later tile touches are final; of the overlap with the next group (which lies inside it:
            # tiles start and end in order) the last `carried_frames` stay on the device and any earlier ones (a
            # last tile shifted back) go to the host and come back. Reading every overlap back cost a synchronous
            # copy per group each way.
            finished = (temporal_pixels(plan.frames[ti + 1])[0] if ti + 1 < len(plan.frames) else p1) - p0
            kept = min(p1 - p0 - finished, plan.carried_frames)
            readback = p1 - p0 - finished - kept
            carry = group[:, p1 - p0 - kept:].clone() if kept else None
            group[:, :finished].clamp_(0.0, 1.0)  # only final frames: the rest are partial sums
            for item in range(batch):
                to_host.copy(out[item, p0:p1 - kept], group[item, :p1 - p0 - kept])
            del group
    seconds, peak = meter()
    stats = DecodeStats("conv", seconds, peak, plan.count, tuple(plan.tile_pixel_sizes()), extra={
        "mode": request.mode, "plan": plan.reason, "latent_tiles": {"frames": plan.frames, "rows": plan.rows,
                                                                    "cols": plan.cols},
        "estimate_bytes": plan.estimate_bytes, "memory_budget": memory_budget, "tile_batch": stack,
        "dtype": str(dtype).split(".")[-1]})
    return host.ready().view(batch * frames, height, width, 3), stats
