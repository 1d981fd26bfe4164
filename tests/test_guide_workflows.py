"""The conditioning templates (i2v, first–last frame, a2v, extend, IC-LoRA) run headless on the tiny set, their image and audio
read by the core-loader stand-ins (nodes/tools/core_standins.py) from an input folder: each save decodes with the
requested frame count, the held image / audio / overlap come out of the samplers as given."""
from __future__ import annotations

import importlib
import json
import math
import os

import av
import pytest
import torch

import conditioning_checks
from comfyui_harness import write_example_inputs
from nodes.comfy import bridge as comfy_bridge
from nodes.comfy import encode as encode_nodes
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.encode.image_prep import resize_crop
from nodes.ltx.encode.video_encoder import encode_video
from nodes.ltx.files.lora import ReferenceScales
from nodes.tools import core_standins, run, workflow_specs
from nodes.tools.tiny import lora as tiny_lora
from nodes.tools.graph import validate

ROOT = workflow_specs.ROOT
SIZE = {"width": 192, "height": 128, "frames": 17}  # as the t2v templates' tiny runs


@pytest.fixture
def inputs(tmp_path, tiny_models):
    folder = write_example_inputs(str(tmp_path / "input"))  # the first image of another aspect: cropped
    core_standins.set_input_dir(folder)
    comfy_bridge.set_output_dir(str(tmp_path / "out"))
    return folder


def _run(name: str, **overrides) -> tuple[dict, dict]:
    with open(os.path.join(ROOT, "workflows", "api", f"{name}.json"), encoding="utf-8") as f:
        prompt = json.load(f)
    prompt["5"]["inputs"].update({k: v for k, v in SIZE.items() if k not in overrides.get("keep", ())})
    for node_id, values in overrides.get("set", {}).items():
        prompt[node_id]["inputs"].update(values)
    if "until" in overrides:  # only what those nodes need (e.g. one of the A/B decodes)
        needed, todo = set(), list(overrides["until"])
        while todo:
            node_id = todo.pop()
            needed.add(node_id)
            todo += [v[0] for v in prompt[node_id]["inputs"].values() if isinstance(v, list) and v[0] not in needed]
        prompt = {k: v for k, v in prompt.items() if k in needed}
    validate(prompt, workflow_specs.CLASSES)
    return prompt, run.execute(prompt, workflow_specs.CLASSES)


def _saved(prompt: dict, result: dict, frames: int) -> None:
    paths = [result["outputs"][i][0] for i, n in prompt.items() if n["class_type"] == "LTX25SaveVideo"]
    assert paths
    for path in paths:
        with av.open(path) as container:
            assert sum(1 for _ in container.decode(video=0)) == frames and container.streams.audio, path


def _image_latent(result: dict, folder, name: str, width: int, height: int) -> torch.Tensor:
    """The encode of the image as the guide must make it (conditioning_checks: H.264 at CRF 18, cover-and-crop, the
    video encoder)."""
    image = core_standins.LoadImage().load_image(name)[0]
    return conditioning_checks.image_latent(_pack, result["outputs"]["24"][0], image, width, height)


def _pack(name: str):
    return importlib.import_module(f"nodes.{name}")


def _measured(prompt: dict, result: dict) -> dict:
    return conditioning_checks.measure(prompt, lambda node_id: result["outputs"][node_id], _pack)


@pytest.mark.parametrize("name", ["ltx25_i2v_distilled", "ltx25_flf2v_distilled"])
def test_image_templates_hold_the_encoded_first_frame_in_both_stages(inputs, name):
    """Every save has 17 frames (an appended last-frame guide cropped); stage 1's and stage 2's first latent frame is
    the encoded image at that stage's size (96×64, then 192×128)."""
    prompt, result = _run(name)
    _saved(prompt, result, 17)
    first = workflow_specs.EXAMPLE_FILES["first"]
    for node, (w, h) in (("10", (96, 64)), ("12", (192, 128))):
        video = result["outputs"][node][0]["samples"]
        assert video.shape[2] == 3, video.shape
        want = _image_latent(result, inputs, first, w, h)
        assert torch.allclose(video[:, :, :1], want, atol=1e-5), (node, (video[:, :, :1] - want).abs().max())
    held = _measured(prompt, result)  # what the ComfyUI tier reads from ComfyUI's executor says the same here
    assert [(e["sampler"], e["max_abs"] <= 1e-5) for e in held["image"]] == [("10", True), ("12", True)], held


def test_a2v_template_holds_the_given_audio_bit_for_bit(inputs):
    """The audio guide's frames output sets the clip's length (0.6 s → 17 frames at 24 fps); both samplers return
    the given audio's latent bit for bit; the save has 17 frames and the given audio."""
    prompt, result = _run("ltx25_a2v_distilled", keep=("frames",))
    _saved(prompt, result, 17)
    audio = core_standins.LoadAudio().load(workflow_specs.EXAMPLE_FILES["audio"])[0]
    latent = encode_nodes.LTX25EncodeAudio().encode(result["outputs"]["30"][0], audio)[0]["samples"]
    assert result["outputs"]["31"][1] == 17
    for node in ("10", "12"):
        assert torch.equal(result["outputs"][node][1]["samples"][:, :, :latent.shape[2]], latent), node
    held = _measured(prompt, result)
    assert [(e["sampler"], e["equal"], e["frames"]) for e in held["audio"]] == [("10", True, 17), ("12", True, 17)]


def test_extend_template_joins_the_requested_length(inputs):
    """17 source frames extended by 16: the window's overlap is the source's last two latent frames bit for bit,
    the joined latent has 5 frames and the save 33."""
    prompt, result = _run("ltx25_extend", set={"32": {"new_frames": 16}})
    _saved(prompt, result, 33)
    source, window = result["outputs"]["12"][0]["samples"], result["outputs"]["33"][0]["samples"]
    assert torch.equal(window[:, :, :2], source[:, :, 1:])
    joined = result["outputs"]["34"][0]["samples"]
    assert joined.shape[2] == 5 and torch.equal(joined[:, :, :3], source)
    (held,) = _measured(prompt, result)["extend"]
    assert held["overlap_equal"] and held["source_kept"] and held["window_joined"] and held["joined_frames"] == 5


def test_ic_lora_template_conditions_stage_1_on_the_thinned_reference(inputs):
    """The tiny IC-LoRA keeps every 2nd reference frame at full size: the guide's frames output (17) sizes the clip,
    stage 1's reference is the encode of frames 0, 1, 3, …, 15 at stage 1's 96×64 (its provider asked once: stage 2
    runs without it, on the plain transformer), and every save has 17 frames."""
    prompt, result = _run("ltx25_ic_lora", keep=("frames",))
    _saved(prompt, result, 17)
    guides, frames = result["outputs"]["41"]
    assert frames == 17 and prompt["12"]["inputs"]["model"] == ["1", 0] and "guides" not in prompt["12"]["inputs"]
    assert result["outputs"]["12"][0]["frame_rate"] == result["outputs"]["39"][2]  # the control video's rate
    provider = guides.reference[0].latent
    assert list(provider.cache) == [(96, 64, 9)], list(provider.cache)
    video = core_standins.GetVideoComponents().get(core_standins.LoadVideo().load(
        workflow_specs.EXAMPLE_FILES["reference"])[0])[0]
    picked = resize_crop(video[[0, *range(1, 17, 2)]], 96, 64)[None]
    want = encode_video(result["outputs"]["24"][0].module, picked, TilingRequest("off"))
    held = provider.cache[(96, 64, 9)]
    assert torch.allclose(held, want, atol=1e-5), (held - want).abs().max()
    assert result["outputs"]["40"][0].loras == (workflow_specs.IC_LORA_FILE[1],)
    (measured,) = _measured(prompt, result)["reference"]  # the check the ComfyUI tier makes inside ComfyUI
    assert measured["encoded"] == [[96, 64, 9]] and measured["max_abs"] <= 1e-5 * max(1.0, measured["scale"])


def test_ic_lora_stage_2_continues_the_noise_stream_where_stage_1_left_it(inputs, monkeypatch):
    """Stage 1 drew noise for the clip and its appended reference tokens; its video latent hands those counts on
    (through Latent Upsample) and stage 2 skips exactly them, as the reference's one generator runs on."""
    from nodes.ltx import latents
    from nodes.ltx.dit import sampling
    calls, real = [], sampling.initial_noise

    def recording(video, audio, seed, stage, layout="comfy", skip=None):
        calls.append((stage, tuple(video.shape), tuple(audio.shape), skip))
        return real(video, audio, seed, stage, layout, skip)
    monkeypatch.setattr(sampling, "initial_noise", recording)
    prompt, result = _run("ltx25_ic_lora", keep=("frames",), until=("17",))  # stage 2 and the conv save
    (s1, video1, audio1, _), (s2, video2, _, skip) = calls
    drawn = (math.prod(video1), math.prod(audio1))
    assert (s1, s2) == (1, 2) and result["outputs"]["10"][0][latents.NOISE_DRAWN_KEY] == drawn
    half_size_clip = math.prod(video2) // 4
    assert skip == drawn and drawn[0] > half_size_clip, calls  # the reference's latent frames were drawn too
    assert latents.NOISE_DRAWN_KEY not in result["outputs"]["12"][0]  # a stage 2 hands nothing on


def test_ic_lora_template_runs_a_half_size_reference(inputs, tiny_models):
    """An IC-LoRA trained on half-size references (reference_downscale_factor 2) in the same template at 384×256:
    stage 1's reference is encoded at 96×64, a quarter of stage 1's cells, and the conv save (the graph run for it
    alone) has 17 frames: the reference's tokens, of another grid than the clip's, cropped."""
    name = "tiny-ic-lora-half-size.safetensors"
    tiny_lora.write_tiny_ic_lora(os.path.join(tiny_models, "loras", name), "v2v", seed=2)
    prompt, result = _run("ltx25_ic_lora", keep=("frames",), until=("17",),
                          set={"5": {"width": 384, "height": 256}, "40": {"lora_file": name}})
    _saved(prompt, result, 17)
    assert result["outputs"]["40"][0].reference == ReferenceScales(2, 1)
    assert list(result["outputs"]["41"][0].reference[0].latent.cache) == [(96, 64, 17)]
    assert result["outputs"]["12"][0]["samples"].shape == (1, 128, 3, 8, 12)
