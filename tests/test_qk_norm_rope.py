"""The DiT's fused query/key norm + split RoPE (nodes/ltx/kernels/qk_norm_rope.py) against diffusers' two steps,
and the processor that uses it (nodes/ltx/dit/attention.py) against diffusers' processor on the tiny DiT. The
kernel runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by conftest.py without a GPU), which rounds
float32 to bfloat16 toward zero where the GPU rounds to nearest: float32 cases are exact to float32 rounding, float16
(rounded to nearest there too) shows the norm rounded before the rotation bit for bit, and the bfloat16 case is held
to two units in the last place."""
from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_ltx2 import (LTX2Attention, LTX2AudioVideoAttnProcessor,
                                                            apply_split_rotary_emb)

from nodes.ltx.dit import attention
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.kernels import qk_norm_rope

pytestmark = pytest.mark.skipif(qk_norm_rope._kernel is None, reason="Triton is not installed")


def _case(batch: int, tokens: int, heads: int, dim: int, seed: int = 0, affine: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, heads * dim, generator=g)
    norm = torch.nn.RMSNorm(heads * dim, eps=1e-6, elementwise_affine=affine)
    if affine:
        norm.weight.data = torch.randn(heads * dim, generator=g)
    angles = torch.randn(batch, heads, tokens, dim // 2, generator=g) * 3
    return x, norm, (angles.cos(), angles.sin())


def _reference(x, norm, freqs):
    with torch.no_grad():
        return apply_split_rotary_emb(norm(x), freqs)


@pytest.mark.parametrize("batch, tokens, heads, dim", [(1, 7, 4, 16), (2, 5, 3, 12), (1, 3, 32, 128)])
def test_the_fused_pass_is_diffusers_norm_then_split_rope(batch, tokens, heads, dim):
    """Shapes with padded heads and pairs (3 heads, 6 pairs) and the released DiT's 32 heads of 128."""
    x, norm, freqs = _case(batch, tokens, heads, dim)
    want, got = _reference(x, norm, freqs), qk_norm_rope.norm_split_rope(x, norm, freqs)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_strided_input_no_norm_weight_and_tables_shared_across_the_batch():
    """q as a view of a wider projection (tokens strided), a norm without weight, and batch-1 tables for a batch of
    two (guided passes share one positions table)."""
    x, norm, (cos, sin) = _case(2, 6, 4, 8, seed=1, affine=False)
    wide = torch.cat([x, torch.randn(2, 6, 32)], dim=2)[:, :, :32]
    got = qk_norm_rope.norm_split_rope(wide, norm, (cos[:1], sin[:1]))
    want = _reference(x, norm, (cos[:1].expand(2, -1, -1, -1), sin[:1].expand(2, -1, -1, -1)))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_half_precision_rounds_the_norm_before_the_rotation_as_diffusers_does():
    """float16: the fused pass equals diffusers' two steps bit for bit but for the odd float32-order tie (one
    rounding after the rotation alone would differ in about a third of the values)."""
    x, norm, freqs = _case(2, 6, 4, 16, seed=3)
    x, norm = x.half(), norm.half()
    want, got = _reference(x, norm, freqs), qk_norm_rope.norm_split_rope(x, norm, freqs)
    differ = (got != want).float().mean().item()
    assert differ <= 0.01, f"{differ:.1%} of the values differ from diffusers'"
    torch.testing.assert_close(got, want, rtol=2.0**-10, atol=2.0**-10 * want.abs().max().item())


def test_bfloat16_stays_within_two_units_in_the_last_place():
    x, norm, freqs = _case(2, 5, 4, 16, seed=2)
    x, norm = x.bfloat16(), norm.bfloat16()
    want, got = _reference(x, norm, freqs), qk_norm_rope.norm_split_rope(x, norm, freqs)
    assert got.dtype == torch.bfloat16
    # Two roundings (norm, rotation), truncated by the interpreter: a rotated pair carries its inputs' rounding, so
    # the bound is two units in the last place (2^-7 each) of the values' scale, and one on average.
    err, scale = (got.float() - want.float()).abs(), want.float().abs()
    assert err.max() <= 2 * 2.0**-7 * scale.max() and err.mean() <= 2.0**-7 * scale.mean(), (err.max(), err.mean())


def test_the_processor_computes_what_diffusers_processor_does(transformer, monkeypatch):
    """Every rotary attention call of a tiny DiT forward (video and audio self-attention, both audio–video
    cross-attentions), fed again to the fused processor and to diffusers' processor: the same output up to the order
    of float32 operations. And the forward itself takes the fused pass for q and k of all four in every block."""
    from test_transformer import inputs
    attentions = [m for m in transformer.dit.modules() if isinstance(m, LTX2Attention)]
    assert {type(m.processor) for m in attentions} == {attention.FusedQKAttnProcessor}, "installed by the loader"
    calls: list[tuple] = []
    hooks = [m.register_forward_pre_hook(lambda m, a, kw: calls.append((m, a, kw)), with_kwargs=True)
             for m in attentions]
    video, audio, cond = inputs()
    try:
        plain = T.denoise(transformer, video, audio, 0.7, cond, 24.0)  # the CPU: diffusers' path
    finally:
        for hook in hooks:
            hook.remove()
    rotary = [(m, a, kw) for m, a, kw in calls if kw.get("query_rotary_emb") is not None]
    assert len(rotary) == len(transformer.dit.transformer_blocks) * 4
    used = _forced(monkeypatch)
    with torch.no_grad():
        for module, args, kwargs in rotary:
            want = LTX2AudioVideoAttnProcessor()(module, *args, **kwargs)
            got = attention.FusedQKAttnProcessor()(module, *args, **kwargs)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    used.clear()
    fused = T.denoise(transformer, video, audio, 0.7, cond, 24.0)
    assert len(used) == 2 * len(rotary), "q and k of every rotary attention"
    for got, want in zip(fused, plain):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def _forced(monkeypatch):
    """The fused pass allowed on the CPU (Triton's interpreter) and its calls counted."""
    used: list[int] = []
    real = qk_norm_rope.norm_split_rope
    monkeypatch.setattr(qk_norm_rope, "available", lambda x: True)
    monkeypatch.setattr(qk_norm_rope, "norm_split_rope", lambda *args: used.append(1) or real(*args))
    return used


def test_masked_compiled_and_interleaved_calls_keep_diffusers_path(transformer, monkeypatch):
    """The fused pass has no mask: an attention mask (the IC-LoRA reference's bias) must reach diffusers' attention,
    as must calls inside torch.compile (Inductor fuses them itself) and interleaved RoPE (another pairing)."""
    from nodes.ltx.dit import reference_attention as R
    attn = transformer.dit.transformer_blocks[0].attn1
    tokens, width = 6, attn.inner_dim
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(1, tokens, attn.to_q.in_features, generator=g)
    angles = torch.randn(1, attn.heads, tokens, width // attn.heads // 2, generator=g)
    rotary = (angles.cos(), angles.sin())
    bias = torch.randn(tokens, tokens, generator=g)
    used = _forced(monkeypatch)
    with torch.no_grad():
        masked = R._BiasedSelfAttention(attention.FusedQKAttnProcessor(), bias)
        want = R._BiasedSelfAttention(LTX2AudioVideoAttnProcessor(), bias)
        torch.testing.assert_close(masked(attn, hidden, query_rotary_emb=rotary), want(attn, hidden,
                                                                                      query_rotary_emb=rotary))
        assert not used, "a masked call took the fused pass (the bias would be dropped)"
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        attention.FusedQKAttnProcessor()(attn, hidden, query_rotary_emb=rotary)
        assert not used, "a call under torch.compile took the fused pass"
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
        monkeypatch.setattr(attn, "rope_type", "interleaved")
        angles = torch.randn(1, tokens, width, generator=g)  # interleaved tables: [B, T, heads·D]
        attention.FusedQKAttnProcessor()(attn, hidden, query_rotary_emb=(angles.cos(), angles.sin()))
        assert not used, "an interleaved-RoPE call took the split-RoPE pass"
        monkeypatch.setattr(attn, "rope_type", "split")
        attention.FusedQKAttnProcessor()(attn, hidden, query_rotary_emb=rotary)
        assert len(used) == 2, "the plain call fuses q and k"


def test_a_device_where_the_kernel_fails_its_probe_keeps_diffusers_path(monkeypatch, caplog):
    """A device where the kernel cannot build or computes something else keeps diffusers' path, with one warning:
    the probe passes in the interpreter, and fails on a launch error or a wrong result."""
    assert qk_norm_rope._probe(torch.device("cpu"))
    real = qk_norm_rope.norm_split_rope

    def broken(*args):
        raise RuntimeError("no C compiler")
    monkeypatch.setattr(qk_norm_rope, "norm_split_rope", broken)
    with caplog.at_level("WARNING", logger="ltx25"):
        assert not qk_norm_rope._probe(torch.device("cpu"))
    assert "no C compiler" in caplog.text and "diffusers' norm and RoPE" in caplog.text
    monkeypatch.setattr(qk_norm_rope, "norm_split_rope", lambda x, norm, freqs: real(x, norm, freqs) * 1.1)
    caplog.clear()
    with caplog.at_level("WARNING", logger="ltx25"):
        assert not qk_norm_rope._probe(torch.device("cpu"))
    assert "wrong result" in caplog.text


def test_tables_that_do_not_fit_the_tensor_are_refused_by_name():
    x, norm, (cos, sin) = _case(1, 4, 2, 8)
    for bad in ((cos[:, :, :3], sin[:, :, :3]), (cos[:, :1], sin[:, :1]), (cos, sin[..., :2])):
        with pytest.raises(LTX25Error, match="rotary tables"):
            qk_norm_rope.norm_split_rope(x, norm, bad)
