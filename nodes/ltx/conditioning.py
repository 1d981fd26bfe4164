"""Values passed between the text, connector and sampling stages (LTX25_TEXT_FEATURES, LTX25_CONDITIONING)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .files.assets import AssetInfo


@dataclass(frozen=True)
class TextFeatures:
    """Projected Gemma features, before the connectors (docs/MODEL.md §3.4).

    video: [B, 1024, video_dim] and audio: [B, 1024, audio_dim] in the order the tokenizer produced them (LEFT padded);
    mask: [B, 1024] int64, 1 = valid token; source: the text-encoder file they came from (for the Gemma pairing check).
    """
    video: torch.Tensor
    audio: torch.Tensor
    mask: torch.Tensor
    source: AssetInfo


@dataclass(frozen=True)
class Conditioning:
    """Connector outputs the DiT cross-attends to (docs/MODEL.md §4): video [B, 1024, 4096], audio [B, 1024, 2048]
    (tiny: TINY_DIMS widths). The DiT gets no context mask (§4.1 step 5)."""
    video: torch.Tensor
    audio: torch.Tensor
