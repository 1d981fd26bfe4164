"""Quantized file formats (NVFP4, FP8, ComfyUI int8/int8-convrot): dequantization against a float reference built
independently on synthetic tensors and against comfy-kitchen (ComfyUI's quantization library), the quantizers the
tiny writers use, and the per-layer plan that refuses bad files by name."""
from __future__ import annotations

import json

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


# ---------------------------------------------------------------------------------------------------- layouts
def test_unswizzle_equals_the_per_element_gather():
    """The permuted view that decodes block scales must read the same bytes as the per-element offsets, across row
    tiles (200 rows) and padded block columns (7 → 8)."""
    rows, cols = 200, 7
    buffer = torch.randint(0, 120, (256 * 8,), dtype=torch.uint8).view(torch.float8_e4m3fn)
    expected = buffer.view(torch.uint8)[quant.swizzled_offsets(rows, cols)]
    assert torch.equal(quant.unswizzle(buffer.reshape(256, 8), rows, cols).view(torch.uint8), expected)


def test_hadamard_is_the_symmetric_orthogonal_kronecker_power_of_the_regular_block():
    """H = H⁻¹ is what lets the same product rotate weights in, back out, or onto the activations."""
    block = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64) / 2
    assert torch.equal(quant.hadamard(4, dtype=torch.float64), block)
    assert torch.equal(quant.hadamard(16, dtype=torch.float64), torch.kron(block, block))
    h = quant.hadamard(256, dtype=torch.float64)
    assert torch.equal(h, h.T)
    torch.testing.assert_close(h @ h, torch.eye(256, dtype=torch.float64), atol=1e-12, rtol=0)


def test_quantizers_round_trip_within_their_formats_rounding():
    """quantize → dequantize stays within each format's rounding of the float weight: NVFP4 a quarter of the block
    maximum (E2M1 steps up to 2 between 4 and 6, plus the E4M3 scale), FP8 2^-4 relative, int8 half a step."""
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    nv = quant.quantize_nvfp4(w)
    back = quant.dequantize_nvfp4(nv["weight"], nv["weight_scale"], nv["weight_scale_2"], torch.float32)
    block_amax = w.reshape(40, 4, 16).abs().amax(-1, keepdim=True)
    error = ((back - w).reshape(40, 4, 16).abs() / block_amax).max().item()
    assert error < 0.25, f"NVFP4 error {error:.3f} of the block maximum"
    f8 = quant.quantize_fp8(w)
    back = quant.dequantize_fp8(f8["weight"], f8["weight_scale"], torch.float32)
    assert ((back - w).abs() <= w.abs() * 2**-4 + 1e-6).all(), "FP8 beyond half an E4M3 step"
    for group in (0, 16):
        i8 = quant.quantize_int8(w, group)
        back = quant.dequantize_int8(i8["weight"], i8["weight_scale"], group, torch.float32)
        error = (back - w).abs().max().item()
        bound = i8["weight_scale"].max().item() * 0.5 * (4 if group else 1)  # a rotation spreads the error over 16
        assert error < bound, f"int8 group {group}: error {error:.2e} vs step {bound:.2e}"


# ComfyUI's own quantization library reads and writes these formats: our decoding must agree with it.
def test_nvfp4_layout_agrees_with_comfy_kitchen():
    """comfy-kitchen's NVFP4 (nibble order, swizzle, per-tensor scale) decoded by us equals its own decoding."""
    import comfy_kitchen as ck
    w = torch.randn(130, 96, generator=torch.Generator().manual_seed(2))
    tensor_scale = (w.abs().amax() / (448 * 6)).reshape(())
    packed, block_scale = ck.quantize_nvfp4(w, tensor_scale)
    theirs = ck.dequantize_nvfp4(packed, tensor_scale, block_scale, torch.float32)
    ours = quant.dequantize_nvfp4(packed, block_scale, tensor_scale, torch.float32)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)
    mine = quant.quantize_nvfp4(w)
    theirs = ck.dequantize_nvfp4(mine["weight"], mine["weight_scale_2"], mine["weight_scale"], torch.float32)
    torch.testing.assert_close(quant.dequantize_nvfp4(mine["weight"], mine["weight_scale"], mine["weight_scale_2"],
                                                      torch.float32), theirs, atol=0, rtol=1e-6)


@pytest.mark.parametrize("group", [16, 256])
def test_int8_convrot_layout_agrees_with_comfy_kitchen(group):
    """ComfyUI's int8_tensorwise + convrot weights (rotated, per-row scales) decode to comfy-kitchen's own values,
    and ours decode there to ours."""
    from comfy_kitchen.tensor import TensorWiseINT8Layout
    w = torch.randn(48, 512, generator=torch.Generator().manual_seed(3))
    qdata, params = TensorWiseINT8Layout.quantize(w, per_channel=True, convrot=True, convrot_groupsize=group)
    ours = quant.dequantize_int8(qdata, params.scale, group, torch.float32)
    torch.testing.assert_close(ours, TensorWiseINT8Layout.dequantize(qdata, params), atol=1e-6, rtol=1e-5)
    mine = quant.quantize_int8(w, group)
    theirs = TensorWiseINT8Layout.dequantize(mine["weight"], type(params)(
        scale=mine["weight_scale"], orig_dtype=torch.float32, orig_shape=(48, 512), convrot=True,
        convrot_groupsize=group))
    torch.testing.assert_close(quant.dequantize_int8(mine["weight"], mine["weight_scale"], group, torch.float32),
                               theirs, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(quant.dequantize_int8(qdata, params.scale, 0, torch.float32), ours, atol=1e-2), \
        "vacuous: the rotation does not matter"


# ---------------------------------------------------------------------------------------------------- plans
def int8_layer(name: str = "a", group: int = 16, rows: int = 8, cols: int = 32) -> dict[str, torch.Tensor]:
    stored = quant.quantize_int8(torch.randn(rows, cols), group)
    record = quant.comfy_record(quant.LayerFormat(quant.INT8, group))
    return {f"{name}.weight": stored["weight"], f"{name}.weight_scale": stored["weight_scale"],
            f"{name}{quant.RECORD_SUFFIX}": quant.record_tensor(record)}


def test_int8_records_in_tensors_and_in_metadata_plan_the_same_layers():
    """ComfyUI records formats per layer (`.comfy_quant`) or file-wide (`_quantization_metadata`): both read the same;
    the per-layer record's key is consumed with the layer."""
    state = int8_layer("a") | int8_layer("b", group=0)
    by_tensors = quant.plan("f", state)
    records = {n: json.loads(bytes(state.pop(f"{n}{quant.RECORD_SUFFIX}").tolist())) for n in ("a", "b")}
    by_metadata = quant.plan("f", state, {quant.RECORD_METADATA: json.dumps({"layers": records})})
    assert by_tensors == by_metadata
    assert by_tensors["a"].format == quant.LayerFormat(quant.INT8, 16)
    assert by_tensors["b"].format == quant.LayerFormat(quant.INT8, 0)
    out = quant.dequantize_state_dict("f", int8_layer("a") | {"c.bias": torch.ones(2)}, torch.float32)
    assert set(out) == {"a.weight", "c.bias"}


def test_int8_weight_without_a_record_is_refused():
    """The int8 layout (rotation, group) is only in the record: guessing would load wrong weights silently."""
    state = int8_layer("a")
    del state["a" + quant.RECORD_SUFFIX]
    with pytest.raises(LTX25Error, match=r"f: the format record of the int8 weight a\.weight"):
        quant.plan("f", state)


@pytest.mark.parametrize("edit, match", [
    (lambda s: s.pop("a.weight_scale"), r"f: tensor a\.weight_scale is missing"),
    (lambda s: s.update({"a.weight_scale": torch.ones(3, 1)}), r"f: tensor a\.weight_scale is torch.float32 \(3, 1\)"),
    (lambda s: s.update({"a.weight": s["a.weight"][:, :24]}), r"f: convrot_groupsize of a is 16"),
    (lambda s: s.update({"a.comfy_quant": quant.record_tensor({"format": "mxfp8"})}), r"format of a is 'mxfp8'"),
    (lambda s: s.update({"a.pre_quant_scale": torch.ones(32)}), r"f: tensor a\.pre_quant_scale is present"),
    (lambda s: s.update({"z.comfy_quant": s["a.comfy_quant"]}), r"f: tensor z\.comfy_quant is a format record"),
])
def test_bad_quantized_layers_are_refused_naming_file_and_key(edit, match):
    """Missing or misshapen scales, a group that does not divide the features, an unsupported format, smoothing
    scales, a stray record: each an LTX25Error naming the file and the key, never a load that computes garbage."""
    state = int8_layer("a")
    edit(state)
    with pytest.raises(LTX25Error, match=match):
        quant.plan("f", state)


def test_nvfp4_block_scales_of_the_wrong_size_are_refused():
    packed, scales, _ = quantize_nvfp4(torch.ones(4, 32))
    state = {"a.weight": packed, "a.weight_scale": scales[:64], "a.weight_scale_2": torch.tensor(1.0)}
    with pytest.raises(LTX25Error, match=r"f: tensor a\.weight_scale is .* expected 512 E4M3 block scales"):
        quant.plan("f", state)


def test_header_detection_names_int8():
    info = lambda dtype: type("Info", (), {"dtype": dtype})()  # noqa: E731
    assert quant.detect({"a.weight": info("I8"), "a.weight_scale": info("F32")}) == quant.INT8
    assert quant.detect({"a.weight": info("F8_E4M3"), "a.weight_scale": info("F32")}) == quant.FP8
    assert quant.detect({"a.weight": info("BF16")}) is None
