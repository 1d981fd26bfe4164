"""What the native VAE files share across their decoders and bundled encoders: the latent statistics each side
reads (both video VAE files, the audio VAE file under `audio_vae.`), and the video VAEs' flat nine-block lists,
which diffusers groups into blocks of resnets and a resampler (docs/MODEL.md §9, §17.1)."""
from __future__ import annotations

import re
from typing import Any, Iterable

from ..errors import LTX25Error
from ..geometry import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION
from .keymap import Drop, Rename


def statistics_renames(prefix: str = "") -> tuple[Rename, Rename]:
    """The two per-channel statistics the pack uses → the modules' `latents_mean` and `latents_std` buffers."""
    return (Rename(f"{prefix}per_channel_statistics.mean-of-means", "latents_mean"),
            Rename(f"{prefix}per_channel_statistics.std-of-means", "latents_std"))


def unused_statistics(prefix: str, reason: str) -> Drop:
    """The file's other dataset statistics, which no module reads."""
    return Drop(re.escape(prefix) + r"per_channel_statistics\.(?!mean-of-means$|std-of-means$).*", reason)


def flat_block_renames(side: str, native_list: str, modules: Iterable[str]) -> tuple[Rename, ...]:
    """Native `{side}.{native_list}.{i}` (the flat list: res_x blocks at even i, resamplers at odd i) → diffusers'
    `modules[i]`. Whole-segment prefixes (`…res_blocks` → `…resnets`, `…conv` → `….conv`), so no row's output is
    another row's input: applied in order, `up_blocks.2 → up_blocks.0` would otherwise be caught by
    `up_blocks.0 → mid_block`."""
    return tuple(
        Rename(f"{side}.{native_list}.{i}.res_blocks", f"{side}.{module}.resnets") if i % 2 == 0
        else Rename(f"{side}.{native_list}.{i}.conv", f"{side}.{module}.conv")
        for i, module in enumerate(modules))


def block_params(where: str, key: str, block: Any) -> tuple[str, dict]:
    """One `[name, params]` entry of a config block list; params given as an int are the layer count."""
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and isinstance(block[0], str)):
        raise LTX25Error(where, key, block, '[name, params] pairs such as ["res_x", {"num_layers": 4}]')
    name, params = block
    return name, ({"num_layers": params} if isinstance(params, int) else dict(params))


def check_compression(where: str, key: str, patch: int, strides: Iterable[tuple[int, int, int]]) -> None:
    """Refuse a layout whose patch size and resamplers' (t, h, w) strides do not make the LTX-2.5 latent grid."""
    strides = list(strides)
    spatial = patch * 2 ** sum(s[1] == 2 for s in strides)
    temporal = 2 ** sum(s[0] == 2 for s in strides)
    if (spatial, temporal) != (SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION):
        raise LTX25Error(where, key, f"{spatial}×{spatial}×{temporal}", f"{SPATIAL_COMPRESSION}×{SPATIAL_COMPRESSION}×"
                         f"{TEMPORAL_COMPRESSION} (the LTX-2.5 latent grid)")
