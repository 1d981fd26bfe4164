"""The attention strength and mask of an IC-LoRA reference video (nodes/ltx/dit/reference_attention.py, guides.py
`ReferenceGuide`, nodes/comfy/reference_video.py; docs/MODEL.md §16.7): no matrix at strength 1 without a mask (the
forward is today's), the bias against ltx-core's block formula written out step by step, the biased attention against
a direct softmax with multiplicative weights, the bias reaching every video self-attention of every forward, the mask
video fitted and averaged onto the reference's latent grid, compiled modes falling back, and the refusals."""
from __future__ import annotations

import pytest
import torch

from guide_helpers import randn, stand_in_model
from nodes.comfy.reference_video import LTX25ReferenceVideoGuide
from nodes.comfy.sampling import LTX25DistilledSampler
from nodes.ltx.dit import accelerated_denoise as A
from nodes.ltx.dit.attention import FusedQKAttnProcessor  # what the loader installs
from nodes.ltx.dit import guides as G
from nodes.ltx.dit import reference_attention as R
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.lora import ReferenceScales

# the reference-video tests' clip (17 frames at 24 fps, 64×64 px: 12 clip tokens), conditioning and stage-1 run
from test_reference_video import AUDIO, FPS, NODE, SIGMAS, VIDEO, _cond, run


def ltx_core_matrix(noisy: int, pieces) -> torch.Tensor | None:
    """ltx-core's `update_attention_mask` / `build_attention_mask` (conditioning/mask_utils.py), step by step: each
    appended piece with weights, or any piece once a matrix exists, grows the [0, 1] matrix — the old one kept
    top-left, the new piece 1 with itself, its weights (1 without) with the clip's tokens, 0 with earlier pieces."""
    matrix, total = None, noisy
    for count, weights in pieces:
        if weights is None and matrix is None:
            total += count
            continue
        cross = torch.ones(count) if weights is None else weights
        grown = torch.zeros(total + count, total + count)
        grown[:total, :total] = 1.0 if matrix is None else matrix
        grown[total:, total:] = 1.0
        grown[:noisy, total:] = cross[None, :]
        grown[total:, :noisy] = cross[:, None]
        matrix, total = grown, total + count
    return matrix


def ltx_core_bias(matrix: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ltx-core's `_prepare_self_attention_mask`: log of the weights, the dtype's lowest value where they are 0."""
    low = torch.finfo(dtype).min
    return torch.where(matrix > 0, matrix.clamp(min=1e-30).log(), torch.full_like(matrix, low)).to(dtype)


# ---------------------------------------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_follows_ltx_cores_block_formula_for_guides_and_references(dtype):
    """Clip of 4 tokens, then an appended guide frame (2, unweighted), a reference at strength 1 (1), a weighted
    reference (3: weights 0, 0.5, 1) and one more reference at strength 1 (2): the two pieces before the weighted one
    keep full attention among themselves and with the clip; the weighted one sees the clip through its weights and
    no earlier piece; the last one sees the clip fully and no earlier piece. Compared with ltx-core's incremental
    formula (test helper), in float32 and bf16; rows stored aligned. Fails if the block rules change (e.g. earlier
    pieces left visible to the weighted one, or weights put on rows only)."""
    pieces = ((2, None), (1, None), (3, torch.tensor([0.0, 0.5, 1.0])), (2, None))
    got = R.AttentionLayout(4, pieces).bias(dtype, torch.device("cpu"))
    want = ltx_core_bias(ltx_core_matrix(4, pieces), dtype)
    assert got.shape == (12, 12) and got.dtype == dtype
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    assert got.stride(0) % R.ROW_ALIGNMENT == 0 and got.stride(1) == 1


def test_strength_one_without_a_mask_makes_no_matrix_and_runs_todays_forward(transformer):
    """At attention strength 1 without a mask the stage carries no attention layout, every video self-attention runs
    diffusers' own processor (nothing installed), and the sample is bit for bit the run of a reference guide built
    without the new fields. At 0.5 the layout exists and the wrapped processor runs. Fails if a matrix of ones is
    made at strength 1 (the attention would take the masked kernel path)."""
    reference = randn((1, 128, 2, 1, 1), 3)
    plain = G.Guides(reference=(G.ReferenceGuide(reference, 1.0, 2, 2),))
    explicit = G.Guides(reference=(G.ReferenceGuide(reference, 1.0, 2, 2, attention_strength=1.0),))
    assert G.resolve(explicit, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS).attention is None
    seen = []
    hooks = [b.attn1.register_forward_pre_hook(lambda m, a: seen.append(type(m.processor)))
             for b in transformer.dit.transformer_blocks]
    try:
        a, b = run(transformer, plain), run(transformer, explicit)
        assert seen and set(seen) == {FusedQKAttnProcessor}, set(seen)
        seen.clear()
        run(transformer, G.Guides(reference=(G.ReferenceGuide(reference, 1.0, 2, 2, attention_strength=0.5),)))
        assert seen and set(seen) == {R._BiasedSelfAttention}, set(seen)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(type(b.attn1.processor) is FusedQKAttnProcessor for b in transformer.dit.transformer_blocks)


# ---------------------------------------------------------------------------------------------------- the attention
def _direct_attention(attn, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The gated self-attention of one LTX-2 attention module written out, with multiplicative weights `[T, T]` on
    the softmax numerator: p[q, k] ∝ weights[q, k] · exp(q·k / √d) (ltx-core's log-bias, read backwards)."""
    heads = attn.heads
    split = lambda t: t.unflatten(2, (heads, -1)).transpose(1, 2)  # noqa: E731
    q, k, v = split(attn.norm_q(attn.to_q(x))), split(attn.norm_k(attn.to_k(x))), split(attn.to_v(x))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    p = weights * torch.exp(scores - scores.amax(-1, keepdim=True))
    out = (p / p.sum(-1, keepdim=True)) @ v                                # [B, H, T, D]
    out = out.transpose(1, 2) * (2 * torch.sigmoid(attn.to_gate_logits(x)))[..., None]
    return attn.to_out[0](out.flatten(2))


def _biased(transformer, x: torch.Tensor, layout: R.AttentionLayout) -> torch.Tensor:
    blocks = transformer.dit.transformer_blocks
    with torch.no_grad(), R.biased_video_self_attention(blocks, layout.bias(x.dtype, x.device)):
        return blocks[0].attn1(hidden_states=x)


def test_biased_attention_is_a_softmax_with_the_weights_multiplied_in(transformer):
    """Block 0's video self-attention on 3 clips of 4 clip tokens + 2 guide tokens + 3 reference tokens (weights 0.2,
    0.5, 1): equal to the attention computed directly with ltx-core's weight matrix multiplied into the softmax, for
    every clip of the batch (the bias is broadcast over clips and heads; 3 clips, not the tiny model's 2 heads, so a
    broadcast over heads only cannot pass by coincidence). Fails if the bias is the linear `(1 − w)·−10000` of
    diffusers' own video mask, or lands on the wrong rows or columns."""
    attn = transformer.dit.transformer_blocks[0].attn1
    x = randn((3, 9, attn.query_dim), 11)
    pieces = ((2, None), (3, torch.tensor([0.2, 0.5, 1.0])))
    got = _biased(transformer, x, R.AttentionLayout(4, pieces))
    with torch.no_grad():
        want = _direct_attention(attn, x, ltx_core_matrix(4, pieces))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max()), (got - want).abs().max()


def test_strength_zero_cuts_the_clip_and_the_reference_apart_both_ways(transformer):
    """Weights 0 (strength 0 times any mask): the clip's and the guide's rows are the attention over the clip and the
    guide alone, the reference's rows the attention over the reference alone — nothing crosses in either direction,
    and the reference does not see the guide appended before it. Fails if only one direction is masked."""
    attn = transformer.dit.transformer_blocks[0].attn1
    x = randn((1, 9, attn.query_dim), 12)
    got = _biased(transformer, x, R.AttentionLayout(4, ((2, None), (3, torch.zeros(3)))))
    with torch.no_grad():
        head, tail = attn(hidden_states=x[:, :6]), attn(hidden_states=x[:, 6:])
    want = torch.cat([head, tail], dim=1)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max()), (got - want).abs().max()


def test_every_forward_gets_the_stages_bias_in_every_block(transformer, monkeypatch):
    """Sampling a clip (12 tokens) with an appended last-frame guide (4) and a half-size reference (3) at attention
    strength 0.5 times a mask: every video self-attention of every step (2 blocks × 2 steps) gets ltx-core's bias for
    that layout — the node's order (guides, then references) and token counts carried through `resolve` — and every
    other attention (audio self, text, audio↔video) none."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kw):
        calls.append((query.shape[-2], key.shape[-2], attn_mask))
        return sdpa(query, key, value, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    mask = torch.tensor([0.0, 1.0, 0.5])[:, None, None]  # [f, h, w] for the 3 × 1 × 1 reference
    guides = G.Guides(video=(G.VideoGuide(randn((1, 128, 1, 2, 2), 1), -1),),
                      reference=(G.ReferenceGuide(randn((1, 128, 3, 1, 1), 3), 1.0, 2, 1, 0.5, mask),))
    run(transformer, guides)
    want = ltx_core_bias(ltx_core_matrix(12, ((4, None), (3, torch.tensor([0.0, 0.5, 0.25])))), torch.float32)
    video_self = [m for q, k, m in calls if q == k == 19]
    assert len(video_self) == 2 * (len(SIGMAS) - 1)
    for got in video_self:
        assert isinstance(got, torch.Tensor) and got.shape[-2:] == (19, 19), got
        assert torch.equal(got[0, 0], want) and torch.equal(got[-1, -1], want)
    assert all(m is None for q, k, m in calls if not q == k == 19), [(q, k) for q, k, m in calls if m is not None]


def test_compiled_modes_run_a_biased_stage_with_eager_blocks(transformer):
    """'compile' with a biased stage: the denoiser says it falls back and runs the blocks eagerly (never compiling
    them), with the same x0 as the eager denoiser. Fails if the blocks are compiled with the per-forward processor."""
    guides = G.Guides(reference=(G.ReferenceGuide(randn((1, 128, 2, 1, 1), 3), 1.0, 2, 2, 0.25),))
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    held = G.resolve(guides, video, audio, FPS)
    lines = []
    compiled = A.make_denoiser(transformer, _cond(), FPS, "compile", held, lines.append)
    got = compiled(held.extend(video), audio, 0.6)
    assert not A._compiled_before(transformer) and any("compile → eager" in line for line in lines), lines
    want = A.make_denoiser(transformer, _cond(), FPS, "eager", held)(held.extend(video), audio, 0.6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---------------------------------------------------------------------------------------------------- the mask video
def _cells(mask: torch.Tensor, rows: slice, columns: tuple[slice, ...]) -> torch.Tensor:
    """[frames, cells]: each cell's mean over `rows` × its columns, per frame."""
    return torch.stack([mask[:, rows, c].mean(dim=(1, 2)) for c in columns], dim=1)


@pytest.mark.parametrize("latent_frames, group", [(3, 8), (2, 16)])  # IC-LoRA temporal 1, and 2 (thinned to 9)
def test_mask_video_is_averaged_onto_the_reference_cells_and_grouped_in_time(latent_frames, group):
    """A 25-frame mask of 64 × 160 px for a 17-frame 64 × 128 stage and a reference of 1 × 2 cells (spatial 2): its
    first 17 frames, the centre 128 columns (cover and crop), each cell the mean of its 64 × 64 px, latent frame 0
    from pixel frame 0 and each later one the mean of the next 8 (16 for an IC-LoRA at temporal 2) frames, as
    ltx-pipelines' `downsample_mask_video_to_latent` does. Fails if the crop, the area mean or the causal grouping
    (e.g. frame 0 averaged in) is dropped."""
    mask = torch.rand(25, 64, 160, generator=torch.Generator().manual_seed(2))
    got = R.mask_video_tokens(mask, (64, 128), (latent_frames, 1, 2), 17, "test")
    per_frame = _cells(mask, slice(0, 64), (slice(16, 80), slice(80, 144)))  # [25, 2]
    want = torch.cat([per_frame[:1], per_frame[1:17].unflatten(0, (-1, group)).mean(dim=1)])
    assert got.shape == (latent_frames * 2,)
    assert torch.allclose(got, want.flatten(), atol=1e-6), (got - want.flatten()).abs().max()


def test_mask_video_of_twice_the_size_and_a_single_frame():
    """A one-frame 128 × 256 mask for a 64 × 128 stage: the bilinear halving averages 2 × 2 pixels, so each 1 × 2
    reference cell is the mean of its 128 × 128 source pixels; one frame holds for all 3 latent frames."""
    mask = torch.rand(1, 128, 256, generator=torch.Generator().manual_seed(3))
    got = R.mask_video_tokens(mask, (64, 128), (3, 1, 2), 17, "test")
    want = _cells(mask, slice(0, 128), (slice(0, 128), slice(128, 256)))[0].repeat(3)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


# ---------------------------------------------------------------------------------------------------- the node
@pytest.fixture
def fake(monkeypatch):
    return stand_in_model(monkeypatch, ReferenceScales(2, 1), ("ic.safetensors",))


class _Encoder:
    """Stands in for the video encoder handle: the reference's latent for any fitted frames."""

    def __call__(self, frames):
        return randn((1, 128, (frames.shape[0] - 1) // 8 + 1, frames.shape[1] // 32, frames.shape[2] // 32), 4)


@pytest.fixture
def no_encode(monkeypatch):
    from nodes.comfy import reference_video
    monkeypatch.setattr(reference_video, "encode_frames", lambda encoder, frames, where: _Encoder()(frames))


def _frames(count, height=64, width=64):
    return torch.rand(count, height, width, 3, generator=torch.Generator().manual_seed(0))


def _sample(fake, guides):
    return LTX25DistilledSampler().sample(fake, None, {"samples": torch.zeros(VIDEO), "frame_rate": FPS},
                                          {"samples": torch.zeros(AUDIO), "type": "audio"}, 1, "1", "auto",
                                          guides=guides)


def test_node_hands_the_stage_the_mask_times_the_strength(fake, no_encode):
    """The node's mask (17 frames at the video's 64 × 64) and attention strength 0.5 reach the resolved stage as
    weights 0.5 × the mask's per-token means (reference 3 × 1 × 1 at spatial 2)."""
    mask = torch.rand(17, 64, 64, generator=torch.Generator().manual_seed(5))
    guides, _ = LTX25ReferenceVideoGuide().guide(fake, _frames(17), None, 1.0, attention_strength=0.5,
                                                 attention_mask=mask)
    held = G.resolve(guides, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    (count, weights), = held.attention.pieces
    means = torch.stack([mask[0].mean(), mask[1:9].mean(), mask[9:17].mean()])
    assert held.attention.noisy == 12 and count == 3
    assert torch.allclose(weights, 0.5 * means, atol=1e-6), (weights - 0.5 * means).abs().max()


@pytest.mark.parametrize("kwargs, where", [
    ({"attention_strength": 1.5}, f"{NODE}.attention_strength"),
    ({"attention_mask": torch.rand(17, 64, 64, 3)}, f"{NODE}.attention_mask"),         # an IMAGE, not a MASK
    ({"attention_mask": torch.full((17, 64, 64), 2.0)}, f"{NODE}.attention_mask"),    # outside [0, 1]
    ({"attention_mask": torch.rand(12, 64, 64)}, f"{NODE}.attention_mask"),           # 12 frames: not 1 + 2k
    ({"attention_mask": torch.rand(5, 64, 64)}, f"{NODE}.attention_mask"),            # 1 + 2k, but not 17
    ({"attention_mask": torch.rand(17, 64, 96)}, f"{NODE}.attention_mask"),           # a 3:2 mask, square clip
])
def test_bad_attention_inputs_are_named_by_node_and_field(fake, no_encode, kwargs, where):
    """A strength outside [0, 1], an IMAGE where a MASK goes, mask values outside [0, 1], a mask of neither one frame
    nor the clip's count (5 frames would split into the reference's latent frames, and be stretched over the clip),
    a mask of another aspect: an LTX25Error naming the field (the last three when the sampler's stage asks for the
    weights)."""
    with pytest.raises(LTX25Error) as info:
        _sample(fake, LTX25ReferenceVideoGuide().guide(fake, _frames(17), None, 1.0, **kwargs)[0])
    assert info.value.where == where, info.value


@pytest.mark.parametrize("reference", [
    G.ReferenceGuide(randn((1, 128, 3, 1, 1), 1), 1.0, 2, 1, attention_strength=-0.1),
    G.ReferenceGuide(randn((1, 128, 3, 1, 1), 1), 1.0, 2, 1, attention_mask=torch.ones(4)),  # 3 tokens
    G.ReferenceGuide(randn((1, 128, 3, 1, 1), 1), 1.0, 2, 1, attention_mask=torch.full((3,), float("nan"))),
])
def test_bad_engine_attention_inputs_are_refused_at_resolve(reference):
    """The engine's own checks, for callers without the node: a strength outside [0, 1], a per-token mask of the
    wrong length or with NaN."""
    with pytest.raises(LTX25Error) as info:
        G.resolve(G.Guides(reference=(reference,)), torch.zeros(VIDEO), torch.zeros(AUDIO), FPS, "sampler.guides")
    assert info.value.where == "sampler.guides" and "attention" in info.value.what, info.value
