"""Quantized variants of the tiny transformer and text encoder, derived from their bf16 tiny files in the layouts the
quantized releases use (nodes/ltx/files/quant.py describes each):

- `nvfp4`: the released `-nvfp4` transformer's layout — `.weight` U8, `.weight_scale` E4M3 (swizzled),
  `.weight_scale_2` and `.input_scale` fp32 scalars; no format record (the LTX files carry none).
- `fp8`: `.weight` E4M3, `.weight_scale` and `.input_scale` fp32 scalars (ltx-core's FP8 layout; with `record`,
  ComfyUI's `float8_e4m3fn` record beside it).
- `int8-convrot`: ComfyUI's `*-comfy-int8-convrot` layout — `.weight` I8 rotated per group, `.weight_scale` fp32
  `[out, 1]`, and the format record `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": g}` as a
  per-layer `.comfy_quant` U8 tensor (`record="tensors"`, what ComfyUI writes) or in the `_quantization_metadata`
  metadata entry (`record="metadata"`).

    python -m nodes.tools.tiny.quantized SRC DST {nvfp4,fp8,int8-convrot}

Which weights: the transformer blocks' attention q/k/v/out and feed-forward Linears of both streams (the released
file reads its own list from the header; this set covers video, audio and cross-modal shapes); in the text encoder
every Gemma decoder-layer Linear and the embedding table (a quantized non-Linear weight the loader dequantizes).
The tiny convrot group is 16 (the release uses 256): the tiny widths (32, 64) are not multiples of 256.
"""
from __future__ import annotations

import argparse
import json
import re
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...ltx.files import quant
from ...ltx.files.quant import FP8, INT8, NVFP4, LayerFormat

VARIANTS = {"nvfp4": LayerFormat(NVFP4), "fp8": LayerFormat(FP8), "int8-convrot": LayerFormat(INT8, 16)}
TRANSFORMER_LINEARS = re.compile(r"model\.diffusion_model\.transformer_blocks\.\d+\.\w+\."
                                 r"(to_q|to_k|to_v|to_out\.0|net\.0\.proj|net\.2)\.weight")
TEXT_ENCODER_WEIGHTS = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight"
                                  r"|model\.embed_tokens\.weight")
STATIC_INPUT_SCALE = 1.0  # the files' calibrated activation scale; the loader reads it and scales activations itself


def quantize_file(src: str, dst: str, variant: str, select: re.Pattern, record: str | None = None) -> str:
    """Copy `src` to `dst` with every weight whose name fully matches `select` quantized as `variant`; other tensors
    and the metadata are copied unchanged. `record`: None (the variant's own habit), "tensors" or "metadata"."""
    fmt = VARIANTS[variant]
    record = record or ("tensors" if fmt.kind == INT8 else None)
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = dict(f.metadata() or {})
    records: dict[str, Mapping] = {}
    for key in [k for k in tensors if select.fullmatch(k)]:
        layer = key[: -len(".weight")]
        stored = quant.quantize(fmt, tensors.pop(key).float())
        tensors.update({f"{layer}.{suffix}": t.contiguous() for suffix, t in stored.items()})
        if fmt.kind != INT8:
            tensors[layer + ".input_scale"] = torch.tensor(STATIC_INPUT_SCALE)
        if record is not None:
            records[layer] = quant.comfy_record(fmt)
    if record == "tensors":
        tensors.update({layer + quant.RECORD_SUFFIX: quant.record_tensor(r) for layer, r in records.items()})
    elif record == "metadata":
        metadata[quant.RECORD_METADATA] = json.dumps({"format_version": "1.0", "layers": records})
    # Written as they are: a generic save that casts floating tensors would turn the E4M3/fp32 scales into bf16.
    save_file(tensors, dst, metadata=metadata)
    return dst


def write_tiny_transformer(src: str, dst: str, variant: str, record: str | None = None) -> str:
    """The tiny transformer `src` (bf16) quantized as `variant` into `dst`."""
    return quantize_file(src, dst, variant, TRANSFORMER_LINEARS, record)


def write_tiny_text_encoder(src: str, dst: str, variant: str = "int8-convrot", record: str | None = None) -> str:
    """The tiny text encoder `src` (bf16) quantized as `variant` (the release: int8-convrot) into `dst`."""
    return quantize_file(src, dst, variant, TEXT_ENCODER_WEIGHTS, record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.tools.tiny.quantized", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a tiny transformer or text-encoder file (bf16)")
    parser.add_argument("dst")
    parser.add_argument("variant", choices=list(VARIANTS))
    parser.add_argument("--record", choices=("tensors", "metadata"), default=None)
    args = parser.parse_args(argv)
    with safe_open(args.src, framework="pt") as f:
        is_encoder = "tokenizer_json" in f.keys()
    (write_tiny_text_encoder if is_encoder else write_tiny_transformer)(args.src, args.dst, args.variant, args.record)
    print(args.dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
