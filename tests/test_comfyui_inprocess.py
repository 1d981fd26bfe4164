"""The pack's API workflows through ComfyUI's own `execution.validate_prompt` + `PromptExecutor.execute`, in one
ComfyUI process without a server (tests/comfyui_inprocess_driver.py, run with COMFYUI_PYTHON).

Runs only when COMFYUI_PATH names a ComfyUI checkout; skipped otherwise. See docs/COMFYUI_TESTS.md.
"""
from __future__ import annotations

import json
import os

import pytest

import comfyui_harness as h
from comfyui_harness import CONDITIONING_TEMPLATES, EXPECTED_NODES, RUN_TEMPLATES

pytestmark = h.requires_comfyui

# Loaders whose model computes in every shipped graph that has them (at least one video VAE decodes; another may
# serve only its latent statistics; a2v plays the given audio, so it has no audio VAE).
ALWAYS_COMPUTING = ("LTX25TransformerLoader", "LTX25VideoVAELoader", "LTX25AudioVAELoader", "LTX25UpsamplerLoader",
                    "LTX25VideoEncoderLoader", "LTX25AudioEncoderLoader")
# What each conditioning template's samplers must hold (tests/conditioning_checks.py), as many pairs of (sampler,
# guide) as it has: both stages hold the first frame (i2v, first–last frame: the last frame is appended and cropped)
# or the audio (a2v); the extension window holds its overlap.
HELD = {"ltx25_i2v_distilled": {"image": 2}, "ltx25_flf2v_distilled": {"image": 2},
        "ltx25_a2v_distilled": {"audio": 2}, "ltx25_extend": {"extend": 1}, "ltx25_ic_lora": {"reference": 1}}


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_models) -> dict:
    """One driver run over every API workflow on the session's tiny set."""
    h.comfyui_path()
    names = sorted(RUN_TEMPLATES)
    paths = [os.path.join(h.PACK_ROOT, "workflows", "api", f"{n}.json") for n in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    assert not missing, f"missing API workflows: {missing}"
    return h.run_inprocess_driver(str(tmp_path_factory.mktemp("comfyui_inprocess")), tiny_models, paths)


def _executed(report: dict, name: str) -> dict:
    entry = _workflow(report, name)
    assert entry["success"], f"{name}: the run failed (see the executor test above); its observations are partial"
    return entry


def _workflow(report: dict, name: str) -> dict:
    entry = report["workflows"][name]
    assert "exception" not in entry, f"{name}: the driver raised:\n{entry['exception']}"
    assert entry["valid"], f"{name}: {json.dumps(entry['validation_error'])} {json.dumps(entry['node_errors'])}"
    return entry


def test_pack_loads_through_comfyuis_custom_node_loader_without_shadowing_its_nodes_module(report):
    """`nodes.load_custom_node` imports the pack from its custom_nodes link and registers all 15 nodes, while
    `nodes` stays ComfyUI's own module. Fails when the pack imports itself by absolute name (`import nodes...`),
    which would resolve to ComfyUI's nodes.py inside ComfyUI."""
    assert report["pack_loaded"] is True, report["log"]
    assert report["pack_nodes"] == sorted(EXPECTED_NODES), report["pack_nodes"]
    assert report["comfy_nodes_module"] == os.path.join(h.comfyui_path(), "nodes.py")


@pytest.mark.parametrize("name", RUN_TEMPLATES)
def test_workflow_validates_and_executes_successfully_in_prompt_executor(report, name):
    """ComfyUI's validate_prompt accepts the graph and PromptExecutor runs it to execution_success, with each
    save node reporting its files. Fails on any error the real executor raises inside a pack node."""
    entry = _workflow(report, name)
    errors = [m for m in entry["messages"] if m[0] != "execution_start" and m[0] != "execution_success"]
    assert entry["success"] and [m[0] for m in entry["messages"]][-1] == "execution_success", \
        f"{name}: {json.dumps(errors)[:4000]}"
    saved = [h.ui_files(ui) for ui in entry["ui"].values()]
    assert any(saved), f"{name}: no output node reported a file: {entry['ui']}"
    for files in saved:
        for item in files:
            path = os.path.join(report["out_dir"], item.get("subfolder", ""), item["filename"])
            assert item["type"] != "output" or os.path.getsize(path) > 0, path
            if path.endswith(".mp4"):
                assert h.mp4_frames(path) == (h.clip_frames(report["prompts"][name]), True), path


@pytest.mark.parametrize("name", RUN_TEMPLATES)
def test_pack_nodes_run_in_inference_mode_inside_the_executor(report, name):
    """Inside every pack node call, inference mode is on and grad is off, and every tensor the pack nodes hand
    to the executor (latents, images, audio) is an inference tensor. Fails when a node moves work to another
    thread (inference mode is thread-local) or re-enables grad, leaking autograd graphs and memory."""
    entry = _executed(report, name)
    calls = entry["node_calls"]
    assert {c["class_type"] for c in calls} >= {"LTX25EmptyLatent", "LTX25DistilledSampler", "LTX25SaveVideo"}, \
        f"{name}: pack node calls seen: {sorted({c['class_type'] for c in calls})}"
    off = [c for c in calls if not c["inference_mode"] or c["grad_enabled"]]
    assert not off, f"{name}: nodes called outside inference mode: {off}"
    saves = [c for c in calls if c["class_type"] == "LTX25SaveVideo"]
    assert all(c["async"] and "seconds" in c for c in saves), f"{name}: saves not run to the end as tasks: {saves}"
    tensors = entry["tensors"]
    assert any(t["class_type"] == "LTX25EmptyLatent" for t in tensors), f"{name}: no latent tensor observed"
    leaked = [t for t in tensors if not t["is_inference"] or t["requires_grad"]]
    assert not leaked, f"{name}: non-inference tensors in node outputs: {leaked[:10]}"


@pytest.mark.parametrize("name", RUN_TEMPLATES)
def test_comfyui_decodes_the_audio_before_the_video(report, name):
    """ComfyUI's executor runs a ready async node first, so the audio decode (a coroutine for that reason) runs
    before every video decode of its clip, whatever order ComfyUI's hash-ordered set of outputs gives the rest:
    each save, which takes the audio, can then start as soon as its frames are decoded. Fails if the audio decode
    becomes a plain function: the driver hands the outputs over in node-id order, which lists the A/B graph's
    compare first, and then ComfyUI's fallback order reaches both decoders before the audio."""
    kinds = [c["class_type"] for c in _executed(report, name)["node_calls"]]  # in the order the calls started
    audio = [i for i, kind in enumerate(kinds) if kind == "LTX25AudioDecode"]
    video = [i for i, kind in enumerate(kinds) if kind.endswith("VAEDecode")]
    assert video and (audio or name == "ltx25_a2v_distilled"), f"{name}: decodes that ran: {kinds}"
    assert all(a < v for a in audio for v in video), f"{name}: {kinds}"


@pytest.mark.parametrize("name", RUN_TEMPLATES)
def test_every_model_that_computes_was_loaded_by_comfy_model_management(report, name):
    """Each model handle a loader returns carries a real `comfy.model_patcher.ModelPatcher`, and every one whose
    module ran a forward pass during the run went through ComfyUI's `load_models_gpu` (so ComfyUI can place,
    offload and evict it); models stay registered in `current_loaded_models` afterwards. A handle used only for
    its metadata (a VAE's latent statistics) need not be loaded. Fails when a node runs a model it moved with
    `.to(device)` behind model management's back, or the bridge falls back to its standalone patcher."""
    entry = _executed(report, name)
    handles = entry["handles"]
    computed = {x["class_type"] for x in handles if x["ran_forward"]}
    present = {x["class_type"] for x in handles}
    assert computed >= set(ALWAYS_COMPUTING) & present, f"{name}: models that ran: {sorted(computed)}"
    not_patchers = [x for x in handles if not x["is_model_patcher"]]
    assert not not_patchers, f"{name}: handles without a ComfyUI ModelPatcher: {not_patchers}"
    bypassed = [x for x in handles if x["ran_forward"] and not x["loaded_by_load_models_gpu"]]
    assert not bypassed, f"{name}: ran without load_models_gpu: {bypassed}; loaded: {entry['load_models_gpu']}"
    assert entry["loaded_models_after"] > 0, f"{name}: current_loaded_models is empty after the run"


def test_the_released_text_encoder_is_freed_not_copied_to_the_host(report):
    """Encode Prompt drops Gemma after its encode: model management unloads it to the meta device, not to its
    offload device, where `model.to(offload_device)` copied every weight on the card (24 GiB) into new host memory
    only for it to be freed. Fails with `discard_model` unloading as `unload_model` does (the weights stay on the
    CPU here, where --cpu makes the offload device the load device)."""
    assert report["text_encoders_loaded"] > 0, "no workflow loaded the text encoder: nothing was checked"
    assert report["text_encoder_weights_after"] == ["meta"], report["text_encoder_weights_after"]


@pytest.mark.parametrize("name", CONDITIONING_TEMPLATES)
def test_conditioning_templates_hold_their_guides_inside_comfyui(report, name):
    """With core Load Image / Load Audio reading the example files from ComfyUI's input folder, each sampler holds
    what its guides give, as tests/test_guide_workflows.py checks headless: the first latent frame of both stages is
    the image encoded at that stage's size (96×64, then 192×128), the audio latents are the given audio's bit for
    bit (and the audio guide's frames output is the clip's 17 frames), the extension window's overlap is the source's
    last latent frames and the join is the source then the window's new frames, and the IC-LoRA's reference is the
    encode of the frames it must keep at stage 1's size (its tokens reaching the DiT: test_reference_video.py,
    headless). Fails when a guide does not reach a
    sampler inside ComfyUI's executor, or ComfyUI's own image or audio loading feeds the guides something else."""
    held = _executed(report, name)["conditioning"]
    shipped = h.load_json(os.path.join(h.PACK_ROOT, "workflows", "api", f"{name}.json"))
    links = {(i, k): v for i, n in shipped.items() for k, v in n["inputs"].items() if isinstance(v, list)}
    assert {(i, k): report["prompts"][name][i]["inputs"][k] for i, k in links} == links, "sizing cut a link"
    assert {kind: len(entries) for kind, entries in held.items() if entries} == HELD[name], held
    for entry in held["image"]:
        assert entry["shape"][2:] in ([3, 2, 3], [3, 4, 6]), entry  # 17 frames at stage 1's and stage 2's size
        assert entry["scale"] > 0 and entry["max_abs"] <= 1e-5 * max(1.0, entry["scale"]), entry
    assert sorted(e["shape"][3] for e in held["image"]) == ([2, 4] if held["image"] else []), held
    for entry in held["audio"]:
        assert entry["equal"] and entry["latents"] > 0 and entry["frames"] == h.SMALL_CLIP["frames"], entry
    for entry in held["extend"]:
        assert entry["overlap_equal"] and entry["source_kept"] and entry["window_joined"], entry
        assert entry["joined_frames"] == entry["source_frames"] + entry["window_frames"] - entry["overlap"] == 5, entry
    for entry in held["reference"]:  # the tiny IC-LoRA: every 2nd frame at stage 1's full 96×64
        assert entry["encoded"] == [[96, 64, 9]] and entry["picked"] == 9, entry
        assert entry["max_abs"] <= 1e-5 * max(1.0, entry["scale"]), entry
