"""The tiny x2 spatial latent upsampler file in the native format (flat `config` metadata, native key names)."""
from __future__ import annotations

from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

from ...ltx.upsampler import KEY_MAP, UpsamplerConfig
from .common import randomize_, save_native

TINY_CONFIG = {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 32, "num_blocks_per_stage": 1,
               "dims": 3, "spatial_upsample": True, "temporal_upsample": False, "spatial_scale": 2.0,
               "rational_resampler": False}


def write_tiny(path: str, seed: int = 0) -> str:
    """The tiny upsampler file, written to `path`."""
    config = UpsamplerConfig(**{k: v for k, v in TINY_CONFIG.items() if k != "_class_name"})
    module = randomize_(LTX2LatentUpsamplerModel(**config.diffusers_kwargs()), seed, "upsampler")
    return save_native(path, KEY_MAP.to_native(module.state_dict()), {"config": TINY_CONFIG})
