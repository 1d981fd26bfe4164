"""NVFP4 → bf16/fp16 weight decode in one pass on the GPU, for `QuantizedLinear`'s just-in-time dequantization.

Hopper has no FP4 tensor cores, so an NVFP4 Linear decodes its weight before a plain GEMM, every call. In torch ops
(`files.quant.dequantize_nvfp4`: a byte-table lookup into float32, a multiply, a cast) that decode moves about 20
bytes per weight through memory; on the A/B graph's 24 GiB card it doubled the DiT's step (docs/PERFORMANCE.md).
This kernel reads the packed byte (half a byte a weight) and the weight's float32 block scale and writes the 16-bit
weight: the same float32 products cast once, so its output equals `dequantize_nvfp4` bit for bit.

The scales are made as `dequantize_nvfp4` makes them (the swizzled E4M3 block scales unswizzled, × the tensor scale,
in float32: a sixteenth of the weight's size). Without Triton, or off CUDA (outside the tests, which run it in
Triton's interpreter), `dequantize` is `dequantize_nvfp4` itself.
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
BLOCK_BYTES = 1024  # packed bytes per program (2048 weights)
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
    if not (force_kernel and triton is not None) and not available(packed.device):
        return quant.dequantize_nvfp4(packed, block_scale, tensor_scale, dtype)
    return _launch(packed, block_scale, tensor_scale, dtype)


def _launch(packed: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:
    rows, half = packed.shape
    # contiguous: the kernel finds a weight's scale by its flat byte index / 8
    scales = quant.nvfp4_scales(block_scale, tensor_scale, rows, half * 2).contiguous()
    out = torch.empty(rows, half * 2, dtype=dtype, device=packed.device)
    n_bytes = packed.numel()
    if not torch.compiler.is_compiling():  # the sampler applied it before compiling; keep Dynamo out of it
        compile_cache.ensure_applied()
    _decode[(triton.cdiv(n_bytes, BLOCK_BYTES),)](packed.contiguous(), scales, out, n_bytes, BLOCK=BLOCK_BYTES)
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
    def _decode(packed_ptr, scale_ptr, out_ptr, n_bytes, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n_bytes
        byte = tl.load(packed_ptr + offsets, mask=inside, other=0).to(tl.int32)
        # 16 weights = 8 bytes share a scale; a row's bytes are a multiple of 8, so the flat index works across rows
        scale = tl.load(scale_ptr + offsets // 8, mask=inside, other=0.0)
        high, low = _e2m1(byte >> 4) * scale, _e2m1(byte & 15) * scale  # the high nibble is the first weight
        kind = out_ptr.dtype.element_ty
        tl.store(out_ptr + 2 * offsets, high.to(kind), mask=inside)
        tl.store(out_ptr + 2 * offsets + 1, low.to(kind), mask=inside)
