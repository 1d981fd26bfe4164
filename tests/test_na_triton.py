"""The fused Triton neighborhood-attention kernel (`na_triton`), run by Triton's interpreter on the CPU (conftest sets
TRITON_INTERPRET without a GPU): exact against the dense window-masked reference on borders, kernel = axis, tiles that
do not divide the grid, batch and heads, strided inputs, key blocks holding none of a row's window, and fp16 (bf16
is compared with `sdpa` on the GPU by bench/bench_na_kernel.py); the fused norm + RoPE pass against diffusers; when
the kernel counts as available."""
from __future__ import annotations

import pytest
import torch

from nodes.ltx import compat
from nodes.ltx.kernels import na_triton
from test_na_attention import _dense_reference, _qkv

SMALL = na_triton.KernelConfig(tile=(1, 4, 4), block_n=16)  # many key blocks per tile, some empty for a row
CASES = [  # (q shape [B, T, H, W, heads, D], kernel, launch)
    ((1, 6, 8, 8, 2, 16), (3, 5, 5), SMALL),
    ((2, 7, 9, 11, 3, 8), (3, 3, 5), na_triton.DEFAULT_CONFIG),  # batch and heads; D below 16 is padded
    ((1, 7, 7, 9, 1, 16), (7, 7, 7), na_triton.DEFAULT_CONFIG),  # kernel = axis (T, H); the production tile
    ((1, 14, 6, 5, 2, 8), (5, 3, 3), na_triton.DEFAULT_CONFIG),  # interior frames and both border runs
    ((1, 5, 13, 6, 2, 24), (5, 7, 3), SMALL),                  # tiles that do not divide the axes; D = 24
]


@pytest.mark.parametrize("shape,kernel,config", CASES)
def test_triton_kernel_equals_dense_window_attention(shape, kernel, config):
    q, k, v = _qkv(shape)
    got = na_triton.na3d_triton(q, k, v, kernel, config)
    want = _dense_reference(q.double(), k.double(), v.double(), kernel).float()
    assert torch.allclose(got, want, atol=1e-5), f"max diff {(got - want).abs().max():.3e}"


def test_triton_kernel_reads_strided_inputs_and_half_precision():
    """Q/K/V as views of one fused projection (shared strides, not contiguous), and in half precision: fp16 here
    (Triton's interpreter mishandles bf16 stores; bf16 is checked on the GPU against `sdpa` by
    bench/bench_na_kernel.py)."""
    shape, kernel = (1, 6, 8, 8, 2, 16), (3, 5, 5)
    fused = torch.randn(*shape[:4], 3, shape[4], shape[5], generator=torch.Generator().manual_seed(1))
    q, k, v = fused.unbind(4)
    assert not q.is_contiguous() and q.stride() == k.stride()
    want = _dense_reference(q.double(), k.double(), v.double(), kernel)
    got = na_triton.na3d_triton(q, k, v, kernel, SMALL)
    assert torch.allclose(got.double(), want, atol=1e-5), f"strided: max diff {(got - want).abs().max():.3e}"
    low = na_triton.na3d_triton(q.half(), k.half(), v.half(), kernel, SMALL)
    assert low.dtype == torch.float16
    assert torch.allclose(low.double(), want, atol=1e-2), f"fp16: max diff {(low - want).abs().max():.3e}"


def test_triton_kernel_writes_over_the_query_it_reads():
    """The lean blocks' attention: q, k, v views of one fused projection, the output written over q (each program
    reads its own query rows before it stores them; no other program reads them) equals the out-of-place result,
    and k, v are untouched. An output of the wrong shape is refused."""
    shape, kernel, config = (2, 5, 6, 6, 2, 16), (3, 3, 3), na_triton.KernelConfig(tile=(2, 4, 4), block_n=32)
    fused = torch.randn(*shape[:4], 3, shape[4], shape[5], generator=torch.Generator().manual_seed(3))
    q, k, v = fused.unbind(4)
    want = na_triton.na3d_triton(q, k, v, kernel, config)
    kept = fused[:, :, :, :, 1:].clone()
    got = na_triton.na3d_triton(q, k, v, kernel, config, out=q)
    assert got is q and torch.equal(got, want) and torch.equal(fused[:, :, :, :, 1:], kept)
    with pytest.raises(ValueError, match="out must be"):
        na_triton.na3d_triton(q, k, v, kernel, config, out=torch.empty(1, dtype=q.dtype))


def test_unavailable_without_cuda():
    usable, why = na_triton.available(torch.device("cpu"))
    assert not usable and "CUDA" in why


def test_triton_processor_inside_the_tiny_decoder(tiny_file, monkeypatch):
    """Through diffusers' attention modules (project_qkv's strides, RoPE, pre-scaled q, to_out): the tiny decoder's
    stages 1-3, which run every deterministic-stage attention module, agree with the `sdpa` processor — with the
    fused norm + RoPE projection on the triton side only."""
    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.kernels import na_attention as na
    vae = dv.load_diffusion_vae(tiny_file("diffusion_vae"), torch.float32)
    latent = torch.randn(1, 128, 3, 3, 3, generator=torch.Generator().manual_seed(0))
    fused_calls = []
    real_norm_rope = na_triton.norm_rope

    def spy(*args, **kwargs):
        fused_calls.append(args[0].shape)
        return real_norm_rope(*args, **kwargs)

    monkeypatch.setattr(na_triton, "norm_rope", spy)
    with torch.inference_mode():
        na.install_processor(vae.model, na.SdpaNAProcessor())
        ref = compat.stages_1_to_3_before_last_upsample(vae.model.decoder, latent)
        assert not fused_calls  # the reference processors keep the unfused projection
        na.install_processor(vae.model, na.TritonNAProcessor())
        got = compat.stages_1_to_3_before_last_upsample(vae.model.decoder, latent)
    assert fused_calls  # the triton processor's projection is the fused norm + RoPE pass
    assert torch.allclose(got, ref, atol=1e-4), f"max diff {(got - ref).abs().max():.3e}"


@pytest.mark.parametrize("dim,head_dim,scale", [(256, 64, 0.125), (64, 16, 1.0), (96, 48, 0.5)])
def test_norm_rope_kernel_matches_the_module(dim, head_dim, scale):
    """The fused RMS norm + 3-D RoPE (+ the query's scale) equals diffusers' `norm_q` then its `rope`, times scale:
    float32 to rounding (the module's own frequencies and pair layout; head_dim 48 pads the pairs to 32 lanes)."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttention
    torch.manual_seed(0)
    attn = LTX2VideoVaeNeighborhoodAttention(dim, (3, 3, 3), head_dim=head_dim)
    for p in attn.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(2, 5, 6, 7, attn.heads, head_dim)
    want = attn.rope(attn.norm_q(x)) * scale
    got = na_triton.norm_rope(x, attn.norm_q, attn.rope, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    half = na_triton.norm_rope(x.half(), attn.norm_q.half(), attn.rope, scale)
    torch.testing.assert_close(half.float(), want, rtol=2e-3, atol=2e-3)


def test_norm_rope_reads_and_writes_views_of_one_fused_projection():
    """The triton processor projects q|k|v with one GEMM and normalizes q and k where they lie (token stride
    3·heads·D): out of place the result equals the contiguous input's; in place it lands in the buffer and leaves
    the neighbouring v as it was."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttention
    torch.manual_seed(1)
    attn = LTX2VideoVaeNeighborhoodAttention(32, (3, 3, 3), head_dim=16)
    for p in attn.parameters():
        p.data.normal_(0, 0.3)
    fused = torch.randn(1, 3, 4, 5, 3, attn.heads, 16)
    query, _key, value = fused.unbind(4)
    want = na_triton.norm_rope(query.contiguous(), attn.norm_q, attn.rope, 0.25)
    torch.testing.assert_close(na_triton.norm_rope(query, attn.norm_q, attn.rope, 0.25), want, rtol=0, atol=0)
    value_before = value.clone()
    assert na_triton.norm_rope(query, attn.norm_q, attn.rope, 0.25, in_place=True).data_ptr() == query.data_ptr()
    torch.testing.assert_close(query, want, rtol=0, atol=0)
    assert torch.equal(value, value_before)


def test_unavailable_before_ampere(monkeypatch):
    """Triton's bf16 matmul needs compute capability 8.0: an older GPU is refused by name, so auto falls back."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    usable, why = na_triton.available(torch.device("cuda"))
    assert not usable and "Tesla T4" in why and "8.0" in why


def test_unusable_when_the_first_launch_fails(monkeypatch):
    """Triton can import and still fail to build (no C compiler, no ptxas): the first launch is tried once per GPU,
    and its failure makes the kernel unavailable, so auto falls back instead of crashing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler")

    monkeypatch.setattr(na_triton, "na3d_triton", broken)
    cpu_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None: cpu_randn(*shape, dtype=dtype))
    na_triton._first_launch.cache_clear()
    try:
        usable, why = na_triton.available(torch.device("cuda", 0))
    finally:
        na_triton._first_launch.cache_clear()
    assert not usable and "first launch failed" in why and "C compiler" in why


@pytest.mark.parametrize("tile,block_n", [((3, 4, 8), 64), ((4, 4, 8), 48), ((1, 2, 4), 64)])
def test_launch_shapes_must_be_powers_of_two(tile, block_n):
    with pytest.raises(ValueError, match="power of two"):
        na_triton.KernelConfig(tile=tile, block_n=block_n)


def test_float32_inputs_keep_ieee_matmuls(monkeypatch):
    """On NVIDIA GPUs Triton's tl.dot defaults to TF32 for float32 (a 10-bit mantissa), which the interpreter does
    not reproduce; the launch asks for IEEE float32 whenever the inputs are float32."""
    seen = []

    class Launcher:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(args[-1])

    monkeypatch.setattr(na_triton, "_kernel", Launcher())
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.zeros(1, 3, 4, 4, 1, 16, dtype=dtype)
        na_triton.na3d_triton(q, q, q, (3, 3, 3))
    assert seen == ["ieee", "tf32"]
