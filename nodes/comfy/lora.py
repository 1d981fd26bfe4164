"""LoRA node: a LoRA file applied to the transformer handle at a strength, as a patched clone of the handle (applied
on the fly beside the layers, or merged into the weights when the model is made ready; never copied whole). Chain
the node for several LoRAs."""
from __future__ import annotations

import math

from ..ltx.errors import LTX25Error
from . import bridge
from .handles import LORA_APPLY

CATEGORY = "LTX-2.5/loaders"


class LTX25LoraLoader:
    DESCRIPTION = ("Applies an LTX-2.5 LoRA or IC-LoRA to the transformer (PEFT lora_A/lora_B, kohya/ComfyUI "
                   "lora_down/lora_up with alpha, diffusion_model. / model.diffusion_model. / lora_unet_ / "
                   "transformer. names), also to a transformer kept quantized. Chain several to stack them.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The transformer with the LoRA; the input model stays unpatched for other branches.",)
    FUNCTION = "apply"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("LTX25_MODEL", {"tooltip": "The LTX-2.5 transformer, float or kept quantized ('as stored')."}),
            "lora_file": (bridge.list_model_files("loras"), {"tooltip": "A LoRA for LTX-2.5 (from models/loras/), "
                          "e.g. ltx-2.5-22b-distilled-lora-450-bf16.safetensors for the dev model's stage 2."}),
            "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01,
                                   "tooltip": "Multiplies the LoRA's update; 0 returns the model unchanged."}),
        }, "optional": {
            "apply": (list(LORA_APPLY), {"default": "auto", "tooltip": "on_the_fly: the weights stay as loaded and "
                      "each patched layer adds the LoRA's two small products to its output (works on quantized "
                      "weights; branches with and without the LoRA share the weights). merged: the update is "
                      "written into float weights when the model is loaded (no cost per step; the originals are "
                      "kept in host memory to undo it). auto: on_the_fly."}),
        }}

    def apply(self, model, lora_file: str, strength: float, apply: str = "auto"):
        # ComfyUI checks min/max, but NaN passes those comparisons and would turn the whole video into NaN.
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
            raise LTX25Error("LTX25LoraLoader.strength", "strength", strength, "a finite number (1: the LoRA as "
                             "trained, 0: the model unchanged)")
        if strength == 0:
            return (model,)
        from ..ltx.dit.transformer import KEY_MAP
        from ..ltx.files.lora import LoraTargets, read_lora_file
        lora = read_lora_file(bridge.model_file_path("loras", lora_file), LoraTargets.of(model.module, KEY_MAP))
        return (model.with_lora(lora, strength, apply, name=lora_file),)


NODE_CLASS_MAPPINGS = {"LTX25LoraLoader": LTX25LoraLoader}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25LoraLoader": "LTX-2.5 Load LoRA"}
