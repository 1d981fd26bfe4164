"""Stage 5's fused block forward (`fused_block`), run by Triton's interpreter on the CPU: equal to diffusers' own
`LTX2VideoVaeDiffusionNABlock.forward` in float32 (norm·modulation, in-place residuals, tiled SwiGLU with the
silu·gate pass), installed only with the triton processor, and the decode through it equal to the reference."""
from __future__ import annotations

import pytest
import torch

from nodes.ltx.kernels import fused_block
pytest.importorskip("triton")


def _block(dim=32, head_dim=16, seed=0):
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeDiffusionNABlock
    torch.manual_seed(seed)
    block = LTX2VideoVaeDiffusionNABlock(dim, (3, 3, 3), context_channels=24, head_dim=head_dim)
    for p in block.parameters():
        p.data.normal_(0, 0.2)
    return block.eval()


def test_norm_modulate_equals_norm_then_modulation():
    """One pass for `norm(x) * (1 + scale) + shift`, per batch item's own scale and shift; C = 40 pads the lanes."""
    norm = torch.nn.RMSNorm(40, eps=1e-6)
    norm.weight.data.normal_(1, 0.3)
    x = torch.randn(2, 3, 5, 7, 40)
    scale, shift = torch.randn(2, 1, 1, 1, 40), torch.randn(2, 1, 1, 1, 40)
    want = norm(x) * (1 + scale) + shift
    torch.testing.assert_close(fused_block.norm_modulate(x, norm, scale, shift), want, rtol=1e-5, atol=1e-5)


def test_swiglu_tiles_accumulate_into_the_residual():
    """`out += mlp(x)` over token tiles that do not divide the tokens (the last one short) equals the module."""
    block = _block()
    x, out = torch.randn(1, 3, 4, 5, 32), torch.randn(1, 3, 4, 5, 32)
    want = out + block.mlp(x)
    fused_block.swiglu_add_(block.mlp, x, out, tokens=7)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_swiglu_gemm_accumulates_over_k_steps_and_partial_blocks():
    """The one-GEMM gate|up with silu·up in its epilogue: several K steps (the last one partial) and token and
    hidden blocks that do not divide the shape, against the two projections."""
    g = torch.Generator().manual_seed(2)
    x, gate, up = torch.randn(37, 80, generator=g), torch.randn(48, 80, generator=g), torch.randn(48, 80, generator=g)
    config = fused_block.GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2)
    want = torch.nn.functional.silu(x @ gate.T) * (x @ up.T)
    torch.testing.assert_close(fused_block.swiglu_hidden(x, gate, up, config), want, rtol=1e-5, atol=1e-4)


def test_fused_block_forward_equals_diffusers_forward():
    """The whole block (context injection, modulated attention and MLP, ungated residuals) with a batch of two and
    different timesteps per item; its input is left untouched (it is the previous block's output)."""
    from nodes.ltx.kernels import na_attention as na
    block = _block()
    block.attn.set_processor(na.SdpaNAProcessor())
    hidden, context = torch.randn(2, 5, 6, 7, 32), torch.randn(2, 5, 6, 7, 24)
    modulation = tuple(torch.randn(2, 1, 1, 1, 32) * 0.5 for _ in range(7))
    kept = hidden.clone()
    with torch.inference_mode():
        want = block(hidden, context, modulation)
        fused_block.use_fused_blocks(block, True)
        got = block(hidden, context, modulation)
        fused_block.use_fused_blocks(block, False)
        again = block(hidden, context, modulation)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(hidden, kept) and torch.equal(again, want)


def test_decode_uses_fused_blocks_only_with_the_triton_processor(tiny_file, monkeypatch):
    """The tiny decoder end to end (stage 5 included): `sdpa` runs diffusers' block forward, a processor with
    `fused_block` runs ours on every stage-5 block, and the frames agree. (The triton processor itself needs a GPU
    to be picked; here blocked SDPA stands in for its attention so only the block forward differs.)"""
    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.decode.tiling import TilingRequest
    from nodes.ltx.kernels import na_attention as na
    class FusedSdpa(na.SdpaNAProcessor):
        fused_block = True

    calls = []
    real = fused_block.block_forward
    monkeypatch.setattr(fused_block, "block_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    vae = dv.load_diffusion_vae(tiny_file("diffusion_vae"), torch.float32)
    latent = torch.randn(1, 128, 2, 2, 2, generator=torch.Generator().manual_seed(0))
    ref, _ = dv.decode(vae, latent, processor=na.SdpaNAProcessor(), request=TilingRequest("off"), seed=3)
    assert not calls
    got, _ = dv.decode(vae, latent, processor=FusedSdpa(), request=TilingRequest("off"), seed=3)
    blocks = sum(type(m).__name__ == "LTX2VideoVaeDiffusionNABlock" for m in vae.model.modules())
    assert len(calls) == blocks > 0
    assert torch.allclose(got, ref, atol=1e-4), f"max diff {(got - ref).abs().max():.3e}"
