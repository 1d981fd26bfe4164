"""LoRAs on a patcher: factors applied on the fly beside their layers, and the weight patches model management
merges."""
from __future__ import annotations

from ...ltx.files.lora import LoraFactors
from ...ltx.kernels.lora_linear import NO_LOW_RANK, LowRankSet
from .comfyui import HAS_COMFY

LOW_RANK = "ltx25_low_rank"  # the ComfyUI patcher attachment holding a view's on-the-fly LoRAs


def add_low_rank(patcher, factors: dict[str, LoraFactors], strength: float) -> None:
    """Give `patcher`'s view LoRA factors applied on the fly at `strength` (module state-dict keys of Linear
    weights): installed beside their layers when the view is loaded, never merged into the weights. In ComfyUI
    they ride on the patcher as an attachment (clones copy it), so ComfyUI's own weight patching never sees them."""
    if HAS_COMFY:
        patcher.set_attachments(LOW_RANK, (patcher.get_attachment(LOW_RANK) or NO_LOW_RANK).plus(factors, strength))
    else:
        patcher.low_rank = patcher.low_rank.plus(factors, strength)


def low_rank_of(patcher) -> LowRankSet:
    """The view's on-the-fly LoRAs (empty when it has none)."""
    if HAS_COMFY:
        return patcher.get_attachment(LOW_RANK) or NO_LOW_RANK
    return patcher.low_rank


def weight_patch(value):
    """The patch value model management applies for one weight: a dense delta → ComfyUI's `(delta,)`; a LoRA's
    `LoraFactors` → ComfyUI's own LoRA adapter (its math: `weight + strength·alpha/rank·up@down`, alpha absent
    → 1, as `LoraFactors.delta`) in ComfyUI, the factors themselves for the standalone patcher."""
    if not isinstance(value, LoraFactors):
        return (value,)
    if not HAS_COMFY:
        return value
    weights = (value.up, value.down, value.alpha, None, None, None)  # up, down, alpha, mid, dora scale, reshape
    try:  # ComfyUI ≥ 0.3.3x: adapter objects
        from comfy.weight_adapter import LoRAAdapter
    except ImportError:  # older ComfyUI reads the tagged tuple
        return ("lora", weights)
    return LoRAAdapter(set(), weights)
