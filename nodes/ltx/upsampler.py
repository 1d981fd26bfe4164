"""The LTX-2.5 latent upsampler (docs/MODEL.md §8): diffusers' `LTX2LatentUpsamplerModel`, configured from the file's
flat `config` metadata, loaded strictly, and wrapped in the VAE's per-channel statistics.

The upsampler was trained on UN-normalized latents (the video VAE encoder's raw output) while the DiT works on
normalized ones, so `upsample_latent` un-normalizes with the video VAE's mean/std, upsamples and normalizes again.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import torch
from diffusers.pipelines.ltx2.latent_upsampler import (RATIONAL_RESAMPLER_SCALE_MAPPING, BlurDownsample,
                                                       LTX2LatentUpsamplerModel)

from .files.assets import Kind, expect_kind, read_state_dict
from .files.config import config_field
from .errors import LTX25Error
from .files.keymap import KeyMap, load_strict
from .geometry import VIDEO_CHANNELS
from .latents import denormalize_video, normalize_video
from .stop_points import checked_before
from .cpu_convolutions import float32_convolutions

# The native names are diffusers' names; the map is empty but `load_strict` still checks full coverage.
KEY_MAP = KeyMap("latent upsampler")

# The binomial blur of the rational resampler is a fixed (non-learned) buffer; a file may omit it.
_BLUR_KERNEL = "upsampler.blur_down.kernel"


@dataclass(frozen=True)
class UpsamplerConfig:
    """The file's flat `config` (native names). Defaults are the reference builder's ([L] `LatentUpsampler`),
    NOT diffusers' (`mid_channels` 1024 there, `use_rational_resampler` True there); the shipped 2.5 x2 spatial file
    has mid_channels 1024, num_blocks_per_stage 4, spatial x2, rational_resampler false."""
    in_channels: int = 128
    mid_channels: int = 512
    num_blocks_per_stage: int = 4
    dims: int = 3
    spatial_upsample: bool = True
    temporal_upsample: bool = False
    spatial_scale: float = 2.0
    rational_resampler: bool = False

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any]) -> "UpsamplerConfig":
        config = config_field(where, metadata, "", kind=Mapping, hint="The upsampler file keeps a flat config there.")
        config_field(where, metadata, "_class_name", None, allowed=("LatentUpsampler",))
        known = {k: config_field(where, metadata, k) for k in cls.__dataclass_fields__ if k in config}
        made = cls(**known)
        made._check(where)
        return made

    def _check(self, where: str) -> None:
        def bad(key: str, expected: str, hint: str = "") -> LTX25Error:
            return LTX25Error(where, f"config.{key}", getattr(self, key), expected, hint)

        if self.in_channels != VIDEO_CHANNELS:
            raise bad("in_channels", f"{VIDEO_CHANNELS} (the LTX-2.5 video latent)")
        if self.mid_channels <= 0 or self.mid_channels % 32:
            raise bad("mid_channels", "a positive multiple of 32 (GroupNorm with 32 groups)")
        if self.dims not in (2, 3):
            raise bad("dims", "2 or 3")
        if not (self.spatial_upsample or self.temporal_upsample):
            raise bad("spatial_upsample", "true when temporal_upsample is false", "The file upsamples nothing.")
        if self.spatial_upsample and not self.temporal_upsample:
            allowed = RATIONAL_RESAMPLER_SCALE_MAPPING if self.rational_resampler else (2.0,)
            if float(self.spatial_scale) not in allowed:
                raise bad("spatial_scale", " or ".join(str(s) for s in allowed))

    @property
    def uses_rational_keys(self) -> bool:
        """The rational resampler is only built for a spatial-only upsampler; its conv is `upsampler.conv`."""
        return self.rational_resampler and self.spatial_upsample and not self.temporal_upsample

    def diffusers_kwargs(self) -> dict[str, Any]:
        """Native names → `LTX2LatentUpsamplerModel` names, every value passed (no diffusers default used)."""
        kwargs = asdict(self)
        kwargs["rational_spatial_scale"] = float(kwargs.pop("spatial_scale"))
        kwargs["use_rational_resampler"] = kwargs.pop("rational_resampler")
        return kwargs


def check_resampler_keys(where: str, config: UpsamplerConfig, keys) -> None:
    """`upsampler.conv.*` (rational) vs `upsampler.0.*` (conv + pixel shuffle) must agree with the config."""
    rational = any(k.startswith("upsampler.conv.") for k in keys)
    sequential = any(k.startswith("upsampler.0.") for k in keys)
    if rational == sequential or rational != config.uses_rational_keys:
        found = "upsampler.conv.*" if rational and not sequential else \
            "upsampler.0.*" if sequential and not rational else "both or neither of upsampler.conv.* / upsampler.0.*"
        want = "upsampler.conv.*" if config.uses_rational_keys else "upsampler.0.*"
        raise LTX25Error(where, "the resampler keys", found,
                         f"{want} (config.rational_resampler is {str(config.rational_resampler).lower()})",
                         "The file's metadata and its tensors disagree; the file was repacked with a wrong config.")


def load_upsampler(path: str, dtype: torch.dtype | None = None) -> LTX2LatentUpsamplerModel:
    """Native upsampler file → `LTX2LatentUpsamplerModel` (eval, no grad). Input/output `[B, 128, F, H, W]`."""
    info = expect_kind(path, Kind.UPSAMPLER)
    config = UpsamplerConfig.from_metadata(info.path, info.header.metadata)
    check_resampler_keys(info.path, config, info.header.tensors)
    native = read_state_dict(info.path)
    if config.uses_rational_keys and _BLUR_KERNEL not in native:
        native[_BLUR_KERNEL] = BlurDownsample(dims=2, stride=1).kernel  # the constant diffusers builds
    return load_strict(info.path, lambda: LTX2LatentUpsamplerModel(**config.diffusers_kwargs()), native, KEY_MAP,
                       dtype)


def working_memory(upsampler: LTX2LatentUpsamplerModel, latent_shape: tuple[int, ...]) -> int:
    """Bytes an upsample of `[B, 128, F, H, W]` needs beyond the weights: ~6 live `mid_channels` maps at the x2 size
    (conv in/out, norm, residual), plus fp32 I/O."""
    b, c, f, h, w = latent_shape
    itemsize = next(upsampler.parameters()).element_size()
    return b * f * h * w * 4 * (upsampler.config.mid_channels * 6 * itemsize + c * 3 * 4)


def latent_statistics(vae: torch.nn.Module, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The video VAE's per-channel `latents_mean`/`latents_std` `[128]` (the same for both video VAEs)."""
    mean, std = getattr(vae, "latents_mean", None), getattr(vae, "latents_std", None)
    if not isinstance(mean, torch.Tensor) or not isinstance(std, torch.Tensor) or mean.numel() != VIDEO_CHANNELS \
            or std.numel() != VIDEO_CHANNELS:
        raise LTX25Error(where, "the video VAE's latent statistics", f"missing on {type(vae).__name__}",
                         f"buffers latents_mean and latents_std of {VIDEO_CHANNELS} values",
                         "Connect a video VAE from LTX-2.5 Load Video VAE.")
    return mean, std


def upsample_latent(upsampler: torch.nn.Module, latent: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                    output_device: torch.device | None = None,
                    check: Callable[[], None] | None = None) -> torch.Tensor:
    """Normalized `[B, 128, F, H, W]` → normalized `[B, 128, F, 2H, 2W]` (x2 spatial file).

    `mean`/`std` `[128]` are the video VAE's per-channel statistics (both video VAEs share them). The whole batch
    is upsampled (the reference upsamples only `latent[:1]`). Returned in `latent`'s dtype on `output_device`
    (default: `latent`'s device). `check()` runs before each residual block and the upsampling (it raises to
    interrupt)."""
    param = next(upsampler.parameters())
    blocks = [*upsampler.res_blocks, upsampler.upsampler, *upsampler.post_upsample_res_blocks]
    with torch.inference_mode(), checked_before(blocks, check), float32_convolutions(param.device):
        raw = denormalize_video(latent, mean, std, param.device)
        out = normalize_video(upsampler(raw.to(param.dtype)), mean, std)
    return out.to(output_device or latent.device, latent.dtype)
