"""What flows between nodes for the pack's custom types: an engine module, its model-management patcher and
the inspected file it came from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import bridge
from ..ltx.files.assets import AssetInfo
from ..ltx.errors import LTX25Error


@dataclass
class Loaded:
    """LTX25_MODEL, LTX25_VIDEO_VAE, LTX25_AUDIO_VAE, LTX25_UPSAMPLER: weights stay offloaded until `ready`."""
    module: torch.nn.Module
    patcher: object
    info: AssetInfo

    @classmethod
    def register(cls, module: torch.nn.Module, info: AssetInfo,
                 on_unload: Callable[[torch.nn.Module], None] | None = None) -> "Loaded":
        return cls(module, bridge.make_patcher(module, on_unload), info)

    def ready(self, memory_required: int = 0) -> torch.nn.Module:
        """Load onto the compute device through model management (evicting others if needed); the module."""
        bridge.load_models([self.patcher], memory_required)
        return self.module


def latent_for_decoder(node: str, video_vae: Loaded, latent, kind: str, file: str, other_node: str) -> torch.Tensor:
    """The `[B, 128, F', H', W']` samples of a decode node's `latent` input, after checking that `video_vae` is the
    `kind` decoder (from `file`); the other kind is pointed to `other_node`, which decodes it."""
    from ..ltx.latents import check_video_latent
    found = getattr(video_vae.module, "kind", None)
    if found != kind:
        raise LTX25Error(f"{node}.video_vae", "the connected video VAE", f"a {found or 'non-LTX'} VAE "
                         f"({video_vae.info.name})", f"the {kind} VAE ({file})",
                         f"Decode it with the {other_node} node, or load the {kind} VAE here.")
    return check_video_latent(latent.get("samples") if isinstance(latent, dict) else latent, f"{node}.latent")
