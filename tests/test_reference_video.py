"""IC-LoRA reference videos (nodes/ltx/dit/guides.py `ReferenceGuide`, nodes/comfy/reference_video.py; docs/MODEL.md
§16.7): the reference tokens' positions stretched by the IC-LoRA's scale factors, the tokens appended clean with
timestep 0 in every forward and cropped from the outputs (a spy on the tiny DiT's inputs), the node's frame thinning,
size and frames output, and its refusals."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from guide_helpers import dit_inputs, randn, stand_in_model
from nodes.comfy import bridge
from nodes.comfy import encode as encode_nodes
from nodes.comfy.handles import Loaded
from nodes.comfy.reference_video import LTX25ReferenceVideoGuide
from nodes.comfy.sampling import LTX25DistilledSampler
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.dit import guides as G
from nodes.ltx.dit import sampling
from nodes.ltx.dit.positions import patchify_video, video_position_bounds
from nodes.ltx.encode.image_prep import reference_clip_frames, resize_crop
from nodes.ltx.encode.video_encoder import encode_video
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.lora import ReferenceScales
from nodes.ltx.release import OFFICIAL_FILES
from nodes.tools.tiny.common import TINY_DIMS

FPS = 24.0
VIDEO, AUDIO = (1, 128, 3, 2, 2), (1, 8, 18, 16)  # 17 frames at 24 fps, 64×64 px
SIGMAS = (1.0, 0.6, 0.0)
NODE = "LTX25ReferenceVideoGuide"


def _cond() -> Conditioning:
    g = torch.Generator().manual_seed(7)
    return Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g))


def run(model, guides, sampler="euler"):
    return sampling.sample_distilled(model, _cond(), torch.zeros(VIDEO), torch.zeros(AUDIO), fps=FPS, seed=5, stage=1,
                                     sampler=sampler, sigmas=SIGMAS, acceleration="eager", guides=guides)


# ---------------------------------------------------------------------------------------------------- positions
def test_reference_positions_are_stretched_by_the_ic_loras_spatial_and_temporal_factors():
    """A reference of 3 latent frames × 1 × 2 cells for an IC-LoRA trained at half size and every 2nd frame: each
    cell spans 64 px (2 × 32) and latent frame j, [8j−7, 8j+1) of its own frames, lands on clip frames
    [2(8j−7) − 1, 2(8j+1) − 1) — the first on [0, 1), latent 1 ending at frame 17, where the clip's latent 2 ends.
    Values written out by hand from the reference's rule; fails if either scaling (or the shift) is dropped."""
    got = G.reference_position_bounds(1, 3, 1, 2, FPS, spatial=2, temporal=2)
    time = torch.tensor([[0, 1], [1, 17], [17, 33]], dtype=torch.float32).repeat_interleave(2, 0) / FPS
    space = torch.tensor([[0, 64]] * 6, dtype=torch.float32)
    columns = torch.tensor([[0, 64], [64, 128]] * 3, dtype=torch.float32)
    want = torch.stack([time, space, columns])[None]
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), (got - want).abs().max()
    clip_end = video_position_bounds(1, 3, 1, 1, FPS)[0, 0, 2, 1]
    assert torch.allclose(got[0, 0, 2, 1], clip_end), "reference latent 1 does not end with the clip's latent 2"


def test_a_reference_at_scale_one_sits_on_the_clips_own_positions():
    """An IC-LoRA trained on full-size, every-frame references: its reference's positions are the clip's, token for
    token (what the trainer concatenated)."""
    got = G.reference_position_bounds(2, 3, 2, 3, FPS)
    want = video_position_bounds(2, 3, 2, 3, FPS)
    assert torch.equal(got, want), (got - want).abs().max()


# ---------------------------------------------------------------------------------------------------- sampling
@pytest.fixture
def spy(transformer):
    with dit_inputs(transformer) as calls:
        yield calls


@pytest.mark.parametrize("sampler", ["euler", "euler_ancestral"])
def test_reference_tokens_enter_every_forward_clean_at_their_positions_and_leave_cropped(transformer, spy, sampler):
    """A half-size reference (1×1 cells against the clip's 2×2; two latent frames) at strength 1: every forward gets
    the clip's 12 tokens then the reference's 2, bit for bit the reference latent, at timestep 0, unmarked as
    keyframes, at `reference_position_bounds`; the output has the clip's shape and differs from the run without the
    reference (the clip attends to it). Fails if the tokens are not held (the blend or the ancestral re-blend), not
    cropped, or placed at unscaled positions."""
    reference = randn((1, 128, 2, 1, 1), 3)
    guides = G.Guides(reference=(G.ReferenceGuide(reference, 1.0, spatial=2, temporal=2),))
    held = G.resolve(guides, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    assert held.flat and held.video_clean.shape == (1, 128, 1, 1, 14) and held.appended_tokens == 2
    out_video, out_audio = run(transformer, guides, sampler)
    tokens = patchify_video(reference)[0]
    positions = G.reference_position_bounds(1, 2, 1, 1, FPS, 2, 2)[0]
    assert len(spy) == len(SIGMAS) - 1
    for call, sigma in zip(spy, SIGMAS):
        assert call["hidden_states"].shape[1] == 14
        assert torch.equal(call["hidden_states"][0, 12:], tokens), f"σ={sigma}: the reference tokens moved"
        t = call["timestep"][0] / 1000
        assert torch.equal(t[12:], torch.zeros(2)) and torch.allclose(t[:12], torch.full((12,), sigma)), t
        assert torch.equal(call["video_coords"][0, :, 12:], positions)
        assert torch.equal(call["video_keyframes_mask"][0, :, 0], torch.tensor([1.0] * 4 + [0.0] * 10))
    assert out_video.shape == VIDEO and out_audio.shape == AUDIO
    plain = run(transformer, None, sampler)[0]
    assert (out_video - plain).abs().max() > 1e-4, "the clip did not attend to the reference"


def test_reference_strength_sets_its_tokens_timestep(transformer, spy):
    """At strength 0.25 the reference tokens are denoised at σ·0.75 (mask 1 − strength), the clip's at σ."""
    guides = G.Guides(reference=(G.ReferenceGuide(randn((1, 128, 2, 1, 1), 3), 0.25, 2, 2),))
    run(transformer, guides)
    for call, sigma in zip(spy, SIGMAS):
        t = call["timestep"][0] / 1000
        assert torch.allclose(t[12:], torch.full((2,), sigma * 0.75)) and torch.allclose(t[:12], torch.full((12,),
                                                                                                             sigma))


def test_a_same_size_reference_joins_a_keyframe_guide_in_the_frame_layout(transformer):
    """At scale 1 the reference is appended like a guide frame (the stage keeps its [B, C, F+K, H', W'] layout, after
    an appended keyframe), and the output is cropped to the clip."""
    guides = G.Guides(video=(G.VideoGuide(randn((1, 128, 1, 2, 2), 1), -1),),
                      reference=(G.ReferenceGuide(randn((1, 128, 3, 2, 2), 2)),))
    held = G.resolve(guides, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    assert not held.flat and held.video_clean.shape == (1, 128, 7, 2, 2)
    assert torch.equal(held.grid.video_coords[:, :, 16:], G.reference_position_bounds(1, 3, 2, 2, FPS))
    assert run(transformer, guides)[0].shape == VIDEO


def test_extend_then_crop_gives_the_clip_back_in_the_token_row_layout():
    """The flat layout's slots come after the clip's tokens, and cropping restores the clip bit for bit."""
    guides = G.Guides(reference=(G.ReferenceGuide(randn((1, 128, 1, 1, 1), 3), 1.0, 2, 1),))
    held = G.resolve(guides, torch.zeros(VIDEO), torch.zeros(AUDIO), FPS)
    clip = randn(VIDEO, 4)
    extended = held.extend(clip)
    assert extended.shape == held.video_clean.shape and torch.equal(held.crop(extended), clip)
    assert torch.equal(patchify_video(extended)[:, :12], patchify_video(clip))


# ---------------------------------------------------------------------------------------------------- the node
@pytest.fixture(scope="module")
def video_encoder(tiny_models):
    name = OFFICIAL_FILES["conv_vae"][1]
    return encode_nodes.LTX25VideoEncoderLoader().load(name, "fp32")[0]


def _handle(spatial=1, temporal=1, loras=("ic.safetensors",)):
    module = torch.nn.Linear(1, 1)
    return Loaded(module, bridge.make_patcher(module), SimpleNamespace(name="tiny"),
                  ReferenceScales(spatial, temporal), loras)


def _frames(count, height=64, width=64, seed=0):
    return torch.rand(count, height, width, 3, generator=torch.Generator().manual_seed(seed))


def test_node_thins_fits_and_encodes_the_frames_the_clip_uses(video_encoder):
    """IC-LoRA at (2, 2), 25 frames for a 17-frame 64 px clip: frames 0, 1, 3, …, 15 (the first 17, every 2nd after
    the first) fitted to 32 px and encoded; frames output 17 (the longest 16k+1 clip 25 frames cover)."""
    frames = _frames(25)
    guides, clip_frames = LTX25ReferenceVideoGuide().guide(_handle(2, 2), frames, video_encoder, 1.0)
    assert clip_frames == 17 == reference_clip_frames(25, 2)
    reference = guides.reference[0]
    assert (reference.spatial, reference.temporal, reference.strength) == (2, 2, 1.0)
    latent = reference.latent(G.StageGrid(1, 3, 2, 2, 18, FPS))
    picked = frames[[0, 1, 3, 5, 7, 9, 11, 13, 15]]
    want = encode_video(video_encoder.module, resize_crop(picked, 32, 32)[None], TilingRequest("off"))
    assert latent.shape == (1, 128, 2, 1, 1) and torch.allclose(latent, want, atol=1e-5), (latent - want).abs().max()


@pytest.fixture
def fake(monkeypatch):
    return stand_in_model(monkeypatch, ReferenceScales(2, 1), ("ic.safetensors",))


@pytest.mark.parametrize("make, where", [
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(loras=()), _frames(17), e, 1.0), f"{NODE}.model"),
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(), _frames(17), e, 1.5), f"{NODE}.strength"),
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(), _frames(12), e, 1.0)[0], f"{NODE}.images"),  # 12 ≠ 8k+1
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(1, 4), _frames(17), e, 1.0)[0], f"{NODE}.images"),  # 5 kept
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(), _frames(17, 64, 96), e, 1.0)[0], f"{NODE}.images"),
    (lambda e: LTX25ReferenceVideoGuide().guide(_handle(4), _frames(17), e, 1.0)[0],
     "LTX25DistilledSampler.guides"),  # stage grid 2×2 cannot hold a quarter-size reference
])
def test_bad_reference_inputs_are_named_by_node_and_field(fake, video_encoder, make, where):
    """No LoRA on the model, a strength outside [0, 1], a frame count that is not 8k+1 after thinning, a 3:2 video for
    a square clip (a 33 % crop), a stage grid the IC-LoRA's scale does not divide: an LTX25Error naming the field
    (the last one the sampler's guides, where the stage's size is known)."""
    with pytest.raises(LTX25Error) as info:
        guides = make(video_encoder)
        LTX25DistilledSampler().sample(fake, None, {"samples": torch.zeros(VIDEO), "frame_rate": FPS},
                                       {"samples": torch.zeros(AUDIO), "type": "audio"}, 1, "1", "auto",
                                       guides=guides)
    assert info.value.where == where, info.value
