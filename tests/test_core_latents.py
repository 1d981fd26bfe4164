"""Latents made by core ComfyUI's LTXV nodes in the pack's nodes, and the canvas guards around them: core's joint
audio+video latent is unbound like core's own decoders do, a full-size latent is not upsampled again, the sampler
offers no cfg, and loader widgets list the shared vae/ folder by kind. The real core nodes run in the ComfyUI tier
(tests/test_comfyui_core.py); here core's NestedTensor is stood in for by an object with the two members read."""
from __future__ import annotations

import asyncio
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from nodes.comfy import bridge as comfy_bridge
from nodes.comfy.audio import LTX25AudioDecode
from nodes.comfy.handles import latent_for_decoder
from nodes.comfy.loaders import LTX25AudioVAELoader, LTX25UpsamplerLoader, LTX25VideoVAELoader
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent, LTX25LatentUpsample
from nodes.ltx import latents
from nodes.ltx.errors import LTX25Error
from nodes.tools.tiny import tiny_paths

NAME = {component: os.path.basename(path) for component, path in tiny_paths("models").items()}


class CoreNested:
    """What the pack reads of core's `comfy.nested_tensor.NestedTensor`: `is_nested` and `unbind()`."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors, self.is_nested = list(tensors), True

    def unbind(self) -> list[torch.Tensor]:
        return self.tensors


def _pair(two_stage: bool = True) -> tuple[dict, dict]:
    return LTX25EmptyLatent().make(128, 128, 9, 24.0, 1, two_stage)


def test_unbind_av_gives_each_stream_and_leaves_plain_tensors_alone():
    """Stream 0 of core's joint latent is the video, stream 1 the audio; a plain tensor (or a torch nested tensor,
    which is a Tensor) passes unchanged. Fails when the order is swapped or plain latents get unbound."""
    video, audio = torch.randn(1, 128, 2, 2, 2), torch.randn(1, 8, 9, 16)
    joint = CoreNested(video, audio)
    assert latents.unbind_av(joint, latents.VIDEO_STREAM, "x") is video
    assert latents.unbind_av(joint, latents.AUDIO_STREAM, "x") is audio
    assert latents.unbind_av(video, latents.AUDIO_STREAM, "x") is video
    with pytest.raises(LTX25Error, match="Separate AV Latent") as info:
        latents.unbind_av(CoreNested(video, audio, audio), latents.VIDEO_STREAM, "LTX25ConvVAEDecode.latent")
    assert info.value.where == "LTX25ConvVAEDecode.latent"


def test_video_decoders_take_the_video_stream_of_a_core_joint_latent():
    """A decode node given core's Concat AV Latent output decodes its video stream, as core's VAE Decode does.
    Fails with 'the latent samples: CoreNested' when the intake does not unbind."""
    video, audio = torch.randn(1, 128, 2, 2, 2), torch.randn(1, 8, 9, 16)
    vae = SimpleNamespace(module=SimpleNamespace(kind="conv"), info=SimpleNamespace(name="conv.safetensors"))
    taken = latent_for_decoder("LTX25ConvVAEDecode", vae, {"samples": CoreNested(video, audio)}, "conv",
                               "conv.safetensors", "LTX25DiffusionVAEDecode")
    assert taken is video


def test_audio_decode_takes_the_audio_stream_of_a_core_joint_latent(tiny_models):
    """The audio decode node given core's joint latent decodes its audio stream: the same waveform as from the
    audio latent alone. Fails when the node refuses the nested samples or picks the video stream."""
    video, audio = _pair()
    vae = LTX25AudioVAELoader().load(NAME["audio_vae"], "fp32")[0]
    alone = asyncio.run(LTX25AudioDecode().decode(vae, audio))[0]["waveform"]
    joint = {**video, **audio, "samples": CoreNested(video["samples"], audio["samples"])}
    from_joint = asyncio.run(LTX25AudioDecode().decode(vae, joint))[0]["waveform"]
    assert from_joint.shape == alone.shape and torch.equal(from_joint, alone)


def test_sampler_takes_a_core_joint_latent_on_both_inputs(monkeypatch):
    """Core's joint latent wired into both sampler inputs is split into its video and audio streams before the
    pair is checked (the outputs are the pack's plain latents). Fails when either input is not unbound."""
    from nodes.ltx.dit import sampling as engine_sampling
    seen = {}

    def fake_sample(module, conditioning, video, audio, **kw):
        seen.update(video=video, audio=audio, fps=kw["fps"])
        return video, audio
    monkeypatch.setattr(engine_sampling, "sample_distilled", fake_sample)
    monkeypatch.setattr(engine_sampling, "working_memory", lambda *a: 0, raising=False)
    monkeypatch.setattr(engine_sampling, "activation_memory_bytes", lambda *a: 0, raising=False)
    video, audio = _pair()
    joint = {"samples": CoreNested(video["samples"], audio["samples"]), "type": "audio"}
    model = SimpleNamespace(module=None, info=SimpleNamespace(name="ltx-2.5-22b-distilled-transformer-bf16"),
                            ready=lambda memory=0: None)
    out_v, out_a = LTX25DistilledSampler().sample(model, None, joint, joint, 0, "1", "auto", frame_rate=24.0)
    assert seen["video"] is video["samples"] and seen["audio"] is audio["samples"] and seen["fps"] == 24.0
    assert out_v["samples"] is video["samples"] and out_a["frame_rate"] == 24.0


def test_upsampling_a_full_size_latent_is_refused_before_any_work(tiny_models):
    """two_stage off in Empty Latent makes the video latent full size; Latent Upsample then refuses it instead of
    silently doubling the output, and so does a second upsample of a latent it already doubled. Fails when the
    mark is lost on the way (the stage-1 sampler keeps the other keys of its input)."""
    node = LTX25LatentUpsample()
    full, _audio = _pair(two_stage=False)
    with pytest.raises(LTX25Error, match="two_stage") as info:
        node.upsample(None, None, full)
    assert info.value.where == "LTX25LatentUpsample.video_latent"
    upsampler = LTX25UpsamplerLoader().load(NAME["upsampler"], "fp32")[0]
    vae = LTX25VideoVAELoader().load(NAME["conv_vae"], "fp32")[0]
    half, _audio = _pair(two_stage=True)
    (doubled,) = node.upsample(upsampler, vae, half)
    assert doubled["samples"].shape[-2:] == full["samples"].shape[-2:] == (4, 4)
    with pytest.raises(LTX25Error, match="upsampled before"):
        node.upsample(upsampler, vae, doubled)


def test_sampler_offers_no_cfg_widget():
    """Distilled LTX-2.5 takes no guidance and only cfg 1.0 was accepted: the node offers no cfg input at all
    (a script passing cfg=3 is still refused by the sampler). Fails when a cfg widget comes back."""
    inputs = LTX25DistilledSampler.INPUT_TYPES()
    assert "cfg" not in inputs["required"] and "cfg" not in inputs.get("optional", {})
    assert inputs["optional"]["frame_rate"][1]["default"] == 24.0


def test_vae_widgets_put_unplaced_files_after_their_kind_and_leave_out_other_kinds(tiny_models, tmp_path):
    """In a vae/ folder shared with other models, each loader lists its own kind first, then files a header read
    cannot place (another model's VAE, a dangling link), and leaves out the LTX-2.5 files of the other loader. Fails when the
    audio VAE shows in the video loader, another model's file vanishes or comes first, or an unreadable entry
    makes INPUT_TYPES raise (ComfyUI would then drop the node)."""
    vae_dir = tmp_path / "models" / "vae"
    os.makedirs(vae_dir)
    for component in ("conv_vae", "diffusion_vae", "audio_vae"):
        shutil.copy(os.path.join(tiny_models, "vae", NAME[component]), vae_dir / NAME[component])
    save_file({"decoder.conv_in.weight": torch.zeros(4, 4)}, str(vae_dir / "aaa-other-model-vae.safetensors"))
    os.symlink(tmp_path / "gone.safetensors", vae_dir / "broken-link.safetensors")  # listed, never readable
    comfy_bridge.set_models_dir(str(tmp_path / "models"))
    try:
        video = LTX25VideoVAELoader.INPUT_TYPES()["required"]["vae_file"][0]
        audio = LTX25AudioVAELoader.INPUT_TYPES()["required"]["audio_vae_file"][0]
    finally:
        comfy_bridge.set_models_dir(tiny_models)
    assert sorted(video[:2]) == sorted([NAME["conv_vae"], NAME["diffusion_vae"]])
    assert video[2:] == ["aaa-other-model-vae.safetensors", "broken-link.safetensors"]
    assert audio == [NAME["audio_vae"], "aaa-other-model-vae.safetensors", "broken-link.safetensors"]
