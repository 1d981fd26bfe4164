"""Multimodal guidance (nodes/ltx/dit/guidance.py, perturbation.py): the reference's combination formula by hand,
neutral scales = the unguided denoiser bit for bit, the passes each scale asks for, STG and modality isolation
against diffusers' own STG / isolate_modalities forward, batched passes = sequential ones, the CUDA-graph path's
static buffers, and the refusals."""
from __future__ import annotations

import copy

import pytest
import torch
from diffusers.models.transformers.transformer_ltx2 import LTX2PerturbedAttnProcessor

from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import accelerated_denoise as A
from nodes.ltx.dit import guidance as G
from nodes.ltx.dit import transformer as T
from nodes.ltx.dit.perturbation import (AUDIO_SELF, NONE, VIDEO_SELF, Perturbation, build_masks, keep_masks,
                                        perturbed)
from nodes.ltx.dit.positions import patchify_audio, patchify_video, unpatchify_audio, unpatchify_video
from nodes.ltx.errors import LTX25Error
from nodes.tools.tiny.common import TINY_DIMS

SIGMA, FPS = 0.7, 24.0


def _latents(batch: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 128, 2, 2, 3, generator=g), torch.randn(batch, 8, 7, 16, generator=g)


def _cond(seed: int, batch: int = 1) -> Conditioning:
    g = torch.Generator().manual_seed(50 + seed)
    return Conditioning(torch.randn(batch, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(batch, 1024, TINY_DIMS["audio_inner"], generator=g))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


# ---------------------------------------------------------------------------------------------------- the formula
def test_combine_is_the_reference_formula_by_hand():
    """pred = cond + (cfg−1)(cond−uncond) + stg(cond−perturbed) + (mod−1)(cond−isolated), then with rescale r:
    pred·(r·std(cond)/std(pred) + 1 − r), std unbiased over the whole tensor — worked out on four numbers."""
    cond, uncond = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.0, 1.0, 1.0, 2.0])
    ptb, iso = torch.tensor([1.0, 1.0, 3.0, 3.0]), torch.tensor([2.0, 2.0, 2.0, 2.0])
    params = G.ModalityGuidance(cfg=3.0, stg=1.0, modality=2.0)
    # cond + 2·(1,1,2,2) + (0,1,0,1) + (−1,0,1,2)
    want = torch.tensor([1 + 2 + 0 - 1, 2 + 2 + 1 + 0, 3 + 4 + 0 + 1, 4 + 4 + 1 + 2], dtype=torch.float32)
    assert torch.equal(G.combine(params, cond, uncond, ptb, iso), want)
    rescaled = G.combine(G.ModalityGuidance(cfg=3.0, stg=1.0, modality=2.0, rescale=0.7), cond, uncond, ptb, iso)
    std_cond, std_pred = (5 / 3) ** 0.5, 15 ** 0.5  # sample std of (1, 2, 3, 4) and of (2, 5, 8, 11)
    factor = 0.7 * std_cond / std_pred + 0.3
    assert torch.allclose(rescaled, want * factor, rtol=1e-6), (rescaled, want * factor)


def test_neutral_scales_leave_cond_untouched_exactly():
    """cfg 1, stg 0, modality 1, rescale 0: the combination returns cond's bits whatever the other passes hold."""
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(2, 128, 3, 4, 4, generator=g)
    out = G.combine(G.ModalityGuidance(), cond, torch.randn(cond.shape, generator=g), 0.0, 0.0)
    assert torch.equal(out, cond)


def test_neutral_guidance_is_the_unguided_denoiser_bit_for_bit(transformer):
    """A guider with every scale neutral runs one forward per step: exactly `transformer.denoise`."""
    video, audio = _latents()
    got = G.make_guided_denoiser(transformer, G.Guidance(_cond(0), _cond(1)), FPS)(video, audio, SIGMA)
    want = T.denoise(transformer, video, audio, SIGMA, _cond(0), FPS)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# ---------------------------------------------------------------------------------------------------- the passes
def test_each_scale_asks_for_the_reference_passes():
    """uncond only for cfg ≠ 1, one perturbed pass holding each STG modality's own blocks, isolated (a2v and v2a
    off in every block) for modality ≠ 1; a pass one modality needs runs for both."""
    cond = _cond(0)
    assert [p.name for p in G.Guidance(cond).passes()] == ["cond"]
    cfg_audio = G.Guidance(cond, cond, audio=G.ModalityGuidance(cfg=7.0))
    assert [(p.name, p.negative) for p in cfg_audio.passes()] == [("cond", False), ("uncond", True)]
    video_stg = G.Guidance(cond, video=G.ModalityGuidance(stg=1.0, stg_blocks=(1,)))
    ptb = video_stg.passes()[1].perturbation
    assert ptb.skipped(VIDEO_SELF, 1) and not ptb.skipped(VIDEO_SELF, 0) and not ptb.skipped(AUDIO_SELF, 1)
    both = G.Guidance(cond, video=G.ModalityGuidance(stg=1.0, stg_blocks=(1,)),
                      audio=G.ModalityGuidance(stg=0.5, stg_blocks=(0,)))
    ptb = both.passes()[1].perturbation
    assert ptb.skipped(VIDEO_SELF, 1) and ptb.skipped(AUDIO_SELF, 0) and not ptb.skipped(AUDIO_SELF, 1)
    full = G.Guidance(cond, cond, G.DEV_VIDEO, G.DEV_AUDIO)
    assert [p.name for p in full.passes()] == ["cond", "uncond", "perturbed", "isolated"]
    assert keep_masks([full.passes()[3].perturbation], 3).keys() == {
        (kind, b) for kind in ("a2v_cross_attn", "v2a_cross_attn") for b in range(3)}


def test_perturbation_processors_wrap_only_the_named_modules_and_are_removed(transformer):
    """Inside `perturbed`, only block 1's video self-attention is wrapped (not block 0's, not the audio one); the
    modules' own processors are back afterwards, also when the forward raised."""
    blocks = transformer.dit.transformer_blocks
    originals = {(i, name): getattr(b, name).processor for i, b in enumerate(blocks)
                 for name in ("attn1", "audio_attn1", "audio_to_video_attn", "video_to_audio_attn")}
    with pytest.raises(RuntimeError, match="boom"):
        masks = build_masks([Perturbation(((VIDEO_SELF, frozenset({1})),))], len(blocks), torch.device("cpu"))
        with perturbed(blocks, masks):
            changed = {k for k, p in originals.items() if getattr(blocks[k[0]], k[1]).processor is not p}
            raise RuntimeError("boom")
    assert changed == {(1, "attn1")}
    assert all(getattr(blocks[i], name).processor is p for (i, name), p in originals.items())


def _dit_x0(model, video, audio, cond, **perturbation) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 from diffusers' own forward with its STG / isolate_modalities arguments (the same inputs as
    `transformer.velocity`), as an independent implementation of the perturbed and isolated passes."""
    b, _, f, h, w = video.shape
    grid = model.grid(b, f, h, w, audio.shape[2], FPS, torch.device("cpu"))
    t = torch.full((b, 1), SIGMA * model.config.timestep_scale_multiplier)
    v, a = model.dit(hidden_states=patchify_video(video), audio_hidden_states=patchify_audio(audio),
                     encoder_hidden_states=cond.video, audio_encoder_hidden_states=cond.audio, timestep=t,
                     audio_timestep=t, sigma=t[:, 0], audio_sigma=t[:, 0], video_coords=grid.video_coords,
                     audio_coords=grid.audio_coords, video_keyframes_mask=grid.keyframes, use_cross_timestep=True,
                     return_dict=False, **perturbation)
    return (video - unpatchify_video(v, video.shape) * SIGMA, audio - unpatchify_audio(a, audio.shape) * SIGMA)


@pytest.fixture
def diffusers_stg(transformer):
    """A copy of the tiny model set up for diffusers' built-in STG (perturbed processors in every block)."""
    model = copy.deepcopy(transformer)
    for block in model.dit.transformer_blocks:
        block.perturbed_attn = True
        block.attn1.set_processor(LTX2PerturbedAttnProcessor())
        block.audio_attn1.set_processor(LTX2PerturbedAttnProcessor())
    return model


def test_guided_x0_equals_the_formula_over_diffusers_perturbed_and_isolated_forwards(transformer, diffusers_stg):
    """Full dev-style guidance with STG on block 1 for both modalities: the guided x0 equals the reference formula
    applied to cond, uncond (negative prompt), diffusers' STG forward (spatio_temporal_guidance_blocks=[1]: block
    1's video and audio self-attention pass their values through) and diffusers' isolate_modalities forward.
    Fails if another block is perturbed, if the a2v/v2a skip misses a block, or if a scale is misapplied."""
    video, audio = _latents()
    positive, negative = _cond(0), _cond(1)
    video_params = G.ModalityGuidance(cfg=3.0, stg=1.0, stg_blocks=(1,), rescale=0.7, modality=3.0)
    audio_params = G.ModalityGuidance(cfg=7.0, stg=1.0, stg_blocks=(1,), rescale=0.7, modality=2.0)
    guidance = G.Guidance(positive, negative, video_params, audio_params)
    got = G.make_guided_denoiser(transformer, guidance, FPS)(video, audio, SIGMA)
    cond = T.denoise(transformer, video, audio, SIGMA, positive, FPS)
    uncond = T.denoise(transformer, video, audio, SIGMA, negative, FPS)
    with torch.inference_mode():
        ptb = _dit_x0(diffusers_stg, video, audio, positive, spatio_temporal_guidance_blocks=[1])
        iso = _dit_x0(transformer, video, audio, positive, isolate_modalities=True)
    assert _rel(ptb[0], cond[0]) > 1e-4 and _rel(iso[1], cond[1]) > 1e-4, "the perturbations changed nothing"
    for stream, params in ((0, video_params), (1, audio_params)):
        want = G.combine(params, cond[stream], uncond[stream], ptb[stream], iso[stream])
        assert _rel(got[stream], want) < 1e-5, f"stream {stream}: {_rel(got[stream], want):.2e}"


def test_batched_passes_equal_sequential_ones_for_a_batch_of_clips(transformer):
    """All passes as one forward of passes × clips rows give the sequential passes' x0 (summation order aside),
    with two clips and one prompt serving both."""
    video, audio = _latents(batch=2, seed=3)
    guidance = G.Guidance(_cond(0), _cond(1), G.ModalityGuidance(cfg=3.0, stg=1.0, stg_blocks=(0,), modality=3.0),
                          G.ModalityGuidance(cfg=7.0, rescale=0.7, modality=3.0))
    sequential = G.make_guided_denoiser(transformer, guidance, FPS, batching="sequential")(video, audio, SIGMA)
    batched = G.make_guided_denoiser(transformer, guidance, FPS, batching="batched")(video, audio, SIGMA)
    for got, want in zip(batched, sequential):
        assert _rel(got, want) < 1e-5, f"{_rel(got, want):.2e}"


def test_the_graph_path_replays_with_new_inputs_and_shares_a_graph_between_cond_and_uncond(transformer,
                                                                                           monkeypatch):
    """With the capture replaced by a plain call (no CUDA here), the CUDA-graph forward gives the eager x0 for new
    latents, σ and prompts on cached shapes; sequential cond and uncond (same shapes, no perturbation) share one
    graph, the perturbed and isolated passes get one each. Fails if a static buffer is not refreshed (the graph
    would keep answering the first latent, σ or prompt)."""
    def guidance(seed):
        return G.Guidance(_cond(seed), _cond(seed + 1), G.ModalityGuidance(cfg=3.0, stg=1.0, stg_blocks=(1,),
                                                                           modality=2.0), G.ModalityGuidance(cfg=7.0))
    runs = [(guidance(0), _latents(seed=0), 0.9), (guidance(0), _latents(seed=1), 0.4),
            (guidance(5), _latents(seed=1), 0.4)]
    wants = [G.make_guided_denoiser(transformer, g, FPS, "eager")(*lat, sigma) for g, lat, sigma in runs]
    captures = []
    monkeypatch.setattr(A, "_record", lambda forward, cache, device: captures.append(1) or forward)
    monkeypatch.setattr(G, "_eager_forward", G._graph_forward)  # the graph path, on the CPU
    A.release(transformer)
    for (g, (video, audio), sigma), want in zip(runs, wants):
        got = G.make_guided_denoiser(transformer, g, FPS, "eager")(video, audio, sigma)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"σ={sigma}"
    assert len(captures) == 3, f"{len(captures)} captures for cond/uncond, perturbed and isolated"
    A.release(transformer)


# ---------------------------------------------------------------------------------------------------- refusals
def test_guided_passes_run_the_plain_blocks_after_a_compiled_stage(transformer, monkeypatch):
    """Guided sampling offers no compile: after a compiled stage of the same model (a distilled stage with
    compile_cuda_graph earlier in the process) its passes must run the plain blocks, not the compiled ones left on
    (a processor installed per forward, as STG's or a reference's attention bias, would make those trace again)."""
    monkeypatch.setattr(A, "COMPILE_OPTIONS", {**A.COMPILE_OPTIONS, "backend": "eager"})
    video, audio = _latents()
    blocks = transformer.dit.transformer_blocks
    try:
        A.make_denoiser(transformer, _cond(0), FPS, "compile")(video, audio, SIGMA)
        assert all(b._compiled_call_impl is not None for b in blocks)
        guidance = G.Guidance(_cond(0), _cond(1), G.ModalityGuidance(cfg=3.0), G.ModalityGuidance(cfg=3.0))
        G.make_guided_denoiser(transformer, guidance, FPS, "eager")(video, audio, SIGMA)
        assert all(b._compiled_call_impl is None for b in blocks), "the guided passes ran the compiled blocks"
    finally:
        A._set_compiled(transformer, False)
        torch._dynamo.reset()


def test_cfg_without_a_negative_prompt_is_refused(transformer):
    with pytest.raises(LTX25Error, match="negative") as info:
        G.make_guided_denoiser(transformer, G.Guidance(_cond(0), None, G.ModalityGuidance(cfg=3.0)), FPS)
    assert "Connector" in str(info.value)


def test_stg_blocks_outside_the_model_are_refused(transformer):
    guidance = G.Guidance(_cond(0), video=G.ModalityGuidance(stg=1.0, stg_blocks=(28,)))
    with pytest.raises(LTX25Error, match="28") as info:
        G.make_guided_denoiser(transformer, guidance, FPS)
    assert info.value.where == "guider.video_stg_blocks"


def test_compile_modes_and_unknown_batching_are_refused(transformer):
    guidance = G.Guidance(_cond(0), _cond(1), G.ModalityGuidance(cfg=3.0))
    with pytest.raises(LTX25Error, match="cuda_graph"):
        G.make_guided_denoiser(transformer, guidance, FPS, "compile_cuda_graph")
    with pytest.raises(LTX25Error, match="batched"):
        G.make_guided_denoiser(transformer, guidance, FPS, batching="parallel")


def test_block_lists_parse():
    assert G.parse_blocks("28", "x") == (28,) and G.parse_blocks(" 27, 28 ", "x") == (27, 28)
    assert G.parse_blocks("all", "x") is None and G.parse_blocks("", "x") == ()
    with pytest.raises(LTX25Error, match="block numbers"):
        G.parse_blocks("twenty", "x")


def test_the_none_perturbation_skips_nothing():
    assert not keep_masks([NONE, NONE], 48)
