"""The pack's ComfyUI face: thin V1 node classes, one module per graph stage. Importable without ComfyUI."""
from __future__ import annotations

import importlib

NODE_MODULES = ("loaders", "text", "conditioning", "sampling", "decode_conv", "decode_diffusion", "audio",
                "compare", "output")

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
for _name in NODE_MODULES:
    _module = importlib.import_module(f"{__name__}.{_name}")
    NODE_CLASS_MAPPINGS.update(_module.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(_module.NODE_DISPLAY_NAME_MAPPINGS)
