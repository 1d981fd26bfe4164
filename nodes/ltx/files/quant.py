"""Quantized weights in the split files: the formats, which layers of a file carry them, their exact dequantization
(the reference every quantized compute path is tested against) and the quantizers the tiny writers use.

Per quantized weight `<layer>.weight` (docs/MODEL.md §5.5):
- NVFP4 (the released `-nvfp4` transformer; ComfyUI's `nvfp4`): `.weight` U8 `[out, in/2]`, two E2M1 values a byte,
  element 2j in the HIGH nibble; `.weight_scale` E4M3, one per 16 elements, in cuBLAS' 128×4 swizzled layout (rows
  padded to 128, block columns to 4); `.weight_scale_2` fp32 per-tensor scale; `.input_scale` fp32 static activation
  scale. W = e2m1 · (block scale · weight_scale_2).
- FP8: `.weight` F8_E4M3 (or E5M2) + `.weight_scale` fp32, a scalar or one per output row; `.input_scale` optional.
- int8 (ComfyUI's `int8_tensorwise`, shipped as the `*-comfy-int8-convrot` files): `.weight` I8 `[out, in]` +
  `.weight_scale` fp32 `[out, 1]` (or a scalar). With `convrot` the float weight was rotated before quantizing: each
  group of `convrot_groupsize` input columns multiplied by H, the normalized Kronecker power of the 4×4 "regular"
  Hadamard block. H is symmetric and orthogonal (H·H = I), so the same product rotates back: W = (q · scale)·H per
  group, and x·Wᵀ = (x·H)·(q · scale)ᵀ — the rotation can move onto the activations.
ComfyUI records a layer's format in a `<layer>.comfy_quant` U8 tensor (JSON) or file-wide in the metadata entry
`_quantization_metadata` (`{"layers": {layer: {...}}}`); the LTX files carry no record and the dtypes decide.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..errors import LTX25Error

NVFP4, FP8, INT8 = "nvfp4", "fp8", "int8"
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16
E4M3_MAX = 448.0
RECORD_SUFFIX = ".comfy_quant"
RECORD_METADATA = "_quantization_metadata"
# ComfyUI format names (its QUANT_ALGOS) → ours; any other recorded format is refused by name.
COMFY_FORMATS = {"nvfp4": NVFP4, "float8_e4m3fn": FP8, "float8_e5m2": FP8, "int8_tensorwise": INT8}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
HEADER_FP8_TAGS = ("F8_E4M3", "F8_E5M2")


@dataclass(frozen=True)
class LayerFormat:
    kind: str                        # NVFP4 | FP8 | INT8
    convrot_groupsize: int = 0       # INT8: the rotation's group size; 0 = not rotated
    full_precision_mm: bool = False  # ComfyUI's `full_precision_matrix_mult`: never an FP8 GEMM for this layer


@dataclass(frozen=True)
class QuantLayer:
    """One quantized weight of a file; `name` is its native prefix (`<name>.weight`)."""
    name: str
    format: LayerFormat

    @property
    def weight_key(self) -> str:
        return self.name + ".weight"

    def stored_keys(self) -> tuple[str, ...]:
        """The tensors a quantized module keeps, in the file's names and layouts."""
        extra = ("weight_scale_2",) if self.format.kind == NVFP4 else ()
        return tuple(f"{self.name}.{s}" for s in ("weight", "weight_scale", *extra))

    def consumed_keys(self, state: Mapping[str, Any]) -> tuple[str, ...]:
        """The layer's other file tensors: its format record and the static activation scale (activations are
        scaled from their own values, so it is read and set aside)."""
        return tuple(k for k in (self.name + RECORD_SUFFIX, self.name + ".input_scale") if k in state)


# ---------------------------------------------------------------------------------------------------- detection
def detect(tensors: Mapping[str, Any]) -> str | None:
    """'nvfp4', 'fp8', 'int8' or None from header dtypes (TensorInfo-like objects with `.dtype`)."""
    for name in tensors:
        if not name.endswith(".weight_scale"):
            continue
        weight = tensors.get(name[: -len("_scale")])
        if weight is None:
            continue
        if weight.dtype == "U8" and name + "_2" in tensors:
            return NVFP4
        if weight.dtype in HEADER_FP8_TAGS:
            return FP8
        if weight.dtype == "I8":
            return INT8
    return None


def _records(where: str, state: Mapping[str, torch.Tensor],
             metadata: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """layer name → ComfyUI's format record, from the metadata entry and the per-layer tensors (these win)."""
    records: dict[str, Mapping[str, Any]] = {}
    raw = (metadata or {}).get(RECORD_METADATA)
    if raw is not None:
        try:
            layers = (json.loads(raw) if isinstance(raw, str) else raw)["layers"]
            records.update({name: dict(conf) for name, conf in layers.items()})
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise LTX25Error(where, f"metadata {RECORD_METADATA}", f"unreadable ({e})",
                             '{"layers": {layer: {"format": ...}}}') from e
    for key, tensor in state.items():
        if key.endswith(RECORD_SUFFIX):
            try:
                records[key[: -len(RECORD_SUFFIX)]] = dict(json.loads(bytes(tensor.to(torch.uint8).tolist())))
            except (TypeError, ValueError, UnicodeDecodeError) as e:
                raise LTX25Error(where, f"tensor {key}", f"unreadable ({e})", "UTF-8 JSON bytes") from e
    return records


def _recorded_format(where: str, name: str, record: Mapping[str, Any]) -> LayerFormat:
    comfy_name = record.get("format")
    kind = COMFY_FORMATS.get(comfy_name)
    if kind is None:
        raise LTX25Error(where, f"the quantization format of {name}", repr(comfy_name),
                         " or ".join(COMFY_FORMATS), "This pack runs the bf16, NVFP4, FP8 and int8(-convrot) files.")
    params = record.get("params") if isinstance(record.get("params"), Mapping) else {}
    rotated = kind == INT8 and bool(record.get("convrot", params.get("convrot", False)))
    group = int(record.get("convrot_groupsize", params.get("convrot_groupsize", 256))) if rotated else 0
    return LayerFormat(kind, group, bool(record.get("full_precision_matrix_mult", False)))


def _format_from_dtypes(where: str, name: str, state: Mapping[str, torch.Tensor]) -> LayerFormat | None:
    weight = state[name + ".weight"]
    if weight.dtype in FP8_DTYPES:
        return LayerFormat(FP8)
    if weight.dtype == torch.uint8:
        if name + ".weight_scale_2" not in state:
            raise LTX25Error(where, f"tensor {name}.weight_scale_2", "missing",
                             "a per-tensor fp32 scale beside an NVFP4 (U8) weight", "The file is damaged.")
        return LayerFormat(NVFP4)
    if weight.dtype == torch.int8:
        raise LTX25Error(where, f"the format record of the int8 weight {name}.weight", "missing",
                         f"a {name}{RECORD_SUFFIX} tensor or a {RECORD_METADATA} metadata entry",
                         "Without it the int8 layout (rotation, scales) is unknown; use the file as ComfyUI wrote it.")
    return None


def plan(where: str, state: Mapping[str, torch.Tensor],
         metadata: Mapping[str, Any] | None = None) -> dict[str, QuantLayer]:
    """Every quantized weight of a read file, checked: `{layer name: QuantLayer}` (empty for a float file).

    A record whose weight is not in `state` is skipped (the state may be a prefix subset of the file); a quantized
    weight without its scales, a scale of the wrong size or an unsupported format raises LTX25Error naming the key."""
    records = _records(where, state, metadata)
    names = {k[: -len(".weight")] for k, t in state.items()
             if k.endswith(".weight") and (t.dtype in (torch.uint8, torch.int8, *FP8_DTYPES))}
    names |= {n for n in records if n + ".weight" in state}
    stray = [k for k in state if k.endswith(RECORD_SUFFIX) and k[: -len(RECORD_SUFFIX)] + ".weight" not in state]
    if stray:
        raise LTX25Error(where, f"tensor {stray[0]}", "a format record without its weight",
                         f"{stray[0][: -len(RECORD_SUFFIX)]}.weight beside it", "The file is damaged.")
    layers: dict[str, QuantLayer] = {}
    for name in sorted(names):
        fmt = _recorded_format(where, name, records[name]) if name in records else \
            _format_from_dtypes(where, name, state)
        if fmt is not None:
            layers[name] = QuantLayer(name, fmt)
            check_layer(where, layers[name], state)
    return layers


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def check_layer(where: str, layer: QuantLayer, state: Mapping[str, torch.Tensor]) -> None:
    """Dtypes and shapes of one layer's tensors; the first thing wrong raises LTX25Error naming its key."""
    name, kind = layer.name, layer.format.kind
    for key in layer.stored_keys():
        if key not in state:
            raise LTX25Error(where, f"tensor {key}", "missing", f"the scale of the {kind} weight {layer.weight_key}",
                             "The file is damaged or a partial repack; re-download it.")
    if name + ".pre_quant_scale" in state:
        raise LTX25Error(where, f"tensor {name}.pre_quant_scale", "present", "absent (no smoothing scales)",
                         "AWQ-style smoothed weights are not supported.")
    weight, scale = state[layer.weight_key], state[name + ".weight_scale"]
    storage = {NVFP4: (torch.uint8,), FP8: FP8_DTYPES, INT8: (torch.int8,)}[kind]
    if weight.dtype not in storage or weight.ndim != 2:
        raise LTX25Error(where, f"tensor {layer.weight_key}", f"{weight.dtype} {tuple(weight.shape)}",
                         f"a 2-D {' or '.join(map(str, storage))} weight for the {kind} format")
    rows, cols = weight.shape
    if kind == NVFP4:
        cols *= 2
        blocks = cols // NVFP4_BLOCK
        want = _padded(rows, 128) * _padded(blocks, 4)
        if cols % NVFP4_BLOCK or scale.dtype not in (torch.float8_e4m3fn, torch.uint8) or scale.numel() != want:
            raise LTX25Error(where, f"tensor {name}.weight_scale", f"{scale.dtype} {tuple(scale.shape)}",
                             f"{want} E4M3 block scales ({_padded(rows, 128)}×{_padded(blocks, 4)}, swizzled) for "
                             f"a [{rows}, {cols}] weight")
        _check_scalar(where, f"{name}.weight_scale_2", state[name + ".weight_scale_2"], (1,))
    else:
        _check_scalar(where, f"{name}.weight_scale", scale, (1, rows))
    group = layer.format.convrot_groupsize
    if group and (group < 4 or 4 ** round(math.log(group, 4)) != group or cols % group):
        raise LTX25Error(where, f"convrot_groupsize of {name}", group,
                         f"a power of 4 that divides the {cols} input features")


def _check_scalar(where: str, key: str, tensor: torch.Tensor, sizes: tuple[int, ...]) -> None:
    if not tensor.is_floating_point() or tensor.dtype in FP8_DTYPES or tensor.numel() not in sizes:
        raise LTX25Error(where, f"tensor {key}", f"{tensor.dtype} {tuple(tensor.shape)}",
                         f"float32 with {' or '.join(map(str, sizes))} value(s)")


# ---------------------------------------------------------------------------------------------------- dequantize
def swizzled_offsets(rows: int, cols: int) -> torch.Tensor:
    """Flat offsets into a 128×4-swizzled scale buffer for logical (r, c), as [rows, cols]."""
    padded_cols = _padded(cols, 4)
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    tile = (r // 128) * (padded_cols // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def unswizzle(block_scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """128×4-swizzled E4M3 buffer → logical `[rows, cols]` E4M3 (a permuted copy: the buffer is
    `[row tile, col tile, r % 32, (r % 128) // 32, c % 4]`)."""
    padded_rows, padded_cols = _padded(rows, 128), _padded(cols, 4)
    tiles = block_scale.reshape(-1).view(torch.uint8).reshape(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    logical = tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)[:rows, :cols]
    return logical.contiguous().view(torch.float8_e4m3fn)


_BYTE_TABLES: dict[torch.device, torch.Tensor] = {}


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2] float32: the E2M1 values of a byte's high and low nibble (one lookup decodes two elements)."""
    if device not in _BYTE_TABLES:
        magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        nibble = magnitudes.repeat(2) * torch.tensor([1.0] * 8 + [-1.0] * 8)  # bit 3 is the sign
        byte = torch.arange(256)
        _BYTE_TABLES[device] = torch.stack([nibble[byte >> 4], nibble[byte & 0xF]], dim=-1).to(device)
    return _BYTE_TABLES[device]


def nvfp4_scales(block_scale: torch.Tensor, tensor_scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The float32 scale of each block of 16 weights, `[rows, cols / 16]`: block scale × tensor scale."""
    return unswizzle(block_scale, rows, cols // NVFP4_BLOCK).float() * tensor_scale.float().reshape(())


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[out, in/2] U8 + swizzled E4M3 block scales + fp32 scalar → [out, in] `dtype`: e2m1 · (block · tensor scale),
    in float32 (the two scales multiply on the small `[out, in/16]` grid, so the big tensor takes one product)."""
    rows, half = packed.shape
    cols = half * 2
    scales = nvfp4_scales(block_scale, tensor_scale, rows, cols)
    values = torch.nn.functional.embedding(packed.int(), _byte_table(packed.device))  # [rows, in/2, 2], high first
    values = values.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK).mul_(scales.unsqueeze(-1))
    return values.reshape(rows, cols).to(dtype)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[out, in] FP8 × fp32 scale (a scalar or one per row) → `dtype`, computed in float32."""
    return (weight.float() * _per_row(scale)).to(dtype)


def _per_row(scale: torch.Tensor) -> torch.Tensor:
    """A scalar stays a scalar; one value per output row becomes a column `[out, 1]`."""
    return scale.float().reshape(()) if scale.numel() == 1 else scale.float().reshape(-1, 1)


_HADAMARDS: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}


def hadamard(size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The normalized regular Hadamard matrix of `size` (a power of 4): Kronecker powers of the symmetric 4×4 block
    with one −1 per row on the anti-diagonal, divided by √size (entries ±2^-k, exact in every float dtype)."""
    key = (size, torch.device(device), dtype)
    if key not in _HADAMARDS:
        block = torch.ones(4, 4, dtype=torch.float64) - 2 * torch.eye(4, dtype=torch.float64).flip(1)
        h = block
        while h.shape[0] < size:
            h = torch.kron(h, block)
        _HADAMARDS[key] = (h / math.sqrt(size)).to(device=device, dtype=dtype)
    return _HADAMARDS[key]


def rotate_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x `[..., K]` with each group of `group` features multiplied by H (its own inverse): rotates a float weight
    into the stored basis, a stored weight back, or the activations of an int8-convrot Linear."""
    shape = x.shape
    grouped = x.reshape(-1, shape[-1] // group, group)
    return torch.matmul(grouped, hadamard(group, x.device, x.dtype)).reshape(shape)


def dequantize_int8(weight: torch.Tensor, scale: torch.Tensor, convrot_groupsize: int = 0,
                    dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[out, in] I8 × fp32 scale (scalar or per row), rotated back when `convrot_groupsize` → `dtype`, in float32."""
    weight = weight.float() * _per_row(scale)
    return (rotate_groups(weight, convrot_groupsize) if convrot_groupsize else weight).to(dtype)


def dequantize_layer(layer: QuantLayer, state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The float weight of one planned layer: the reference every quantized compute path is tested against."""
    name, fmt = layer.name, layer.format
    weight, scale = state[layer.weight_key], state[name + ".weight_scale"]
    if fmt.kind == NVFP4:
        return dequantize_nvfp4(weight, scale, state[name + ".weight_scale_2"], dtype)
    if fmt.kind == FP8:
        return dequantize_fp8(weight, scale, dtype)
    return dequantize_int8(weight, scale, fmt.convrot_groupsize, dtype)


def dequantize_state_dict(where: str, state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16,
                          metadata: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Replace every quantized `.weight` (+ its scales, record and input scale) by a float weight in `dtype`;
    other tensors pass through unchanged."""
    layers = plan(where, state, metadata)
    consumed = {k for layer in layers.values() for k in (*layer.stored_keys(), *layer.consumed_keys(state))}
    out = {k: v for k, v in state.items() if k not in consumed}
    out.update({layer.weight_key: dequantize_layer(layer, state, dtype) for layer in layers.values()})
    return out


# ---------------------------------------------------------------------------------------------------- quantize
def quantize_nvfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float `[out, in]` (in % 16 = 0) → {"weight", "weight_scale", "weight_scale_2"} in the NVFP4 file layout:
    per-tensor scale amax / (448·6), E4M3 block scales block-amax / 6 / it, round-to-nearest E2M1."""
    w = weight.float()
    rows, cols = w.shape
    tensor_scale = (w.abs().amax() / (E4M3_MAX * 6)).clamp(min=torch.finfo(torch.float32).tiny)
    blocks = w.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    block_scale = (blocks.abs().amax(-1) / 6 / tensor_scale).to(torch.float8_e4m3fn)
    values = blocks / (block_scale.float() * tensor_scale).clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)
    table = torch.tensor(E2M1_VALUES, device=w.device)
    codes = torch.bucketize(values.abs(), (table[1:] + table[:-1]) / 2) | ((values < 0).long() << 3)
    codes = codes.reshape(rows, cols)
    packed = ((codes[:, 0::2] << 4) | codes[:, 1::2]).to(torch.uint8)
    nblocks = cols // NVFP4_BLOCK
    swizzled = torch.zeros(_padded(rows, 128) * _padded(nblocks, 4), dtype=torch.uint8, device=w.device)
    swizzled[swizzled_offsets(rows, nblocks).flatten().to(w.device)] = block_scale.view(torch.uint8).flatten()
    return {"weight": packed,
            "weight_scale": swizzled.view(torch.float8_e4m3fn).reshape(_padded(rows, 128), _padded(nblocks, 4)),
            "weight_scale_2": tensor_scale.reshape(())}


def quantize_fp8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float `[out, in]` → {"weight" E4M3, "weight_scale" fp32 scalar = amax / 448}."""
    w = weight.float()
    scale = (w.abs().amax() / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return {"weight": (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(())}


def quantize_fp8_rows(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float `[out, in]` → {"weight" E4M3, "weight_scale" fp32 `[out]` = each row's amax / 448}: one scale per
    output row, so a row of small weights keeps E4M3's 3 mantissa bits instead of being scaled by the largest row
    (the FP8 compute mode's weights; the loader and `fp8_linear` take either layout)."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return {"weight": (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), "weight_scale": scale}


def quantize_int8(weight: torch.Tensor, convrot_groupsize: int = 0) -> dict[str, torch.Tensor]:
    """Float `[out, in]` → {"weight" I8, "weight_scale" fp32 [out, 1]}: rotated first when `convrot_groupsize`,
    then one scale per row (row amax / 127), rounded to nearest."""
    w = weight.float()
    if convrot_groupsize:
        w = rotate_groups(w, convrot_groupsize)
    scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    return {"weight": (w / scale).round().clamp(-128, 127).to(torch.int8), "weight_scale": scale}


def quantize(fmt: LayerFormat, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored tensors (file suffixes after `<layer>.`) of `weight` in `fmt`."""
    if fmt.kind == NVFP4:
        return quantize_nvfp4(weight)
    if fmt.kind == FP8:
        return quantize_fp8(weight)
    return quantize_int8(weight, fmt.convrot_groupsize)


def comfy_record(fmt: LayerFormat) -> dict[str, Any]:
    """ComfyUI's per-layer record of `fmt` (what its `comfy_quant` tensors and metadata entry hold)."""
    record: dict[str, Any] = {"format": {NVFP4: "nvfp4", FP8: "float8_e4m3fn", INT8: "int8_tensorwise"}[fmt.kind]}
    if fmt.convrot_groupsize:
        record |= {"convrot": True, "convrot_groupsize": fmt.convrot_groupsize}
    return record


def record_tensor(record: Mapping[str, Any]) -> torch.Tensor:
    """A record as ComfyUI stores it per layer: the JSON's UTF-8 bytes as a U8 tensor."""
    return torch.tensor(list(json.dumps(dict(record)).encode("utf-8")), dtype=torch.uint8)
