"""What flows between nodes for the pack's custom types: an engine module, its model-management patcher and
the inspected file it came from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import comfy_bridge as bridge
from .ltx.assets import AssetInfo


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
