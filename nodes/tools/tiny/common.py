"""Shared helpers of the tiny LTX-2.5 asset writers (one module per component here): the dimensions two files must
agree on, the per-file random generators, the latent statistics both video VAEs share, and the native-format save.
The tiny files have the exact native format (names, nesting, metadata); only the sizes are small. Sizes that two
files must agree on live here and nowhere else.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import torch
from safetensors.torch import save_file

# Dimensions shared across files (the real values in comments).
TINY_DIMS = {
    "latent_channels": 128,           # fixed by the latent format (real: 128)
    "audio_latent_channels": 8,       # real: 8 channels × 16 mel bins
    "audio_latent_bins": 16,
    "text_hidden": 64,                # Gemma hidden (real 3840)
    "text_layers": 6,                 # Gemma layers (real 48) ⇒ 7 hidden states; layer 5 is full attention
    "video_inner": 64,                # DiT/connector video width (real 32×128 = 4096)
    "video_heads": 2,
    "audio_inner": 32,                # DiT/connector audio width (real 32×64 = 2048)
    "audio_heads": 2,
}


def generator(seed: int, salt: str) -> torch.Generator:
    """A generator per (seed, component) so each file is deterministic on its own."""
    return torch.Generator().manual_seed((seed * 1_000_003 + sum(map(ord, salt)) * 7919) % 2**63)


def latent_statistics(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel (mean-of-means, std-of-means) shared by both video VAEs (one latent space)."""
    g = generator(seed, "latent_statistics")
    mean = torch.randn(TINY_DIMS["latent_channels"], generator=g) * 0.1
    std = torch.rand(TINY_DIMS["latent_channels"], generator=g) * 0.5 + 0.75
    return mean, std


def randomize_(module: torch.nn.Module, seed: int, salt: str, scale: float = 0.02) -> torch.nn.Module:
    """Deterministic small random weights for every floating parameter/buffer (norm weights near 1)."""
    g = generator(seed, salt)
    with torch.no_grad():
        for name, t in sorted(module.state_dict().items()):
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
            is_norm = t.ndim == 1 and ("norm" in name or name.endswith("scale"))
            t.copy_((1.0 + 0.1 * noise) if is_norm else noise * scale)
    return module


def save_native(path: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any],
                dtype: torch.dtype = torch.bfloat16) -> str:
    """Write a native-format file: floating tensors cast to `dtype` (bf16 like the releases), metadata values
    JSON-encoded strings (as the released headers store them)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    out = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file(out, path, metadata=meta)
    return path
