"""Conditioning on given latents (nodes/ltx/dit/guides.py, extend.py; docs/MODEL.md §16): the frame → latent mapping,
conditioned tokens held with timestep 0 through every step of both stages (a spy on the DiT's inputs), strength 0 =
unconditioned, appended guides cropped, audio held bit for bit, the AV modulation from each stream's own timesteps,
keyframe positions, extend's held overlap and join, the graph path's inputs, the guided sampler, and the refusals.
Random latents stand in for encoded images and audio; the tiny transformer runs in float32 on the CPU."""
from __future__ import annotations

import pytest
import torch

from guide_helpers import dit_inputs, randn, stand_in_model
from nodes.comfy.sampling import LTX25DistilledSampler
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import accelerated_denoise as A
from nodes.ltx.dit import dev_sampling, extend, guidance, sampling
from nodes.ltx.dit import guides as G
from nodes.ltx.dit import transformer as T
from nodes.ltx.dit.positions import (audio_position_bounds, patchify_audio, patchify_video, unpatchify_video,
                                     video_position_bounds)
from nodes.ltx.errors import LTX25Error
from nodes.ltx.latents import check_latent_pair
from nodes.tools.tiny.common import TINY_DIMS

FPS = 24.0
VIDEO, AUDIO = (1, 128, 3, 2, 2), (1, 8, 18, 16)   # 17 frames at 24 fps; stage 2 doubles H' and W'
# Two stage-1 steps (the first ancestral step draws fresh noise) and the distilled stage-2 schedule: few forwards.
STAGE1_SIGMAS, STAGE2_SIGMAS = (1.0, 0.6, 0.0), sampling.STAGE2_SIGMAS


def _cond() -> Conditioning:
    g = torch.Generator().manual_seed(7)
    return Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g))


def image(seed):
    """A provider: a one-frame 'encoded image' made for whatever grid the stage asks for (as an encoder would)."""
    def make(grid: G.StageGrid) -> torch.Tensor:
        return randn((1, 128, 1, grid.height, grid.width), seed * 1000 + grid.height)
    return make


@pytest.fixture
def spy(transformer):
    with dit_inputs(transformer) as calls:
        yield calls


def run(model, video, audio, guides, stage, sigmas, sampler="auto", seed=5, **kw):
    return sampling.sample_distilled(model, _cond(), video, audio, fps=FPS, seed=seed, stage=stage, sampler=sampler,
                                     sigmas=sigmas, acceleration="eager", guides=guides, **kw)


# ---------------------------------------------------------------------------------------------------- mapping
def test_frame_to_latent_index_has_the_causal_first_frame_and_reaches_the_last_frame():
    """Pixel 0 ↔ latent 0, pixels 8k−7 … 8k ↔ latent k (the causal VAE's first latent holds one frame): a `frame//8`
    or `(frame−1)//8` mapping breaks frames 1, 8 or 9. Resolved on a 17-frame clip, a replace guide at −1 lands in
    latent 2 and one at frame 1 in latent 1."""
    assert [G.latent_index(f) for f in (0, 1, 7, 8, 9, 16, 17, 120)] == [0, 1, 1, 1, 2, 2, 3, 15]
    assert [G.latent_span(k) for k in (0, 1, 2, 15)] == [(0, 0), (1, 8), (9, 16), (113, 120)]
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    for frame, index in ((-1, 2), (16, 2), (1, 1), (8, 1), (9, 2), (0, 0)):
        latent = randn((1, 128, 1, 2, 2), 1)
        held = G.resolve(G.Guides((G.VideoGuide(latent, frame, 1.0, "replace"),)), video, audio, FPS)
        assert torch.equal(held.video_clean[:, :, index], latent[:, :, 0]), (frame, index)
        assert held.video_mask[0, 0, :, 0, 0].tolist() == [0.0 if k == index else 1.0 for k in range(3)], frame


# ---------------------------------------------------------------------------------------------------- both stages
def test_conditioned_tokens_keep_their_values_and_timestep_zero_in_every_step_of_both_stages(transformer, spy):
    """i2v at frame 0 (replaced) and a last-frame keyframe (appended) at strength 1, plus a frame-1 guide at 0.6,
    through an ancestral stage 1 and an Euler stage 2 (guides made again at stage 2's size by their providers):
    at every forward the held tokens enter the DiT with exactly the guide's values and timestep 0, the 0.6 guide's
    with σ·0.4, every other token with σ; the outputs hold the frame-0 guide bit for bit, have the unconditioned
    shapes, and never contain the appended frame. Fails if the post-step blend, the noising pull-back, the per-token
    timesteps, the ancestral re-blend or the crop goes."""
    grids = []

    def first(grid):
        grids.append(tuple(grid[:4]))
        return image(1)(grid)
    guides = G.Guides((G.VideoGuide(first, 0), G.VideoGuide(image(2), -1), G.VideoGuide(image(3), 1, 0.6, "replace")))
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    for stage, sigmas in ((1, STAGE1_SIGMAS), (2, STAGE2_SIGMAS)):
        spy.clear()
        out_video, out_audio = run(transformer, video, audio, guides, stage, sigmas)
        b, _, f, h, w = video.shape
        n = h * w
        grid = G.StageGrid(b, f, h, w, audio.shape[2], FPS)
        frame0, last = patchify_video(image(1)(grid))[0], patchify_video(image(2)(grid))[0]
        assert len(spy) == len(sigmas) - 1
        for call, sigma in zip(spy, sigmas):
            t, tokens = call["timestep"][0] / 1000, call["hidden_states"][0]
            assert tokens.shape[0] == f * n + n, "the appended keyframe's tokens are not in the forward"
            assert torch.equal(tokens[:n], frame0) and torch.equal(tokens[f * n:], last), f"stage {stage} σ={sigma}"
            want = torch.full((f * n + n,), sigma)
            want[:n], want[f * n:], want[n:2 * n] = 0.0, 0.0, sigma * (1 - 0.6)
            assert torch.allclose(t, want, rtol=1e-6, atol=0), f"stage {stage} σ={sigma}: {t}"
            assert torch.allclose(call["sigma"], torch.tensor([sigma * 1000])), "the video stream is not frozen"
        assert out_video.shape == video.shape and out_audio.shape == audio.shape
        assert torch.equal(out_video[:, :, 0], image(1)(grid)[:, :, 0])
        assert not torch.equal(out_video[:, :, -1:], image(2)(grid))
        video = torch.nn.functional.interpolate(out_video, scale_factor=(1, 2, 2), mode="nearest")  # the upsampler
        audio = out_audio
    assert grids == [(1, 3, 2, 2), (1, 3, 4, 4)], grids


def test_strength_zero_is_the_unconditioned_stage_bit_for_bit(transformer):
    """A replace guide at strength 0 leaves the mask at 1: every token denoised as without guides, the same bits
    (ancestral stage 1). Fails if the mask is `strength` instead of `1 − strength`."""
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    plain = run(transformer, video, audio, None, 1, STAGE1_SIGMAS)
    zero = run(transformer, video, audio, G.Guides((G.VideoGuide(image(1), 0, 0.0),),
                                                   (G.AudioGuide(randn((1, 8, 5, 16), 2), 3, 0.0),)), 1,
               STAGE1_SIGMAS)
    assert all(torch.equal(a, b) for a, b in zip(plain, zero))


def test_appended_guides_are_cropped_from_outputs_and_previews(transformer):
    """Keyframes appended at frames 0 ('append'), 9 and the last: the DiT sees 3 more latent frames, the sampler's
    outputs and every live-preview x0 have the clip's shape. Fails if the crop is skipped."""
    previews = []
    guides = G.Guides(tuple(G.VideoGuide(image(s), frame, 1.0, "append") for s, frame in ((1, 0), (2, 9), (3, -1))))
    held = G.resolve(guides, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    assert held.appended == 3 and held.video_clean.shape[2] == 6
    out_video, out_audio = run(transformer, torch.zeros(VIDEO), torch.zeros(AUDIO), guides, 1, STAGE1_SIGMAS,
                               on_x0=lambda done, total, x0: previews.append(x0.shape))
    assert out_video.shape == VIDEO and out_audio.shape == AUDIO
    assert previews == [torch.Size(VIDEO)] * 2


def test_audio_to_video_holds_the_audio_bit_for_bit_with_its_sigma_at_zero(transformer, spy):
    """The whole audio latent held (a2v): stage 1 and stage 2 return exactly the given audio; every forward gets
    audio timesteps 0 and the audio stream's σ 0 (its prompt AdaLN and the video's AV gate), as the reference's
    frozen stream; the video still sees σ. Fails if the held audio is blended away or the stream is not frozen."""
    given = randn(AUDIO, 3)
    guides = G.Guides(audio=(G.AudioGuide(given),))
    video = torch.zeros(VIDEO)
    for stage, sigmas in ((1, STAGE1_SIGMAS), (2, (0.909375, 0.421875, 0.0))):
        spy.clear()
        video, audio = run(transformer, video, torch.zeros(AUDIO), guides, stage, sigmas)
        assert torch.equal(audio, given), f"stage {stage}: {(audio - given).abs().max()}"
        for call, sigma in zip(spy, sigmas):
            assert not call["audio_timestep"].any() and not call["audio_sigma"].any(), f"stage {stage} σ={sigma}"
            assert torch.allclose(call["sigma"], torch.tensor([sigma * 1000]))
        video = torch.nn.functional.interpolate(video, scale_factor=(1, 2, 2), mode="nearest")


def test_av_cross_attention_scale_shift_takes_own_timesteps_and_the_gate_the_other_streams_sigma(transformer):
    """ltx-core's AV cross-attention AdaLN: scale/shift from the stream's own per-token timesteps, the gate from the
    other stream's σ (diffusers' `use_cross_timestep` feeds one of the two to both). With i2v (frame 0 held) and
    frozen audio they differ: video scale/shift get 0 on frame 0 and σ elsewhere, the a2v gate the audio's σ (0),
    audio scale/shift 0, the v2a gate the video's σ. Fails if the scale/shift swap is removed."""
    seen = {}
    names = ("av_cross_attn_video_scale_shift", "av_cross_attn_video_a2v_gate", "av_cross_attn_audio_scale_shift",
             "av_cross_attn_audio_v2a_gate")
    handles = [getattr(transformer.dit, name).emb.register_forward_pre_hook(
        lambda m, args, name=name: seen.setdefault(name, args[0].clone())) for name in names]
    try:
        guides = G.Guides((G.VideoGuide(image(1), 0),), (G.AudioGuide(randn(AUDIO, 3)),))
        video, audio = torch.randn(VIDEO), torch.randn(AUDIO)
        held = G.resolve(guides, video, audio, FPS)
        T.denoise(transformer, video, audio, 0.5, _cond(), FPS, guided=held)
    finally:
        for handle in handles:
            handle.remove()
    want_video = torch.full((12,), 500.0)
    want_video[:4] = 0
    assert torch.equal(seen["av_cross_attn_video_scale_shift"], want_video), seen["av_cross_attn_video_scale_shift"]
    assert not seen["av_cross_attn_video_a2v_gate"].any()
    assert not seen["av_cross_attn_audio_scale_shift"].any()
    assert torch.equal(seen["av_cross_attn_audio_v2a_gate"], torch.tensor([500.0]))


@pytest.mark.parametrize("sampler", ["euler", "euler_ancestral"])
def test_the_loop_blends_every_x0_with_the_clean_values(sampler):
    """With a stand-in denoiser whose x0 is NOT the latent on held tokens: every step's latent is the step taken
    from the blended x0 (Euler, replayed by hand: `x0·mask + clean·(1 − mask)` for a guide at strength 1, one at
    0.25 and audio at 0.5), and the strength-1 frame enters every forward at its clean value (also after the
    ancestral re-noise). Fails if the x0 blend or the ancestral re-blend goes."""
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    guides = G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 0), G.VideoGuide(randn((1, 128, 1, 2, 2), 2), 1,
                                                                                     0.25, "replace")),
                      (G.AudioGuide(randn((1, 8, 6, 16), 3), 2, 0.5),))
    held = G.resolve(guides, video, audio, FPS)
    calls = []

    def denoise(v, a, sigma):
        calls.append((v.clone(), a.clone(), sigma))
        return torch.tanh(v) + 0.3, torch.sin(a) - 0.2
    sigmas = (1.0, 0.7, 0.4, 0.0)
    out = sampling.sample_stage(denoise, video, audio, sigmas, sampler, 3, 1, held=held)
    for v, _, sigma in calls:
        assert torch.equal(v[:, :, 0], held.video_clean[:, :, 0]), f"σ={sigma}"
    assert torch.equal(out[0][:, :, 0], held.video_clean[:, :, 0])
    if sampler == "euler":
        for (v, a, sigma), following in zip(calls, [*calls[1:], (*out, 0.0)]):
            x0_v, x0_a = held.hold(*denoise(v, a, sigma))
            nxt = sampling.euler_step(v, x0_v, sigma, following[2]), sampling.euler_step(a, x0_a, sigma, following[2])
            assert torch.equal(held.crop(nxt[0]), held.crop(following[0])) and torch.equal(nxt[1], following[1])


def test_x0_is_the_latent_minus_velocity_times_each_tokens_timestep(transformer):
    """The reference's X0Model per token: x0 = x − v·σ·mask, so a held token's x0 is its latent bit for bit and a
    token at strength 0.25 moves by 3/4 of σ. Fails if x0 uses σ for every token."""
    video, audio = randn(VIDEO, 1), randn(AUDIO, 2)
    guides = G.Guides((G.VideoGuide(image(1), 0), G.VideoGuide(image(2), 1, 0.25, "replace")))
    held = G.resolve(guides, video, audio, FPS)
    x0_video, x0_audio = T.denoise(transformer, video, audio, 0.5, _cond(), FPS, guided=held)
    assert torch.equal(x0_video[:, :, 0], video[:, :, 0])
    with torch.inference_mode():
        steps = held.timesteps(0.5)
        v, _ = T.velocity(transformer, patchify_video(video), patchify_audio(audio), steps,
                          transformer.context(_cond(), torch.device("cpu"), torch.float32), held.grid)
    want = video - unpatchify_video(v, video.shape) * held.video_mask * 0.5
    assert torch.allclose(x0_video, want, rtol=0, atol=1e-6), (x0_video - want).abs().max()
    assert not torch.allclose(x0_video[:, :, 1], (video - unpatchify_video(v, video.shape) * 0.5)[:, :, 1])


def test_hold_is_the_reference_post_process_blend():
    """x0·mask + clean·(1 − mask) per cell, for a cell at strength 1, one at 0.25 and a free one."""
    video, audio = torch.zeros(1, 128, 3, 1, 1), torch.zeros(1, 8, 4, 16)
    guides = G.Guides((G.VideoGuide(torch.full((1, 128, 1, 1, 1), 2.0), 0, 1.0),
                       G.VideoGuide(torch.full((1, 128, 1, 1, 1), 4.0), 1, 0.25, "replace")))
    held = G.resolve(guides, video, audio, FPS)
    x0 = torch.full((1, 128, 3, 1, 1), 10.0)
    blended, _ = held.hold(x0, torch.zeros(1, 8, 4, 16))
    assert blended[0, :, :, 0, 0].unique(dim=0).tolist() == [[2.0, 10 * 0.75 + 4 * 0.25, 10.0]]


# ---------------------------------------------------------------------------------------------------- positions
def test_guide_positions_and_keyframe_marks_follow_the_reference(transformer):
    """The clip's tokens keep their grid (the first latent frame marked, also when an image replaces it); a
    one-frame guide appended at frame f spans [f, f + 1) in seconds, [0, 1) at frame 0, with the clip's spatial
    cells, and is never marked. Fails if appended guides are marked or positioned as a latent frame of 8."""
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    guides = G.Guides((G.VideoGuide(image(1), 0), G.VideoGuide(image(2), 9), G.VideoGuide(image(3), 0, 1.0, "append")))
    held = G.resolve(guides, video, audio, FPS)
    coords, marks = held.grid.video_coords[0], held.grid.keyframes[0, :, 0]
    n, clip = 4, 12
    assert torch.equal(coords[:, :clip], video_position_bounds(1, 3, 2, 2, FPS)[0])
    assert marks.tolist() == [1.0] * n + [0.0] * (clip - n) + [0.0] * 2 * n
    for k, frame in ((0, 9), (1, 0)):
        time = coords[0, clip + k * n: clip + (k + 1) * n]
        assert torch.equal(time, torch.tensor([[frame / FPS, (frame + 1) / FPS]] * n)), time
        assert torch.equal(coords[1:, clip + k * n: clip + (k + 1) * n], coords[1:, :n])


# ---------------------------------------------------------------------------------------------------- extend
def test_extend_holds_the_overlap_bit_for_bit_and_joins_without_a_seam(transformer, spy):
    """A 17-frame clip extended by 16 frames over 2 held latent frames: the window's first 2 latent frames and its
    audio up to the source's end equal the source's bit for bit; its tokens sit at the joined clip's positions
    (no causal first frame, no keyframe mark); the joined latents are the source followed by the window's new
    frames, of a 33-frame clip's lengths. Fails if the offsets are dropped from the positions or the hold goes."""
    source_video, source_audio = randn(VIDEO, 11), randn(AUDIO, 12)
    plan = extend.plan_extension(VIDEO, AUDIO, FPS, new_frames=16, overlap=2)
    assert (plan.video_offset, plan.audio_offset, plan.window_frames, plan.window_audio) == (1, 1, 4, 33)
    guides = extend.extension_guides(source_video, source_audio, plan)
    window_video, window_audio = extend.window_latents(source_video, source_audio, plan)
    check_latent_pair(window_video, window_audio, FPS, "test", (plan.video_offset, plan.audio_offset))
    out_video, out_audio = run(transformer, window_video, window_audio, guides, 1, STAGE1_SIGMAS)
    assert torch.equal(out_video[:, :, :2], source_video[:, :, 1:])
    assert torch.equal(out_audio[:, :, :17], source_audio[:, :, 1:])
    call = spy[-1]
    assert torch.equal(call["video_coords"], video_position_bounds(1, 5, 2, 2, FPS)[:, :, 4:])
    assert torch.equal(call["audio_coords"], audio_position_bounds(1, 34)[:, :, 1:])
    assert not call["video_keyframes_mask"].any()
    joined_video, joined_audio = extend.join_extension(source_video, source_audio, out_video, out_audio, plan)
    assert joined_video.shape == (1, 128, 5, 2, 2) and joined_audio.shape == (1, 8, 34, 16)
    assert torch.equal(joined_video[:, :, 1:], out_video) and torch.equal(joined_audio[:, :, 1:], out_audio)
    assert torch.equal(joined_video[:, :, :3], source_video) and torch.equal(joined_audio[:, :, :18], source_audio)


def test_extension_plan_refuses_what_cannot_be_a_window():
    """New frames not a multiple of 8, an overlap outside 1 … F_s, or source audio of another clip are refused by
    name."""
    for kwargs, field in (({"new_frames": 12, "overlap": 1}, "extend.new_frames"),
                          ({"new_frames": 16, "overlap": 0}, "extend.overlap"),
                          ({"new_frames": 16, "overlap": 4}, "extend.overlap")):
        with pytest.raises(LTX25Error) as info:
            extend.plan_extension(VIDEO, AUDIO, FPS, **kwargs)
        assert info.value.where == field
    with pytest.raises(LTX25Error, match="source audio length"):
        extend.plan_extension(VIDEO, (1, 8, 20, 16), FPS, 16, 1)


# ---------------------------------------------------------------------------------------------------- accelerations
@pytest.fixture
def recorded(monkeypatch):
    """The CUDA-graph capture replaced by 'replay = call the forward on the static buffers' (no CUDA here)."""
    captures = []
    monkeypatch.setattr(A, "_record", lambda forward, cache, device: captures.append(forward) or forward)
    return captures


def test_graph_path_takes_timesteps_and_positions_as_inputs(transformer, recorded):
    """The graph denoiser copies the per-token timesteps, positions and keyframe marks into its static buffers: a
    guide at another frame (same shapes) and another σ replays the first capture and still gives the eager guided
    x0 bit for bit. Fails if the timesteps or the grid are baked into the capture."""
    A.release(transformer)
    video, audio = randn(VIDEO, 1), randn(AUDIO, 2)
    for frame, sigma in ((16, 0.8), (9, 0.5)):
        held = G.resolve(G.Guides((G.VideoGuide(image(1), 0), G.VideoGuide(image(2), frame))), video, audio, FPS)
        extended = held.extend(video)
        got = A._graph_denoiser(transformer, _cond(), FPS, A.MODES["cuda_graph"], held)(extended, audio, sigma)
        want = T.denoise(transformer, extended, audio, sigma, _cond(), FPS, guided=held)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"frame {frame}"
    assert len(recorded) == 1, f"{len(recorded)} captures"
    A.release(transformer)


@pytest.mark.parametrize("sampler", ["euler", "res_2s"])
def test_guided_sampler_holds_guides_in_every_pass(transformer, sampler, recorded, monkeypatch, spy):
    """The dev sampler with full guidance (four passes in one batched forward) and Euler or res_2s: every forward
    (res_2s: its midpoints too) gets the frame-0 image's exact values in every pass's rows, with timestep 0; the
    image and the audio come out held bit for bit, the appended keyframe cropped; the graph path (capture replaced
    by a plain call) gives the eager latents bit for bit, so its static timesteps and positions follow the guides."""
    cond, neg = _cond(), Conditioning(_cond().video * 0.5, _cond().audio * 0.5)
    guider = guidance.Guidance(cond, neg, guidance.ModalityGuidance(3.0, 1.0, (1,), 0.7, 3.0),
                               guidance.ModalityGuidance(7.0, 1.0, (1,), 0.7, 3.0))
    given = randn(AUDIO, 4)
    guides = G.Guides((G.VideoGuide(image(1), 0), G.VideoGuide(image(2), -1)), (G.AudioGuide(given),))

    def sample():
        return dev_sampling.sample_guided(transformer, guider, torch.zeros(VIDEO), torch.zeros(AUDIO), fps=FPS,
                                          seed=2, sigmas=(1.0, 0.6, 0.0) if sampler == "euler" else (1.0, 0.0),
                                          sampler=sampler, batching="batched",
                                          acceleration="eager", guides=guides)
    video, audio = sample()
    grid = G.StageGrid(1, 3, 2, 2, 18, FPS)
    frame0 = patchify_video(image(1)(grid))[0]
    assert len(spy) == (2 if sampler == "euler" else 3)
    for call in spy:
        assert call["hidden_states"].shape[0] == 4  # cond, uncond, perturbed, isolated
        assert all(torch.equal(rows[:4], frame0) for rows in call["hidden_states"])
        assert not call["timestep"][:, :4].any()
    assert video.shape == VIDEO and torch.equal(video[:, :, 0], image(1)(grid)[:, :, 0])
    assert torch.equal(audio, given)
    A.release(transformer)
    monkeypatch.setattr(guidance, "_eager_forward", guidance._graph_forward)
    graphed = sample()
    assert torch.equal(graphed[0], video) and torch.equal(graphed[1], audio) and len(recorded) == 1
    A.release(transformer)


# ---------------------------------------------------------------------------------------------------- the node
@pytest.fixture
def fake(monkeypatch):
    return stand_in_model(monkeypatch)


def node_latents():
    return ({"samples": torch.zeros(VIDEO), "frame_rate": FPS}, {"samples": torch.zeros(AUDIO), "type": "audio"})


def test_sampler_node_takes_guides_and_returns_the_clip_shapes(fake):
    """LTX-2.5 Distilled Sampler's optional `guides`: the denoiser gets the latent with the appended frame and the
    resolved stage; the outputs have the input shapes and carry the frame rate."""
    guides = G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 0), G.VideoGuide(randn((1, 128, 1, 2, 2), 2), -1)))
    out_v, out_a = LTX25DistilledSampler().sample(fake, None, *node_latents(), 1, "1", "auto", guides=guides)
    assert out_v["samples"].shape == VIDEO and out_a["samples"].shape == AUDIO and out_v["frame_rate"] == FPS
    assert [shape for shape, _ in fake.module.calls] == [torch.Size((1, 128, 4, 2, 2))] * 8  # 8 stage-1 steps
    assert all(isinstance(held, G.GuidedStage) for _, held in fake.module.calls)


BAD = [
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 17),)), "video guide 1's frame index is 17"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), -18),)), "video guide 1's frame index is -18"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 0, 1.5),)), "video guide 1's strength is 1.5"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 0, -0.1),)), "video guide 1's strength is -0.1"),
    (G.Guides(audio=(G.AudioGuide(randn(AUDIO, 1), 0, 2.0),)), "audio guide 1's strength is 2.0"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 4, 4), 1), 0),)), r"video guide 1's latent H', W' is \(4, 4\)"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 3), 1), 0),)), r"video guide 1's latent H', W' is \(2, 3\)"),
    (G.Guides((G.VideoGuide(image(1), 9), G.VideoGuide(randn((1, 128, 2, 2, 2), 1), 9, 1.0, "replace"))),
     "video guide 2 .* past the clip's 3 latent frames"),
    (G.Guides(audio=(G.AudioGuide(randn((1, 8, 19, 16), 1)),)), r"audio guide 1 \(19 latents.*longer than the clip"),
    (G.Guides(audio=(G.AudioGuide(randn((1, 8, 10, 16), 1), 10),)), "longer than the clip"),
    (G.Guides((G.VideoGuide(randn((1, 128, 1, 2, 2), 1), 0, 1.0, "insert"),)), "video guide 1's mode"),
    ("an image", "the value is str"),
]


@pytest.mark.parametrize("guides, message", BAD)
def test_bad_guides_are_refused_by_name_before_the_model_runs(fake, guides, message):
    """An index out of range, a strength outside [0, 1], a latent of another size or aspect, a guide running past
    the clip, audio longer than the clip, an unknown mode, a value of another type: an LTX25Error naming the node
    input and the guide, before any forward."""
    with pytest.raises(LTX25Error, match=message) as info:
        LTX25DistilledSampler().sample(fake, None, *node_latents(), 1, "1", "auto", guides=guides)
    assert info.value.where == "LTX25DistilledSampler.guides" and not fake.module.calls


def test_guides_combine_in_order():
    """`a + b` keeps both lists in order (a later replace wins where two overlap, as the reference applies its
    items in order)."""
    a = G.Guides((G.VideoGuide(torch.zeros(1, 128, 1, 2, 2)),))
    b = G.Guides((G.VideoGuide(torch.ones(1, 128, 1, 2, 2)),))
    held = G.resolve(a + b, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    assert (a + b).video == a.video + b.video and held.video_clean[:, :, 0].eq(1).all()
