"""FP8 and NVFP4 weights in the split files, dequantized at load (docs/MODEL.md §5.5).

NVFP4 Linear: `.weight` U8 [out, in/2] (two E2M1 values a byte, element 2j in the HIGH nibble — the documented
default of ltx-core's prequant files), `.weight_scale` E4M3 per 16-element block in cuBLAS' 128×4 swizzled layout,
`.weight_scale_2` fp32 per-tensor scale, `.input_scale` fp32 static activation scale (unused once dequantized).
FP8: `.weight` F8_E4M3 + `.weight_scale` fp32 scalar.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..errors import LTX25Error

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16


def detect(tensors: Mapping[str, "object"]) -> str | None:
    """'nvfp4', 'fp8' or None from header dtypes (TensorInfo-like objects with `.dtype`)."""
    for name, info in tensors.items():
        if not name.endswith(".weight_scale"):
            continue
        weight = tensors.get(name[: -len("_scale")])
        if weight is None:
            continue
        if weight.dtype == "U8" and name + "_2" in tensors:
            return "nvfp4"
        if weight.dtype.startswith("F8"):
            return "fp8"
    return None


def swizzled_offsets(rows: int, cols: int) -> torch.Tensor:
    """Flat offsets into a 128×4-swizzled scale buffer for logical (r, c), as [rows, cols]."""
    padded_cols = -(-cols // 4) * 4
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    tile = (r // 128) * (padded_cols // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[out, in/2] U8 + swizzled E4M3 block scales + fp32 scalar → [out, in] `dtype`."""
    rows, half = packed.shape
    cols = half * 2
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    nibbles = torch.stack([packed >> 4, packed & 0xF], dim=-1).reshape(rows, cols).long()  # high nibble first
    values = table[nibbles & 0x7] * torch.where(nibbles & 0x8 > 0, -1.0, 1.0)
    offsets = swizzled_offsets(rows, cols // NVFP4_BLOCK)
    scales = block_scale.reshape(-1).float()[offsets]  # [rows, cols/16]
    values = values.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK) * scales.unsqueeze(-1)
    return (values.reshape(rows, cols) * tensor_scale.float()).to(dtype)


def dequantize_state_dict(where: str, state: Mapping[str, torch.Tensor],
                          dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Replace every quantized `.weight` (+ its scales) by a dequantized weight; other tensors pass through."""
    out: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    for name, tensor in state.items():
        if not name.endswith(".weight") or name + "_scale" not in state:
            continue
        scale = state[name + "_scale"]
        if tensor.dtype == torch.uint8:
            if name + "_scale_2" not in state:
                raise LTX25Error(where, f"{name}_scale_2", "missing", "a per-tensor fp32 scale beside an NVFP4 weight")
            out[name] = dequantize_nvfp4(tensor, scale, state[name + "_scale_2"], dtype)
            consumed |= {name + "_scale_2"}
        elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            out[name] = (tensor.float() * scale.float()).to(dtype)
        else:
            raise LTX25Error(where, f"{name} dtype", tensor.dtype, "U8 (NVFP4) or float8 beside a weight_scale")
        consumed |= {name, name + "_scale", name[: -len("weight")] + "input_scale"}
    for name, tensor in state.items():
        if name not in consumed and name not in out:
            out[name] = tensor
    return out
