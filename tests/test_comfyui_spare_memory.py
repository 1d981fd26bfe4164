"""The memory a decode gets beside the loaded models without evicting them (`bridge.spare_device_memory`, in ComfyUI
the bridge's `_comfy_spare`), checked against ComfyUI's own `load_models_gpu` on the low-VRAM driver's simulated card
(tests/comfyui_spare_driver.py, run with COMFYUI_PYTHON): a load asking for the spare memory evicts nothing and one
asking a few KiB more does; nothing is spare where every load evicts; on the CPU nothing is ever evicted. Then the
conv decode node, after sampling on a card where its untiled decode does not fit beside the transformer, tiles beside
it instead of evicting it. Runs only when COMFYUI_PATH names a ComfyUI checkout; see docs/COMFYUI_TESTS.md."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import comfyui_harness as h

pytestmark = h.requires_comfyui

MIB = 2**20
WORKFLOW = "ltx25_t2v_distilled_conv"
# One stage at 1024×1024, 17 frames: the tiny conv VAE's untiled decode (fp32) needs 1020 MiB, more than the spare
# memory beside the transformer on the driver's roomy card (ComfyUI's 0.8 GiB floor and a MiB), while auto tiles
# doing 1.13 times its work fit in that.
CLIP = {"width": 1024, "height": 1024, "frames": 17, "two_stage": False}
GRAPH = ("LTX25TransformerLoader", "LTX25TextEncoderLoader", "LTX25EncodePrompt", "LTX25Connector", "LTX25EmptyLatent",
         "LTX25VideoVAELoader", "LTX25DistilledSampler", "LTX25ConvVAEDecode")
HOST_FREE = 64 * 2**30  # the driver's host memory for the `--cpu` case
TRANSFORMER, VAE = "LTX25Transformer", "ConvVideoVAE"


def sample_and_decode(prompt: dict) -> dict:
    """The shipped conv graph cut to stage 1 at CLIP and its conv decode (fp32 weights), with core's Preview Any on
    the decode's stats as the output node."""
    graph = {node_id: node for node_id, node in prompt.items() if node["class_type"] in GRAPH
             and node["inputs"].get("stage", "1") == "1"}
    by_class = {node["class_type"]: node_id for node_id, node in graph.items()}
    graph[by_class["LTX25EmptyLatent"]]["inputs"].update(CLIP)
    for loader in ("LTX25TransformerLoader", "LTX25VideoVAELoader"):
        graph[by_class[loader]]["inputs"]["weight_dtype"] = "fp32"
    decode = by_class["LTX25ConvVAEDecode"]
    graph[decode]["inputs"]["latent"] = [by_class["LTX25DistilledSampler"], 0]
    graph["preview"] = {"class_type": "PreviewAny", "inputs": {"source": [decode, 1]}}
    return graph


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_models) -> dict:
    work = tmp_path_factory.mktemp("comfyui_spare")
    custom_nodes = h.make_custom_nodes_dir(str(work))
    workflow = work / f"{WORKFLOW}.json"
    workflow.write_text(json.dumps(sample_and_decode(h.load_json(os.path.join(h.PACK_ROOT, "workflows", "api",
                                                                                f"{WORKFLOW}.json")))))
    report_path = work / "report.json"
    cmd = [h.comfyui_python(), os.path.join(h.PACK_ROOT, "tests", "comfyui_spare_driver.py"),
           "--comfyui", h.comfyui_path(), "--pack", os.path.join(custom_nodes, h.PACK_FOLDER),
           "--models", tiny_models, "--out", str(work / "output"), "--report", str(report_path), str(workflow)]
    result = subprocess.run(cmd, cwd=str(work), env=h.child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and report_path.exists(), (result.stdout + result.stderr)[-6000:]
    return json.loads(report_path.read_text())


def _case(report: dict, name: str) -> dict:
    case = report["cases"][name]
    assert "exception" not in case, f"{name}: the driver raised:\n{case['exception']}"
    return case


def _load(case: dict, ask: str) -> dict:
    return next(load for load in case["loads"] if load["ask"] == ask)


def test_a_load_asking_the_spare_memory_evicts_nothing_and_a_few_kib_more_evicts(report):
    """The transformer loaded whole on a card with a MiB more than it, 1.1 × the VAE and ComfyUI's minimum inference
    memory: loading the VAE with the spare memory as its working memory leaves the transformer in
    `current_loaded_models` with every byte loaded, and asking 4 KiB more makes model management unload part of it.
    Fails when `_comfy_spare` overstates the room (the 1.1 factor or the reserve dropped: the first load evicts) or
    understates it by more than 4 KiB (the second load evicts nothing)."""
    case, size = _case(report, "roomy"), report["sizes"]["transformer"]
    at_spare, above = _load(case, "spare"), _load(case, "above")
    assert case["spare"] > 0 and at_spare["before"][TRANSFORMER] == size, case
    assert at_spare["after"].get(TRANSFORMER) == size, f"the spare memory evicted: {at_spare}"
    assert at_spare["after"][VAE] == report["sizes"]["vae"], at_spare
    assert above["after"].get(TRANSFORMER, 0) < size, f"4 KiB more than the spare memory evicted nothing: {above}"


def test_nothing_is_spare_when_the_vae_does_not_fit_beside_the_minimum_inference_memory(report):
    """Room for the transformer and half the VAE: ComfyUI frees memory for 1.1 × the VAE plus its minimum inference
    memory whatever the request, so even a load asking for nothing evicts, and the spare memory is 0. Fails when
    `_comfy_spare` drops that floor (it would report the 0.8 GiB below it as spare)."""
    case, size = _case(report, "tight"), report["sizes"]["transformer"]
    load = _load(case, "spare")
    assert case["spare"] == 0, case
    assert load["memory_required"] == 0 and load["before"][TRANSFORMER] == size, load
    assert load["after"].get(TRANSFORMER, 0) < size, f"a load asking for nothing kept the transformer: {load}"


def test_nothing_is_spare_under_disable_smart_memory(report):
    """`--disable-smart-memory` (DISABLE_SMART_MEMORY): model management unloads every other model for each load, so
    on the card where 0.8 GiB are spare otherwise, the spare memory is 0 and the VAE's load evicts the transformer.
    Fails when `_comfy_spare` ignores the flag."""
    case = _case(report, "disable_smart_memory")
    assert _case(report, "roomy")["spare"] > 0 and case["spare"] == 0, case
    load = _load(case, "spare")
    assert TRANSFORMER in load["before"] and TRANSFORMER not in load["after"], load


def test_on_the_cpu_all_free_memory_is_spare(report):
    """Under `--cpu` the models compute where they rest: `load_models_gpu` frees nothing for the CPU, so the spare
    memory is all the host memory free (the driver reports 64 GiB) and a load asking a GiB more than that leaves the
    transformer loaded. Fails when `_comfy_spare` applies the card's rule (weights ×1.1, reserve, minimum) there."""
    case, size = _case(report, "cpu"), report["sizes"]["transformer"]
    assert case["device"] == "cpu" and case["spare"] == HOST_FREE, case
    load = _load(case, "far")
    assert load["memory_required"] > HOST_FREE and load["after"].get(TRANSFORMER) == size, load


def _decode(report: dict) -> dict:
    decode = report["decode"]
    assert "exception" not in decode, f"the graph run raised:\n{decode['exception']}"
    return decode


def test_conv_decode_tiles_beside_the_sampled_transformer_instead_of_evicting_it(report):
    """After sampling on the roomy card the untiled decode needs more than the spare memory, so asking for it would
    evict the transformer; the node asks for tiles that fit in the spare memory instead, and model management keeps
    the transformer loaded with the same bytes across the VAE's load and after the run. Fails when the decode asks
    for the untiled memory (`ready_to_decode`, `working_memory_request`) or `_comfy_spare` overstates the room."""
    decode = _decode(report)
    load, size = decode["vae_load"], report["sizes"]["transformer"]
    assert decode["untiled"] > decode["spare"] > 0, decode
    assert decode["transformer_loads"] and load["before"].get(TRANSFORMER) == size, decode
    assert load["memory_required"] <= decode["spare"], f"the decode asked for more than the spare memory: {load}"
    assert load["after"].get(TRANSFORMER) == size and decode["held_after"].get(TRANSFORMER) == size, decode
    assert decode["tile_count"] > 1 and decode["planned"] <= decode["spare"], decode


def test_conv_decode_beside_the_transformer_gives_the_engines_frames_for_its_tiles(report):
    """The frames the node decoded beside the transformer equal, bit for bit, the engine's `decode_conv` of the same
    latent planned within the same spare memory on the plain CPU (the same tiles). A tiled decode is not the untiled
    one: on the tiny VAE's random weights the tile borders differ from it everywhere. Fails when the VAE placed by
    model management beside the transformer computes with anything but the file's weights, or the node plans its
    tiles within other memory than the spare memory it asked for."""
    decode = _decode(report)
    assert decode["tile_count"] == decode["reference_tile_count"], decode
    assert decode["frames"] == decode["reference_frames"], f"max |difference| {decode['max_difference']:.3g}"
