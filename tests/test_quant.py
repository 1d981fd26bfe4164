"""FP8 and NVFP4 dequantization against a float reference built independently on synthetic tensors."""
from __future__ import annotations

import pytest
import torch

from nodes.ltx.files import quant
from nodes.ltx.errors import LTX25Error


def reference_swizzle(rows: int, cols: int) -> dict[tuple[int, int], int]:
    """Per-element loop over the cuBLAS 128×4 layout (docs/MODEL.md §5.5): the independent reference."""
    padded_cols = -(-cols // 4) * 4
    out = {}
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * (padded_cols // 4) + c // 4
            out[(r, c)] = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return out


def quantize_nvfp4(weight: torch.Tensor):
    """Pack a weight whose values are exact E2M1 multiples of power-of-two block scales."""
    rows, cols = weight.shape
    nblocks = cols // 16
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-nblocks // 4) * 4
    swizzled = torch.zeros(padded_rows * padded_cols, dtype=torch.float32)
    codes = torch.zeros(rows, cols, dtype=torch.uint8)
    table = torch.tensor(quant.E2M1_VALUES)
    block_scales = 2.0 ** torch.randint(-3, 3, (rows, nblocks)).float()
    offsets = reference_swizzle(rows, nblocks)
    for r in range(rows):
        for b in range(nblocks):
            swizzled[offsets[(r, b)]] = block_scales[r, b]
            for j in range(16):
                value = weight[r, b * 16 + j] / block_scales[r, b]
                magnitude = int((table - value.abs()).abs().argmin())
                codes[r, b * 16 + j] = magnitude | (8 if value < 0 else 0)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]  # element 2j in the high nibble
    dequant = table[codes.long() & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    dequant = dequant * block_scales.repeat_interleave(16, dim=1)
    return packed, swizzled.to(torch.float8_e4m3fn).reshape(padded_rows, padded_cols), dequant


def test_swizzled_offsets_match_the_per_element_reference():
    rows, cols = 200, 7
    expected = reference_swizzle(rows, cols)
    got = quant.swizzled_offsets(rows, cols)
    assert all(int(got[r, c]) == v for (r, c), v in expected.items())


def test_nvfp4_dequantizes_to_the_float_reference():
    """E2M1 nibbles (high first), swizzled E4M3 block scales and the per-tensor scale all matter."""
    g = torch.Generator().manual_seed(0)
    table = torch.tensor(quant.E2M1_VALUES)
    rows, cols = 130, 64  # crosses a 128-row tile
    weight = table[torch.randint(0, 8, (rows, cols), generator=g)] * torch.where(
        torch.rand(rows, cols, generator=g) > 0.5, 1.0, -1.0)
    packed, scales, reference = quantize_nvfp4(weight)
    tensor_scale = torch.tensor(0.25)
    got = quant.dequantize_nvfp4(packed, scales, tensor_scale, torch.float32)
    torch.testing.assert_close(got, reference * 0.25, atol=0, rtol=0)
    swapped = (packed << 4) | (packed >> 4)  # low-nibble-first reading must differ
    assert not torch.equal(quant.dequantize_nvfp4(swapped, scales, tensor_scale, torch.float32), got)


def test_state_dict_dequantization_consumes_scales_and_keeps_other_tensors():
    packed, scales, reference = quantize_nvfp4(torch.ones(4, 32))
    state = {"a.weight": packed, "a.weight_scale": scales, "a.weight_scale_2": torch.tensor(2.0),
             "a.input_scale": torch.tensor(1.0), "a.bias": torch.ones(4),
             "b.weight": (torch.ones(3, 3) * 0.5).to(torch.float8_e4m3fn), "b.weight_scale": torch.tensor(4.0)}
    out = quant.dequantize_state_dict("f", state, torch.float32)
    assert set(out) == {"a.weight", "a.bias", "b.weight"}
    torch.testing.assert_close(out["a.weight"], reference * 2)
    torch.testing.assert_close(out["b.weight"], torch.full((3, 3), 2.0))


def test_nvfp4_weight_without_tensor_scale_is_refused():
    packed, scales, _ = quantize_nvfp4(torch.ones(4, 32))
    with pytest.raises(LTX25Error, match="weight_scale_2"):
        quant.dequantize_state_dict("f", {"a.weight": packed, "a.weight_scale": scales})
