"""Stage 5's fused block forward (`fused_block`), run by Triton's interpreter on the CPU: equal to diffusers' own
`LTX2VideoVaeDiffusionNABlock.forward` in float32 (norm·modulation, in-place residuals, tiled SwiGLU with the
silu·gate pass), installed only with the triton processor, and the decode through it equal to the reference."""
from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

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


def _inputs(seed=1, shape=(2, 5, 6, 7)):
    g = torch.Generator().manual_seed(seed)
    hidden, context = torch.randn(*shape, 32, generator=g), torch.randn(*shape, 24, generator=g)
    modulation = tuple(torch.randn(shape[0], 1, 1, 1, 32, generator=g) * 0.5 for _ in range(7))
    return hidden, context, modulation


def test_fused_block_forward_equals_diffusers_forward():
    """The whole block (context injection, modulated attention and MLP, ungated residuals) with a batch of two and
    different timesteps per item, with a processor that does not project q|k|v at once (the attention through
    the module's own call). The residuals go into its input, which it returns: diffusers' loop rebinds its name
    to the result, and a fresh tensor would keep the previous block's output alive beside it."""
    from nodes.ltx.kernels import na_attention as na
    block = _block()
    block.attn.set_processor(na.SdpaNAProcessor())
    hidden, context, modulation = _inputs()
    original = hidden.clone()
    with torch.inference_mode():
        want = block(original.clone(), context, modulation)
        fused_block.use_fused_blocks(block, True)
        got = block(hidden, context, modulation)
        fused_block.use_fused_blocks(block, False)
        again = block(original.clone(), context, modulation)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got is hidden and torch.equal(again, want)


def _det_block(dim=32, head_dim=16, seed=3):
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNABlock
    torch.manual_seed(seed)
    block = LTX2VideoVaeNABlock(dim, (3, 3, 3), head_dim=head_dim)
    for p in block.parameters():
        p.data.normal_(0, 0.2)
    return block.eval()


@pytest.mark.parametrize("stage", [5, 4])
def test_lean_blocks_with_the_triton_processor_equal_diffusers_forward(monkeypatch, stage):
    """With the triton processor (Triton's interpreter here) the blocks take the lean path: q|k|v projected a
    chunk of rows at a time from the normed (stage 5: modulated) rows, normed and rotated in place, the attention
    written over q, the output projection and the context projection added a chunk at a time, the MLP in chunks.
    Chunks of 7 rows (not dividing the 210 tokens of an item) and a batch of two, strided as a temporal upsample
    that dropped its leading frame leaves it (the items' tokens contiguous, the batch not); equal to diffusers' own
    forward (stage 5: `LTX2VideoVaeDiffusionNABlock`, stages 1-4: `LTX2VideoVaeNABlock`) with the sdpa processor."""
    from nodes.ltx.kernels import na_attention as na
    monkeypatch.setattr(fused_block, "CHUNK_ELEMENTS", 7 * 32 * 4)  # 7 rows of the MLP's hidden width, 28 of C
    monkeypatch.setattr(fused_block, "SWIGLU_TOKENS", 7)
    block = _block() if stage == 5 else _det_block()
    hidden, context, modulation = _inputs(shape=(2, 6, 6, 7))
    hidden, context = hidden[:, 1:], context[:, 1:]
    assert not hidden.is_contiguous() and hidden[0].is_contiguous()
    args = (context, modulation) if stage == 5 else ()
    with torch.inference_mode():
        block.attn.set_processor(na.SdpaNAProcessor())
        want = block(hidden.clone(), *args)
        block.attn.set_processor(na.TritonNAProcessor())
        assert na.adds_in_place(block.attn)
        fused_block.use_fused_blocks(block, True)
        got = block(hidden, *args)
        fused_block.use_fused_blocks(block, False)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got is hidden


class _NotLaunched:
    """A Triton kernel's launch syntax (`kernel[grid](...)`) that runs nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class _LiveBytes(TorchDispatchMode):
    """The most bytes of tensor storage made inside it and alive at once (checked after every op): a block's
    temporaries; the storages of `existing` (its inputs and weights, and so their views) not counted."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.existing = {t.untyped_storage().data_ptr() for t in existing}
        self.live: dict[int, tuple] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {ptr: (ref, size) for ptr, (ref, size) in self.live.items() if not ref.expired()}
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in self.live and \
                    tensor.untyped_storage().data_ptr() not in self.existing:
                storage = tensor.untyped_storage()
                self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.peak = max(self.peak, sum(size for _, size in self.live.values()))
        return out


@pytest.mark.parametrize("stage", [5, 4])
def test_lean_blocks_hold_only_qkv_and_a_chunk_beside_their_inputs(monkeypatch, stage):
    """The byte count the planner's `LEAN_STAGE5_LIVE` (5: context, hidden state and q|k|v) and `LEAN_DET_LIVE`
    (4: hidden state and q|k|v) rest on: beyond its inputs, the lean block never holds more than q|k|v (3 tensors
    of its width) and a few chunks, while diffusers' block holds more than twice that. A fresh full-size tensor
    anywhere (a residual out of place, the attention output beside q|k|v, an unchunked projection) breaks it."""
    from nodes.ltx.kernels import na_attention as na
    from nodes.ltx.kernels import na_triton
    monkeypatch.setattr(fused_block, "CHUNK_ELEMENTS", 8 * 128)  # 8 rows of the MLP's hidden width
    monkeypatch.setattr(fused_block, "SWIGLU_TOKENS", 8)
    # The launchers run as on the GPU (their outputs allocated, or written in place), the kernels not: Triton's
    # interpreter copies every argument's storage to run one, which would be counted here.
    for module, name in ((fused_block, "_norm_modulate_kernel"), (fused_block, "_swiglu_kernel"),
                         (na_triton, "_kernel"), (na_triton, "_norm_rope_kernel")):
        monkeypatch.setattr(module, name, _NotLaunched())
    block = _block() if stage == 5 else _det_block()
    hidden, context, modulation = _inputs(shape=(1, 5, 8, 8))
    args = (context, modulation) if stage == 5 else ()
    unit = hidden.numel() * hidden.element_size()  # one tensor of the block's width
    peaks = {}
    with torch.inference_mode():
        block.attn.set_processor(na.TritonNAProcessor())
        block(hidden.clone(), *args)  # RoPE tables and one-hot masks are made on the first call, then cached
        for name, lean in (("diffusers", False), ("lean", True)):
            fused_block.use_fused_blocks(block, lean)
            state = hidden.clone()  # the lean block writes into it
            with _LiveBytes([state, context, *block.parameters()]) as live:
                block(state, *args)
            peaks[name] = live.peak
        fused_block.use_fused_blocks(block, False)
    chunks = 4 * fused_block.CHUNK_ELEMENTS * hidden.element_size()
    assert peaks["lean"] <= 3 * unit + chunks + (16 << 10), (peaks, unit)
    assert peaks["diffusers"] > 2 * (3 * unit + chunks), (peaks, unit)


def test_decode_uses_fused_blocks_only_with_the_triton_processor(tiny_file, monkeypatch):
    """The tiny decoder end to end (stage 5 included): `sdpa` runs diffusers' block forward, a processor with
    `fused_block` runs ours on every stage-5 block, and the frames agree. (The triton processor itself needs a GPU
    to be picked; here blocked SDPA stands in for its attention so only the block forward differs. This stand-in
    has no `fused_projection`, so the lean in-place path of stages 1-4 is not taken here; the lean tests above
    cover it.)"""
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
