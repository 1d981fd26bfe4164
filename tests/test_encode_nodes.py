"""The encoders' nodes on the tiny set: the loaders list and load their files, Encode Video pre-compresses a single
image at the model's CRF (and a clip not at all), resizes, tiles and carries the frame rate, Encode Audio turns a
ComfyUI AUDIO into an audio latent; and both refuse what is not their input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.comfy import encode as nodes
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.encode.image_prep import resize_crop
from nodes.ltx.encode.video_encoder import encode_video
from nodes.ltx.errors import LTX25Error
from nodes.ltx.release import OFFICIAL_FILES
from nodes.media.crf import precompress

NAME = {component: name for component, (_folder, name) in OFFICIAL_FILES.items()}
UNTILED = ("off", 80, 768, 24, 64, 0.0)


@pytest.fixture(scope="module")
def video_encoder(tiny_models):
    return nodes.LTX25VideoEncoderLoader().load(NAME["conv_vae"], "fp32")[0]


@pytest.fixture(scope="module")
def audio_encoder(tiny_models):
    return nodes.LTX25AudioEncoderLoader().load(NAME["audio_vae"], "fp32")[0]


def _image(frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """ComfyUI IMAGE frames: smooth ramps with grain, 8-bit values like a loaded picture."""
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    base = torch.stack([x, y, (x + y) / 2], dim=-1).expand(frames, height, width, 3)
    grain = torch.randn(frames, height, width, 3, generator=torch.Generator().manual_seed(seed)) * 0.05
    return ((base + grain).clamp(0, 1) * 255).round() / 255


def test_loaders_list_their_files_and_load_them(tiny_models, video_encoder, audio_encoder):
    """The video-encoder loader offers both video VAE files (both carry the encoder), not the audio VAE; each
    loads, from either file, an encoder with the file's model_version; the audio-encoder loader offers the audio
    VAE only."""
    listed = nodes.LTX25VideoEncoderLoader.INPUT_TYPES()["required"]["vae_file"][0]
    assert {NAME["conv_vae"], NAME["diffusion_vae"]} <= set(listed) and NAME["audio_vae"] not in listed
    assert nodes.LTX25AudioEncoderLoader.INPUT_TYPES()["required"]["audio_vae_file"][0] == [NAME["audio_vae"]]
    from_diffusion = nodes.LTX25VideoEncoderLoader().load(NAME["diffusion_vae"], "bf16")[0]
    assert video_encoder.module.kind == from_diffusion.module.kind == "encoder"
    assert video_encoder.module.model_version == "2.5.0"
    assert audio_encoder.module.kind == "audio encoder"
    with pytest.raises(LTX25Error, match="is an audio VAE"):
        nodes.LTX25VideoEncoderLoader().load(NAME["audio_vae"], "fp32")


def test_a_single_image_is_precompressed_at_the_models_crf(video_encoder):
    """crf −1 on one image: the frames are what H.264 at CRF 18 (the 2.5 file's, from its model_version) gives back,
    resized after — the node's latent equals the engine's encode of exactly that, and differs from the encode of
    the clean image. Fails when the pre-compression is skipped or run at another CRF."""
    image = _image(1, 70, 100)
    latent = nodes.LTX25EncodeVideo().encode(video_encoder, image, 25.0, 64, 64, -1, *UNTILED)[0]
    encoder = video_encoder.module

    def expected(crf: int) -> torch.Tensor:
        frames = torch.from_numpy(precompress(image.numpy(), crf)) if crf else image
        return encode_video(encoder, resize_crop(frames, 64, 64)[None], TilingRequest("off"))

    assert latent["samples"].shape == (1, 128, 1, 2, 2) and latent["frame_rate"] == 25.0
    assert torch.allclose(latent["samples"], expected(18), atol=1e-5)
    for other in (0, 33):
        assert (latent["samples"] - expected(other)).abs().max() > 1e-3, other


def test_a_clip_is_not_precompressed_unless_asked(video_encoder):
    """crf −1 on a 9-frame clip: no pre-compression (the reference compresses image conditionings only); an
    explicit CRF compresses every frame."""
    clip = _image(9, 32, 32, seed=1)
    auto = nodes.LTX25EncodeVideo().encode(video_encoder, clip, 24.0, 0, 0, -1, *UNTILED)[0]["samples"]
    assert torch.allclose(auto, encode_video(video_encoder.module, clip[None], TilingRequest("off")), atol=1e-5)
    forced = nodes.LTX25EncodeVideo().encode(video_encoder, clip, 24.0, 0, 0, 18, *UNTILED)[0]["samples"]
    compressed = torch.from_numpy(precompress(clip.numpy(), 18))[None]
    assert torch.allclose(forced, encode_video(video_encoder.module, compressed, TilingRequest("off")), atol=1e-5)


@pytest.mark.parametrize("images, what", [
    ({"samples": torch.zeros(1, 128, 1, 1, 1)}, "a LATENT"),
    (torch.rand(1, 9, 32, 32, 3), "[1, 9, 32, 32, 3]"),
    (torch.rand(1, 32, 32, 4), "[1, 32, 32, 4]"),
    (None, "NoneType"),
])
def test_encode_video_refuses_what_is_not_an_image(video_encoder, images, what):
    """A LATENT, a 5-D tensor, RGBA, nothing: named on the node's images input."""
    with pytest.raises(LTX25Error, match="LTX25EncodeVideo.images") as error:
        nodes.LTX25EncodeVideo().encode(video_encoder, images, 24.0, 0, 0, 0, *UNTILED)
    assert what in str(error.value), error.value


@pytest.mark.parametrize("images, size, what", [
    (torch.rand(8, 32, 32, 3), (0, 0), "frame count is 8"),
    (torch.rand(1, 40, 64, 3), (0, 0), "height is 40"),
    (torch.rand(1, 40, 64, 3), (64, 48), "LTX25EncodeVideo.height"),
])
def test_encode_video_names_sizes_it_cannot_encode(video_encoder, images, size, what):
    """Frame counts off 8k+1 and sizes off the 32-px grid (kept as they are, or asked for) are named."""
    with pytest.raises(LTX25Error, match="LTX25EncodeVideo") as error:
        nodes.LTX25EncodeVideo().encode(video_encoder, images, 24.0, *size, 0, *UNTILED)
    assert what in str(error.value), error.value


def test_encode_video_tiles_through_its_widgets(video_encoder):
    """The tiling widgets reach the engine: manual tiles with the reference's overlaps give a latent of the
    untiled one's shape (two row tiles here); a too-small overlap is refused by widget name."""
    image = _image(1, 128, 64)
    tiled = nodes.LTX25EncodeVideo().encode(video_encoder, image, 24.0, 0, 0, 0, "manual", 80, 96, 24, 64, 0.0)[0]
    assert tiled["samples"].shape == (1, 128, 1, 4, 2)
    with pytest.raises(LTX25Error, match="LTX25EncodeVideo.overlap_pixels"):
        nodes.LTX25EncodeVideo().encode(video_encoder, image, 24.0, 0, 0, 0, "manual", 80, 96, 24, 32, 0.0)


def test_encode_audio_gives_an_audio_latent(audio_encoder):
    """ComfyUI AUDIO {waveform [B, C, N], sample_rate} → LATENT {samples [B, 8, T, 16], type audio}: one second
    at 44.1 kHz → 26 latent frames."""
    waveform = torch.randn(1, 2, 44100, generator=torch.Generator().manual_seed(0)) * 0.3
    latent = nodes.LTX25EncodeAudio().encode(audio_encoder, {"waveform": waveform, "sample_rate": 44100})[0]
    assert latent["type"] == "audio" and latent["samples"].shape == (1, 8, 26, 16)
    assert latent["samples"].dtype == torch.float32 and np.isfinite(latent["samples"].numpy()).all()


@pytest.mark.parametrize("audio, what", [
    (None, "NoneType"),
    ({"samples": torch.zeros(1, 8, 4, 16)}, "dict"),
    ({"waveform": torch.zeros(1, 2, 0), "sample_rate": 44100}, "0 samples"),
])
def test_encode_audio_refuses_what_is_not_audio(audio_encoder, audio, what):
    """No audio (a video without a track gives None), a LATENT, an empty waveform: named on the audio input."""
    with pytest.raises(LTX25Error, match="LTX25EncodeAudio.audio") as error:
        nodes.LTX25EncodeAudio().encode(audio_encoder, audio)
    assert what in str(error.value), error.value
