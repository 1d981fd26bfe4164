"""The guide nodes (nodes/comfy/guides.py) on the tiny encoders, with a stand-in denoiser (the DiT's part is pinned in
tests/test_guides.py): Image Guide encodes the H.264-pre-compressed image at each stage's size, −1 is the last frame,
Audio Guide holds the encoded audio bit for bit through both stages, Extend Clip holds the source's overlap and Join
Extension gives the requested length; bad inputs are named by node and field."""
from __future__ import annotations

import sys

import pytest
import torch

from guide_helpers import randn, stand_in_model
from nodes.comfy import encode as encode_nodes
from nodes.comfy import guides as nodes
from nodes.comfy.sampling import LTX25DistilledSampler
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.dit import guides as G
from nodes.ltx.encode.image_prep import resize_crop
from nodes.ltx.encode.video_encoder import encode_video
from nodes.ltx.errors import LTX25Error
from nodes.ltx.geometry import audio_latent_frames
from nodes.ltx.release import OFFICIAL_FILES
from nodes.media.crf import precompress

NAME = {component: name for component, (_folder, name) in OFFICIAL_FILES.items()}
FPS = 24.0
STAGE1, STAGE2, AUDIO = (1, 128, 3, 2, 2), (1, 128, 3, 4, 4), (1, 8, 18, 16)  # 17 frames, 64 px then 128 px


@pytest.fixture(scope="module")
def video_encoder(tiny_models):
    return encode_nodes.LTX25VideoEncoderLoader().load(NAME["conv_vae"], "fp32")[0]


@pytest.fixture(scope="module")
def audio_encoder(tiny_models):
    return encode_nodes.LTX25AudioEncoderLoader().load(NAME["audio_vae"], "fp32")[0]


@pytest.fixture
def model(monkeypatch):
    return stand_in_model(monkeypatch)


def _image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    grain = torch.randn(height, width, 3, generator=torch.Generator().manual_seed(seed)) * 0.05
    return ((torch.stack([x, y, (x + y) / 2], -1) + grain).clamp(0, 1)[None] * 255).round() / 255


def sample(model, video, audio, guides, stage="1"):
    return LTX25DistilledSampler().sample(model, None, {"samples": video, "frame_rate": FPS},
                                          {"samples": audio, "type": "audio"}, 1, stage, "auto", guides=guides)


def _encode(encoder, image, size, crf):
    frames = torch.from_numpy(precompress(image.numpy(), crf)) if crf else image
    return encode_video(encoder.module, resize_crop(frames, size, size)[None], TilingRequest("off"))


def test_image_guide_encodes_the_precompressed_image_at_each_stages_size(model, video_encoder):
    """Stage 1 (64 px) and stage 2 (128 px) each call the provider with their grid: each stage's first latent frame
    is, bit for bit, the provider's encode at that size, which is the encode of the image pre-compressed at CRF 18
    (the 2.5 file's) then resized — not of the clean image, nor of the other stage's size. Fails if the node skips
    the CRF, encodes once for all stages, or resizes before compressing at another size."""
    image = _image(70, 100)
    guides = nodes.LTX25ImageGuide().guide(image, video_encoder, 0, 1.0)[0]
    provider = guides.video[0].latent
    out1 = sample(model, torch.zeros(STAGE1), torch.zeros(AUDIO), guides)[0]["samples"]
    out2 = sample(model, torch.zeros(STAGE2), torch.zeros(AUDIO), guides, "2")[0]["samples"]
    assert provider.calls == [(64, 64), (128, 128)]
    for out, size in ((out1, 64), (out2, 128)):
        held = provider.cache[(size, size)]
        assert torch.equal(out[:, :, :1], held), size
        want = _encode(video_encoder, image, size, 18)
        assert torch.allclose(held, want, atol=1e-5), (held - want).abs().max()
        clean = _encode(video_encoder, image, size, 0)
        assert (held - clean).abs().max() > 1e-3, "the CRF pre-compression was skipped"


def test_image_of_another_aspect_is_cropped_to_the_stage_not_stretched(model, video_encoder):
    """A 2:1 image on a square grid: scaled to cover (here kept) and the centre cut out — the held latent is the
    encode of the pre-compressed image's middle 64 columns."""
    image = _image(64, 128, seed=3)
    guides = nodes.LTX25ImageGuide().guide(image, video_encoder, 0, 1.0)[0]
    held = guides.video[0].latent(G.StageGrid(1, 3, 2, 2, 18, FPS))
    middle = torch.from_numpy(precompress(image.numpy(), 18))[:, :, 32:96]
    want = encode_video(video_encoder.module, middle[None], TilingRequest("off"))
    assert torch.allclose(held, want, atol=1e-5), (held - want).abs().max()


def test_frame_index_minus_one_is_the_last_frame_and_is_cropped(model, video_encoder):
    """First–last frame: frame 0 replaces the first latent frame, −1 is appended at the clip's last pixel frame
    (16 of 17: time 16/24 s) and cropped from the sampler's output, which keeps the clip's 3 latent frames."""
    guides = nodes.LTX25ImageGuide().guide(_image(64, 64), video_encoder, 0, 1.0)[0]
    guides = nodes.LTX25ImageGuide().guide(_image(64, 64, seed=5), video_encoder, -1, 1.0, guides)[0]
    held = G.resolve(guides, torch.zeros(STAGE1), torch.zeros(AUDIO), FPS)
    assert held.appended == 1 and torch.equal(held.video_clean[:, :, 3:], guides.video[1].latent.cache[(64, 64)])
    starts = held.grid.video_coords[0, 0, -4:, 0]  # the appended frame's 2×2 tokens, time start in seconds
    assert torch.allclose(starts, torch.full_like(starts, 16 / FPS)), starts
    out = sample(model, torch.zeros(STAGE1), torch.zeros(AUDIO), guides)[0]["samples"]
    assert out.shape == STAGE1


@pytest.fixture
def forwards(model, monkeypatch) -> list:
    """Every stand-in forward's video latent and resolved guides (`GuidedStage`), in order."""
    seen = []
    stand_in = sys.modules["nodes.ltx.dit.transformer"]
    real = stand_in.denoise

    def spy(m, video, audio, sigma, cond, fps, guided=None):
        seen.append((video.detach().clone(), guided))
        return real(m, video, audio, sigma, cond, fps, guided)

    monkeypatch.setattr(stand_in, "denoise", spy)
    return seen


def test_chained_image_guides_hold_the_first_and_a_middle_frame_in_both_stages(model, video_encoder, forwards):
    """Keyframes by chaining: Image Guide at frame 0 → guides → Image Guide at frame 8 (the middle of 17). In every
    forward of both stages (64 px, then 128 px) the clip's first latent frame is the first image's encode at that
    stage's size and one appended latent frame, at time 8/24 s, is the second image's, both held (mask 0); the
    sampler's output keeps the first and crops the appended frame. Fails if chaining drops or reorders a guide, or a
    stage gets either image at the other stage's size."""
    first, middle = _image(64, 64, seed=1), _image(64, 64, seed=2)
    guides = nodes.LTX25ImageGuide().guide(first, video_encoder, 0, 1.0)[0]
    guides = nodes.LTX25ImageGuide().guide(middle, video_encoder, 8, 1.0, guides)[0]
    assert [g.frame for g in guides.video] == [0, 8]
    for stage, shape, size in (("1", STAGE1, 64), ("2", STAGE2, 128)):
        forwards.clear()
        out = sample(model, torch.zeros(shape), torch.zeros(AUDIO), guides, stage)[0]["samples"]
        want_first, want_middle = (_encode(video_encoder, image, size, 18) for image in (first, middle))
        assert out.shape == shape and torch.allclose(out[:, :, :1], want_first, atol=1e-5), stage
        assert forwards, "the stand-in denoiser never ran"
        for video, held in forwards:
            assert video.shape[2] == 4 and held.appended == 1, (stage, video.shape)
            assert torch.allclose(video[:, :, :1], want_first, atol=1e-5), stage
            assert torch.allclose(video[:, :, 3:], want_middle, atol=1e-5), stage
            assert not held.video_mask[:, :, :1].any() and not held.video_mask[:, :, 3:].any(), stage
            assert held.video_mask[:, :, 1:3].eq(1).all(), stage
            starts = held.grid.video_coords[0, 0, -(size // 32) ** 2:, 0]
            assert torch.allclose(starts, torch.full_like(starts, 8 / FPS)), starts


def _clip(frames: int, size: int = 64) -> torch.Tensor:
    return torch.cat([_image(size, size, seed=10 + i) for i in range(frames)])


@pytest.mark.parametrize("frame_index", [0, 8])
def test_a_batch_of_nine_frames_is_held_from_the_frame_index_on_in_both_stages(model, video_encoder, forwards,
                                                                               frame_index):
    """An IMAGE batch of 9 frames (as core's LTXVAddGuide takes one at a frame index) is a clip: encoded whole, not
    pre-compressed (as Encode Video leaves a clip), into 2 latent frames at each stage's size. At frame 0 they
    replace the clip's first 2 latent frames; at frame 8 they are appended after the clip's 3 (time from 8/24 s)
    and cropped. Held (mask 0) in every forward of both stages. Fails if only the first image is used, the batch
    is encoded frame by frame, or it lands at another index."""
    frames = _clip(9)
    guides = nodes.LTX25ImageGuide().guide(frames, video_encoder, frame_index, 1.0)[0]
    for stage, shape, size in (("1", STAGE1, 64), ("2", STAGE2, 128)):
        forwards.clear()
        out = sample(model, torch.zeros(shape), torch.zeros(AUDIO), guides, stage)[0]["samples"]
        want = _encode(video_encoder, frames, size, 0)
        assert want.shape[2] == 2 and out.shape == shape, (want.shape, out.shape)
        assert torch.equal(guides.video[0].latent.cache[(size, size)], want), stage
        slots = slice(0, 2) if frame_index == 0 else slice(3, 5)
        if frame_index == 0:
            assert torch.allclose(out[:, :, :2], want, atol=1e-5), stage
        cells = (size // 32) ** 2  # tokens per latent frame
        for video, held in forwards:
            assert video.shape[2] == (3 if frame_index == 0 else 5), (stage, video.shape)
            assert torch.allclose(video[:, :, slots], want, atol=1e-5), stage
            assert not held.video_mask[:, :, slots].any(), stage
            assert held.video_mask.sum() == held.video_mask.numel() - 2 * cells, stage  # the rest is free
            if frame_index:
                start = held.grid.video_coords[0, 0, 3 * cells, 0]  # the first appended token
                assert torch.isclose(start, torch.tensor(8 / FPS)), start


def test_audio_guide_holds_the_audio_bit_for_bit_through_both_stages(model, audio_encoder):
    """Audio-to-video: the frames output is the fewest 8k+1 frames whose clip holds the audio; stage 1 then stage 2
    (fed stage 1's audio, as the templates do) return the encoded audio exactly."""
    waveform = randn((1, 2, 16000), 1) * 0.3  # one second at 16 kHz → 26 latents
    audio = {"waveform": waveform, "sample_rate": 16000}
    guides, frames = nodes.LTX25AudioGuide().guide(audio, audio_encoder, FPS, 1.0)
    latent = encode_nodes.LTX25EncodeAudio().encode(audio_encoder, audio)[0]["samples"]
    count = latent.shape[2]
    assert (frames - 1) % 8 == 0 and audio_latent_frames(frames, FPS) >= count > audio_latent_frames(frames - 8, FPS)
    t = audio_latent_frames(frames, FPS)
    f = (frames - 1) // 8 + 1
    v1, a1 = sample(model, torch.zeros(1, 128, f, 2, 2), torch.zeros(1, 8, t, 16), guides)
    v2, a2 = sample(model, torch.zeros(1, 128, f, 4, 4), a1["samples"], guides, "2")
    for out in (a1["samples"], a2["samples"]):
        assert torch.equal(out[:, :, :count], latent)


def test_audio_guide_refuses_audio_longer_than_empty_latents_frames(audio_encoder):
    """Audio longer than Empty Latent's 1025 frames at fps is refused by the guide, naming its audio, rather than
    as a frame count by Empty Latent (ComfyUI does not range-check the linked frames)."""
    audio = {"waveform": torch.zeros(1, 1, 9 * 8000), "sample_rate": 8000}  # 9 s; 1025 frames at 120 fps hold 8.56 s
    with pytest.raises(LTX25Error, match="LTX25AudioGuide.audio.*at most 8.56 s at 120 fps"):
        nodes.LTX25AudioGuide().guide(audio, audio_encoder, 120.0, 1.0)
    guides, frames = nodes.LTX25AudioGuide().guide(audio, audio_encoder, 24.0, 1.0)
    assert frames == 217  # the same audio at 24 fps fits: 9 s → 217 frames


def test_extend_holds_the_overlap_and_join_has_the_requested_length(model):
    """Extend Clip by 16 frames with overlap 2: the sampled window starts with the source's last two latent frames
    bit for bit; Join Extension gives 17 + 16 = 33 frames (5 latent frames, the source's first) and the joined
    clip's audio length, starting with the source's audio."""
    source_v, source_a = randn(STAGE1, 1), randn(AUDIO, 2)
    video_in, audio_in = {"samples": source_v, "frame_rate": FPS}, {"samples": source_a, "type": "audio"}
    window_v, window_a, guides = nodes.LTX25ExtendClip().extend(video_in, audio_in, 16, 2, 1.0)
    assert window_v["samples"].shape == (1, 128, 4, 2, 2)
    out_v, out_a = LTX25DistilledSampler().sample(model, None, window_v, window_a, 1, "1", "auto", guides=guides)
    assert torch.equal(out_v["samples"][:, :, :2], source_v[:, :, 1:])
    joined_v, joined_a = nodes.LTX25JoinExtension().join(video_in, audio_in, out_v, out_a, 2)
    assert joined_v["samples"].shape == (1, 128, 5, 2, 2) and joined_v["frame_rate"] == FPS
    assert joined_a["samples"].shape[2] == audio_latent_frames(33, FPS)
    assert torch.equal(joined_v["samples"][:, :, :3], source_v) and torch.equal(joined_a["samples"][:, :, :18],
                                                                                source_a)


def test_join_refuses_an_overlap_other_than_the_windows():
    """A window made with overlap 1 also has the shapes of one made with 2 (one latent frame fewer new); Join
    Extension refuses the other overlap by name instead of joining a clip one latent frame short."""
    video_in, audio_in = {"samples": randn(STAGE1, 1), "frame_rate": FPS}, {"samples": randn(AUDIO, 2), "type": "audio"}
    window_v, window_a, _ = nodes.LTX25ExtendClip().extend(video_in, audio_in, 16, 1, 1.0)
    with pytest.raises(LTX25Error, match=r"LTX25JoinExtension.overlap: overlap is 2, expected 1"):
        nodes.LTX25JoinExtension().join(video_in, audio_in, window_v, window_a, 2)
    joined_v, _ = nodes.LTX25JoinExtension().join(video_in, audio_in, window_v, window_a, 1)
    assert joined_v["samples"].shape[2] == STAGE1[2] + 2  # 16 new frames: two latent frames


def _bad_audio(audio_encoder):
    return nodes.LTX25AudioGuide().guide({"waveform": randn((1, 2, 16000), 1) * 0.3, "sample_rate": 16000},
                                         audio_encoder, FPS, 1.0)[0]


@pytest.mark.parametrize("make, field", [
    (lambda v, a: nodes.LTX25ImageGuide().guide(_image(64, 64), v, 17, 1.0)[0], "LTX25ImageGuide.frame_index"),
    (lambda v, a: nodes.LTX25ImageGuide().guide(_image(64, 64), v, -18, 1.0)[0], "LTX25ImageGuide.frame_index"),
    (lambda v, a: nodes.LTX25ImageGuide().guide(_image(64, 64), v, 0, 1.5)[0], "LTX25ImageGuide.strength"),
    (lambda v, a: nodes.LTX25ImageGuide().guide(_image(64, 64).expand(2, -1, -1, -1), v, 0, 1.0)[0],
     "LTX25ImageGuide.image"),
    (lambda v, a: nodes.LTX25ImageGuide().guide(_clip(10), v, 0, 1.0)[0], "LTX25ImageGuide.image"),  # not 8k+1
    (lambda v, a: nodes.LTX25ImageGuide().guide(_clip(9), v, 9, 1.0)[0], "LTX25ImageGuide.frame_index"),  # 9…17
    (lambda v, a: nodes.LTX25ImageGuide().guide(_clip(9), v, -1, 1.0)[0], "LTX25ImageGuide.frame_index"),
    (lambda v, a: nodes.LTX25ImageGuide().guide(_clip(25), v, 0, 1.0)[0], "LTX25ImageGuide.frame_index"),
    (lambda v, a: nodes.LTX25AudioGuide().guide({"waveform": torch.zeros(1, 2, 16000), "sample_rate": 16000}, a,
                                                FPS, -0.1)[0], "LTX25AudioGuide.strength"),
    (lambda v, a: _bad_audio(a), "LTX25AudioGuide.audio"),  # 26 latents, the 17-frame clip has 18
    (lambda v, a: nodes.LTX25ExtendClip().extend({"samples": torch.zeros(STAGE1), "frame_rate": FPS},
                                                 {"samples": torch.zeros(AUDIO)}, 12, 1, 1.0), "LTX25ExtendClip.new_frames"),
    (lambda v, a: nodes.LTX25ExtendClip().extend({"samples": torch.zeros(STAGE1), "frame_rate": FPS},
                                                 {"samples": torch.zeros(AUDIO)}, 16, 4, 1.0), "LTX25ExtendClip.overlap"),
])
def test_bad_inputs_are_named_by_node_and_field(model, video_encoder, audio_encoder, make, field):
    """A frame index outside the clip (at sampling, where the clip's length is known; a batch's frames must end
    inside it), a strength outside [0, 1], a batch of images that is not 8k+1 frames, audio longer than the clip,
    new frames off a multiple of 8, an overlap longer than the source: an LTX25Error whose `where` is the node's
    field."""
    with pytest.raises(LTX25Error) as info:
        guides = make(video_encoder, audio_encoder)
        sample(model, torch.zeros(STAGE1), torch.zeros(AUDIO), guides)
    assert info.value.where == field, info.value


def test_an_empty_image_batch_is_refused_by_name():
    """A video loader that read no frames hands on `[0, H, W, 3]`: named, not a garbled frame-count rule."""
    from nodes.comfy.encode import check_image
    from nodes.ltx.errors import LTX25Error
    with pytest.raises(LTX25Error, match=r"LTX25ImageGuide\.image.*at least one frame"):
        check_image(torch.zeros(0, 64, 96, 3), "LTX25ImageGuide.image")
