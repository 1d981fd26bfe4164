"""ComfyUI's modules when the pack runs inside ComfyUI, None otherwise: the one place the bridge imports them at its
top (a few lazy imports of optional parts sit next to their only use)."""
from __future__ import annotations

try:  # ComfyUI present: the real thing.
    import comfy.model_management as _mm
    import comfy.model_patcher as _patcher
    import comfy.utils as _comfy_utils
    import folder_paths as _folder_paths

    HAS_COMFY = True
except ImportError:
    _mm = _patcher = _comfy_utils = _folder_paths = None
    HAS_COMFY = False
