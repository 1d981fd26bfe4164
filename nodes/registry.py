"""The pack's node classes and display names, gathered from the ComfyUI face (one module per graph stage)."""
from __future__ import annotations

import importlib

NODE_MODULES = ("loaders", "lora", "text", "conditioning", "guidance", "sampling", "decode_conv", "decode_diffusion",
                "audio", "compare", "output", "encode", "guides", "reference_video")

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
for _name in NODE_MODULES:
    _module = importlib.import_module(f"{__package__}.comfy.{_name}")
    NODE_CLASS_MAPPINGS.update(_module.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(_module.NODE_DISPLAY_NAME_MAPPINGS)
