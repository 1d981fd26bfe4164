"""Latent geometry (docs/MODEL.md §6) and the Empty Latent node: shapes, and bad sizes refused naming the node input."""
from __future__ import annotations

import pytest
import torch

from nodes.ltx import geometry, latents
from nodes.ltx.errors import LTX25Error
from nodes.comfy.sampling import LTX25EmptyLatent


def test_reference_example_shapes():
    """768×512, 121 frames, 24 fps → stage-1 [1,128,16,8,12], stage-2 [1,128,16,16,24], audio [1,8,126,16]
    (the §6 example); a wrong compression factor or frame formula breaks it."""
    assert geometry.video_latent_shape(384, 256, 121, 1) == (1, 128, 16, 8, 12)
    assert geometry.video_latent_shape(768, 512, 121, 1) == (1, 128, 16, 16, 24)
    assert geometry.audio_latent_shape(121, 24.0, 1) == (1, 8, 126, 16)


def test_pixel_and_latent_frames_are_inverse_on_the_causal_grid():
    """F = 8(F'−1)+1 both ways: 1 latent frame is 1 pixel frame, 16 are 121. A grid without the causal first
    frame (8F') is off by seven frames everywhere."""
    assert [geometry.pixel_frames(n) for n in (1, 2, 16)] == [1, 9, 121]
    assert all(geometry.latent_frames(geometry.pixel_frames(n)) == n for n in range(1, 40))
    assert geometry.pixel_shape((16, 16, 24)) == (121, 512, 768)


def test_audio_length_rounds_instead_of_ceiling():
    """T = round(F/fps·25): 9 frames at 24 fps is 9.375 → 9 (ceil would give 10, off by one latent of audio)."""
    assert geometry.audio_latent_frames(9, 24.0) == 9
    assert geometry.audio_latent_frames(17, 24.0) == 18  # 17.708 rounds up


def test_two_stage_empty_latent_is_half_size():
    """With two_stage the width/height are the final size and the video latent is the half-size stage-1 latent."""
    video, audio = latents.empty_latent_shapes(768, 512, 121, 24.0, 2, two_stage=True)
    assert video == (2, 128, 16, 8, 12) and audio == (2, 8, 126, 16)
    video, _ = latents.empty_latent_shapes(768, 512, 121, 24.0, 1, two_stage=False)
    assert video == (1, 128, 16, 16, 24)


@pytest.mark.parametrize("kwargs, name", [
    (dict(width=100, height=512, frames=121), "width"),
    (dict(width=768, height=500, frames=121), "height"),
    (dict(width=768, height=512, frames=120), "frames"),
    (dict(width=768, height=512, frames=0), "frames"),
    (dict(width=768, height=512, frames=121, fps=0.0), "fps"),
    (dict(width=768, height=512, frames=121, batch=0), "batch"),
    (dict(width=736, height=512, frames=121, two_stage=True), "width"),   # 32k but not 64k
])
def test_bad_sizes_name_the_input(kwargs, name):
    """Each invalid input raises LTX25Error whose location is `LTX25EmptyLatent.<input>`; a generic error or one
    naming the wrong input leaves the user guessing."""
    args = dict(fps=24.0, batch=1, two_stage=False) | kwargs
    with pytest.raises(LTX25Error) as info:
        latents.empty_latent_shapes(**args)
    assert info.value.where == f"LTX25EmptyLatent.{name}", str(info.value)


def test_single_stage_accepts_multiples_of_32():
    """Without two_stage, 736 (= 23·32) is a valid width; only two_stage needs multiples of 64."""
    assert latents.empty_latent_shapes(736, 480, 9, 24.0, 1, two_stage=False)[0] == (1, 128, 2, 15, 23)


def test_empty_latent_node_outputs():
    """The node returns zero latents with frame_rate (the sampler reads it) and the audio LATENT marked 'audio'."""
    video, audio = LTX25EmptyLatent().make(768, 512, 121, 24.0, 1, True)
    assert video["samples"].shape == (1, 128, 16, 8, 12) and video["frame_rate"] == 24.0
    assert audio["samples"].shape == (1, 8, 126, 16) and audio["type"] == "audio" and audio["frame_rate"] == 24.0
    assert not video["samples"].any() and not audio["samples"].any()


@pytest.mark.parametrize("frames, fps, field", [(1033, 24.0, "frames"), (121, 240.0, "fps"), (121, 0.5, "fps")])
def test_empty_latent_refuses_a_linked_value_outside_its_widget_range(frames, fps, field):
    """ComfyUI range-checks a widget's own value, not a linked one (Audio Guide's frames): the node checks both,
    naming the input, before allocating anything. Fails without the node's own check (1033 frames is 8k+1)."""
    with pytest.raises(LTX25Error, match=f"LTX25EmptyLatent.{field}"):
        LTX25EmptyLatent().make(768, 512, frames, fps, 1, True)


def test_mismatched_latent_pair_refused():
    """An audio latent from a different clip length (or fps) is refused before sampling, naming the input."""
    video = torch.zeros(1, 128, 2, 2, 2)
    with pytest.raises(LTX25Error) as info:
        latents.check_latent_pair(video, torch.zeros(1, 8, 5, 16), 24.0, "LTX25DistilledSampler")
    assert info.value.where == "LTX25DistilledSampler.audio_latent", str(info.value)
    latents.check_latent_pair(video, torch.zeros(1, 8, 9, 16), 24.0, "LTX25DistilledSampler")


def test_empty_latents_are_refused_naming_the_input():
    """A latent with no frame, row, column or batch item (a hand-made or edited LATENT) is an LTX25Error naming the
    node input, not a torch kernel error from deep inside a decoder or the DiT."""
    for shape in ((1, 128, 0, 2, 2), (1, 128, 2, 0, 2), (1, 128, 2, 2, 0), (0, 128, 2, 2, 2)):
        with pytest.raises(LTX25Error, match="Decode.latent: the latent shape"):
            latents.check_video_latent(torch.zeros(shape), "Decode.latent")
        with pytest.raises(LTX25Error, match="Sampler.video_latent"):
            latents.check_latent_pair(torch.zeros(shape), torch.zeros(shape[0], 8, 9, 16), 24.0, "Sampler")
    with pytest.raises(LTX25Error, match="Sampler.audio_latent: the audio latent shape"):
        latents.check_latent_pair(torch.zeros(1, 128, 2, 2, 2), torch.zeros(1, 8, 0, 16), 24.0, "Sampler")


def test_missing_frame_rate_refused():
    """A LATENT without 'frame_rate' (e.g. from a core node) is refused with a hint to use Empty Latent."""
    with pytest.raises(LTX25Error, match="frame_rate"):
        latents.frame_rate({"samples": torch.zeros(1)}, "LTX25DistilledSampler.video_latent")
