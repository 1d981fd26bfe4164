"""NVFP4 → bf16/fp16 weight decode in one pass on the GPU, for `QuantizedLinear`'s just-in-time dequantization.

Hopper has no FP4 tensor cores, so an NVFP4 Linear decodes its weight before a plain GEMM, every call. In torch ops
(`files.quant.dequantize_nvfp4`: a byte-table lookup into float32, a multiply, a cast) that decode moves about 20
bytes per weight through memory; on the A/B graph's 24 GiB card it doubled the DiT's step (docs/PERFORMANCE.md).
This kernel reads the packed byte (half a byte a weight) and the weight's swizzled E4M3 block scale where the file
keeps it (a sixteenth of a byte a weight), multiplies the block scale by the tensor scale in float32 as
`dequantize_nvfp4` does, and writes the 16-bit weight, two per byte and contiguous: one launch per Linear, about
2.6 bytes of traffic a weight, and the same float32 products cast once, so its output equals `dequantize_nvfp4` bit
for bit. Each program decodes `ROW_BYTES` of one row, so a block scale's place in the 128×4-swizzled buffer follows
from the row and column alone.

Without Triton, or off CUDA (outside the tests, which run it in Triton's interpreter), `dequantize` is
`dequantize_nvfp4` itself.
"""
from __future__ import annotations

import logging

import torch

from .. import compile_cache
from ..files import quant

try:  # optional, as in na_triton.py
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

log = logging.getLogger("ltx25")
ROW_BYTES = 1024  # packed bytes of one row per program (2048 weights)
_WORKS: dict[str, bool] = {}  # device → the kernel compiled there and decoded a probe as the torch ops do


def available(device: torch.device) -> bool:
    """Whether `dequantize` runs the kernel for weights on `device`: Triton is there, the device is a CUDA GPU,
    and (checked once per device, outside compilation) a probe decodes as `dequantize_nvfp4` does. A GPU where
    Triton cannot build it keeps the torch-op decode instead of failing every NVFP4 layer."""
    if triton is None or device.type != "cuda":
        return False
    if torch.compiler.is_compiling():  # Inductor compiles its own Triton kernels for this device: Triton works
        return True
    key = str(device)
    if key not in _WORKS:
        _WORKS[key] = _probe(device)
    return _WORKS[key]


def _probe(device: torch.device) -> bool:
    packed = torch.arange(256, dtype=torch.uint8, device=device).reshape(16, 16)
    block_scale = torch.full((128, 4), 1.5, device=device).to(torch.float8_e4m3fn)  # one swizzled 128×4 tile
    tensor_scale = torch.tensor(0.5, device=device)
    try:
        got = _launch(packed, block_scale, tensor_scale, torch.bfloat16)
        works = torch.equal(got, quant.dequantize_nvfp4(packed, block_scale, tensor_scale, torch.bfloat16))
    except Exception as error:  # a Triton or driver that cannot build the kernel: the torch ops still work
        log.warning("LTX-2.5: the NVFP4 Triton decode does not run on %s (%s); NVFP4 layers decode with torch "
                    "ops there (slower)", device, error)
        return False
    if not works:
        log.warning("LTX-2.5: the NVFP4 Triton decode disagrees with the torch ops on %s; using the torch ops", device)
    return works


def dequantize(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor,
               dtype: torch.dtype = torch.bfloat16, *, force_kernel: bool = False) -> torch.Tensor:
    """`files.quant.dequantize_nvfp4` (same arguments, same result bit for bit) through the one-pass kernel where it
    runs; `force_kernel` runs it wherever Triton does (the CPU tests, in its interpreter)."""
    too_large = packed.numel() * 2 >= 2**31  # the kernel's offsets are int32
    if too_large or (not (force_kernel and triton is not None) and not available(packed.device)):
        return quant.dequantize_nvfp4(packed, block_scale, tensor_scale, dtype)
    return _launch(packed, block_scale, tensor_scale, dtype)


def _launch(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:
    rows, half = packed.shape
    out = torch.empty(rows, half * 2, dtype=dtype, device=packed.device)
    # the swizzled buffer's column tiles: 4 block scales (64 weights) each, the row's scales padded to a multiple of 4
    col_tiles = triton.cdiv(half * 2 // quant.NVFP4_BLOCK, 4)
    if not torch.compiler.is_compiling():  # the sampler applied it before compiling; keep Dynamo out of it
        compile_cache.ensure_applied()
    grid = (rows, triton.cdiv(half, ROW_BYTES))
    _decode[grid](packed.contiguous(), block_scale.reshape(-1).view(torch.uint8),
                  tensor_scale.float().reshape(1), out, half, col_tiles, BLOCK=ROW_BYTES)
    return out


if triton is not None:
    @triton.jit
    def _e2m1(nibble):
        # bit 3 sign, bits 2-1 exponent, bit 0 mantissa: 0, 0.5 (subnormal), then 2^(e-1)·(1 + m/2)
        e = (nibble >> 1) & 3
        m = (nibble & 1).to(tl.float32)
        power = tl.where(e == 3, 4.0, tl.where(e == 2, 2.0, 1.0))
        magnitude = tl.where(e == 0, 0.5 * m, power * (1.0 + 0.5 * m))
        # × −1, not unary minus: Triton lowers −x to 0 − x, which turns −0 (nibble 8) into +0
        return magnitude * tl.where((nibble & 8) != 0, -1.0, 1.0)

    @triton.jit
    def _e4m3(byte):
        # a block scale (never negative, never NaN): exponent bits 6-3 (bias 7), mantissa bits 2-0; the float32 with
        # the same exponent and mantissa, built from its bits so no FP8 type is needed (Triton's interpreter has none)
        e = (byte >> 3) & 15
        m = byte & 7
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m · 2^-9

    @triton.jit
    def _decode(packed_ptr, scale_ptr, tensor_scale_ptr, out_ptr, half, col_tiles, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        column = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # byte column in the row
        inside = column < half
        byte = tl.load(packed_ptr + row * half + column, mask=inside, other=0).to(tl.int32)
        # 8 bytes (16 weights) share a block scale; the buffer is [row tile, col tile, r % 32, (r % 128) // 32, c % 4]
        c = column // 8
        swizzled = ((row // 128) * col_tiles + c // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + c % 4
        block = _e4m3(tl.load(scale_ptr + swizzled, mask=inside, other=0).to(tl.int32))
        scale = block * tl.load(tensor_scale_ptr)  # the float32 product dequantize_nvfp4 forms
        weights = tl.interleave(_e2m1(byte >> 4) * scale, _e2m1(byte & 15) * scale)  # the high nibble first
        weight_column = tl.program_id(1) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
        tl.store(out_ptr + row * 2 * half + weight_column, weights.to(out_ptr.dtype.element_ty),
                 mask=weight_column < 2 * half)
