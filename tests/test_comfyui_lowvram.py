"""ComfyUI's low-VRAM states with the pack's models (tests/comfyui_lowvram_driver.py, run with COMFYUI_PYTHON): the
A/B graph through ComfyUI's own executor and model management under `--cpu` (the reference: every model loaded
whole), then under NORMAL_VRAM, `--lowvram`, `--novram` and `--reserve-vram` on a simulated card (the driver's
docstring says how), where ComfyUI loads the transformer and the text encoder partially and the bridge streams the
rest; every output equals the reference bit for bit. Runs only when COMFYUI_PATH names a ComfyUI checkout; see
docs/COMFYUI_TESTS.md."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import comfyui_harness as h

pytestmark = h.requires_comfyui

MIB = 2**20
WORKFLOW = "ltx25_t2v_distilled_decoder_ab"
STREAMABLE = ("LTX25Transformer", "TextEncoderModule")  # the tiny set's: 1.1 MB with 2 blocks, 0.5 MB with 6 layers
ROOMY, TIGHT = 32 * MIB, 256 * 1024  # a card's room for weights beside ComfyUI's minimum inference memory
DEFAULT_RESERVE_GIB = 400 / 1024     # ComfyUI's EXTRA_RESERVED_VRAM on Linux
MODES = [
    {"name": "reference", "state": None},
    {"name": "normal", "state": "NORMAL_VRAM", "weight_bytes": ROOMY},
    {"name": "lowvram", "state": "LOW_VRAM", "weight_bytes": TIGHT},
    {"name": "novram", "state": "NO_VRAM", "weight_bytes": ROOMY},
    # the roomy card, with --reserve-vram keeping all but 512 KiB of its room
    {"name": "reserve_vram", "state": "NORMAL_VRAM", "weight_bytes": ROOMY,
     "reserve_gib": DEFAULT_RESERVE_GIB + (ROOMY - 512 * 1024) / 2**30},
    {"name": "lowvram_preview_evicts", "state": "LOW_VRAM", "weight_bytes": TIGHT, "preview_evicts": True},
]
SIMULATED = [m["name"] for m in MODES if m["state"] is not None]


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_models, tiny_file) -> dict:
    """One driver run: every mode on the A/B graph (sized as the tier's SMALL_CLIP), then the streamed-LoRA case."""
    from nodes.tools.tiny.lora import write_tiny_lora
    work = tmp_path_factory.mktemp("comfyui_lowvram")
    custom_nodes = h.make_custom_nodes_dir(str(work))
    workflow = work / f"{WORKFLOW}.json"
    workflow.write_text(json.dumps(h.small_clip(h.load_json(os.path.join(h.PACK_ROOT, "workflows", "api",
                                                                           f"{WORKFLOW}.json")))))
    lora = {"transformer": tiny_file("transformer"), "weight_bytes": TIGHT,
            "lora": write_tiny_lora(str(work / "lora.safetensors"), "kohya", 2, 4, 2.0)}
    report_path = work / "report.json"
    cmd = [h.comfyui_python(), os.path.join(h.PACK_ROOT, "tests", "comfyui_lowvram_driver.py"),
           "--comfyui", h.comfyui_path(), "--pack", os.path.join(custom_nodes, h.PACK_FOLDER),
           "--models", tiny_models, "--out", str(work / "output"), "--report", str(report_path),
           "--modes", json.dumps(MODES), "--lora", json.dumps(lora), str(workflow)]
    result = subprocess.run(cmd, cwd=str(work), env=h.child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and report_path.exists(), (result.stdout + result.stderr)[-6000:]
    return json.loads(report_path.read_text())


def _run(report: dict, mode: str) -> dict:
    entry = report["modes"][mode]["workflows"][WORKFLOW]
    assert "exception" not in entry, f"{mode}: the driver raised:\n{entry['exception']}"
    assert entry.get("valid", True), f"{mode}: {entry}"
    assert entry["success"], f"{mode}: {json.dumps(entry['errors'])[:4000]}"
    return entry


def _loads(entry: dict, model: str) -> list[dict]:
    """ComfyUI's ModelPatcher.load calls on one of the pack's models: budget, full load, bytes it loaded."""
    return [e for e in entry["events"] if e["event"] == "load" and e["model"] == model]


def test_reference_runs_every_model_whole_under_cpu(report):
    """The `--cpu` reference: model management loads every model whole (DISABLED), nothing streams, and the graph
    yields its frames, audio and latents. Fails if the reference itself is not the plain full load."""
    entry = _run(report, "reference")
    assert report["modes"]["reference"]["vram_state"] == "DISABLED"
    assert entry["digests"] and not entry["bytes_streamed"]
    assert all(load["streamed_blocks"] == 0 and load["units_on_host"] == 0 for load in entry["loads"]), entry["loads"]


@pytest.mark.parametrize("mode", SIMULATED)
def test_outputs_equal_the_full_load_bit_for_bit(report, mode):
    """Every tensor every pack node returned (latents of both stages, the upsampled latent, both decoders' frames,
    the side-by-side, the audio) has the reference's bytes. Fails when a partial load, a streamed block, a model
    loaded whole beside a partial load or a reload after eviction computes with anything but the file's weights."""
    want, got = _run(report, "reference")["digests"], _run(report, mode)["digests"]
    assert got.keys() == want.keys()
    differing = [label for label in want if got[label] != want[label]]
    assert not differing, f"{mode}: outputs differ from the full load: {differing}"


@pytest.mark.parametrize("mode", SIMULATED)
def test_only_layers_inside_blocks_are_left_in_host_memory(report, mode):
    """After each load, every layer model management left on the host outside the streamable blocks (the
    transformer's connectors and embeddings, Gemma's embedding table, any VAE layer) has been loaded by the bridge:
    only block layers, which stream, stay in host memory. Fails when a layer left behind would run from the host."""
    loads = _run(report, mode)["loads"]
    assert loads and all(load["on_host_outside_blocks"] == 0 for load in loads), loads


@pytest.mark.parametrize("mode", SIMULATED)
def test_every_forward_runs_on_the_placement_model_management_made(report, mode):
    """Whenever a module of a pack model runs, model management has that model loaded and the bridge has settled that
    very placement (its record of ComfyUI's placement is current). Fails when a model runs after ComfyUI moved it
    (a partial unload or an unload) without being loaded and settled again: on a GPU that forward would read
    weights ComfyUI moved to the host, or a stale streaming plan."""
    assert _run(report, mode)["forwards_off_placement"] == []


def test_normal_vram_with_room_loads_every_model_whole(report):
    """NORMAL_VRAM on a card with room: ComfyUI's partially_load finds the budget larger than each model and loads
    it whole; nothing streams and the loads ask for the working memory alone (no slots). Fails when the bridge
    streams or reserves slots although everything fits."""
    entry = _run(report, "normal")
    for model in STREAMABLE:
        assert _loads(entry, model) and all(e["full_load"] and e["loaded_by_comfy"] == e["size"]
                                            for e in _loads(entry, model)), _loads(entry, model)
    assert not entry["bytes_streamed"]
    assert all(load["asked"] == load["memory_required"] for load in entry["loads"]), entry["loads"]


@pytest.mark.parametrize("mode", ["lowvram", "reserve_vram"])
def test_low_vram_loads_the_big_models_partially_and_streams_the_rest(report, mode):
    """`--lowvram` on a tight card, and `--reserve-vram` on the roomy card of the normal run: ComfyUI loads the
    transformer and the text encoder partially (0 < loaded < size), the layers it left stream through the device in
    every forward (bytes copied), and each such load asked model management for the working memory plus what the
    model holds beside ComfyUI's budget for its weights (the two streaming slots, the weights outside the blocks).
    Fails when the bridge forces full loads, leaves the layers ComfyUI left unused, or plans no room for the slots
    or the weights it keeps resident."""
    entry = _run(report, mode)
    for model in STREAMABLE:
        partial = [e for e in _loads(entry, model) if 0 < e["loaded_by_comfy"] < e["size"] and not e["full_load"]]
        assert partial, f"{mode}: {model} never loaded partially: {_loads(entry, model)}"
        streamed = [load for load in entry["loads"] if load["model"] == model and load["streamed_blocks"]]
        assert streamed and entry["bytes_streamed"].get(model, 0) > 0, f"{mode}: {model}: {entry['loads']}"
        # the working memory, the two slots and the weights outside the blocks (kept on the device by the bridge)
        assert all(load["asked"] == load["memory_required"] + load["held_beside_budget"] for load in streamed), streamed
    if mode == "reserve_vram":
        normal, reserve = report["modes"]["normal"], report["modes"]["reserve_vram"]
        assert reserve["card_bytes"] == normal["card_bytes"] and reserve["extra_reserved"] > normal["extra_reserved"]


def test_novram_streams_every_block_and_loads_the_rest_whole(report):
    """`--novram`: ComfyUI loads nothing (its budget is 0.1 bytes); every block of the transformer and the text
    encoder streams, everything outside the blocks is put on the device by the bridge, and the models without blocks
    (VAEs, upsampler) run loaded whole. Fails when a block stays unused on the host, or a layer outside the blocks
    or a VAE runs from the host."""
    entry = _run(report, "novram")
    for model in STREAMABLE:
        assert _loads(entry, model) and all(e["loaded_by_comfy"] == 0 for e in _loads(entry, model))
        for load in (load for load in entry["loads"] if load["model"] == model):
            assert load["streamed_blocks"] == load["blocks"] > 0, load
            assert load["units_on_host"] == load["block_units"], load  # every layer outside the blocks is loaded
    others = [load for load in entry["loads"] if load["model"] not in STREAMABLE]
    assert others and all(load["units_on_host"] == 0 and load["blocks"] == 0 for load in others), others


def test_models_without_blocks_are_loaded_whole_by_comfyui_under_lowvram(report):
    """On the tight card ComfyUI itself loads the VAEs and the upsampler whole (force_full_load, evicting the
    others), as core loads its VAEs: they cannot stream. Fails when they go through a partial load."""
    entry = _run(report, "lowvram")
    others = [e for e in entry["events"] if e["event"] == "load" and e["model"] not in STREAMABLE]
    assert {e["model"] for e in others} >= {"LTX2LatentUpsamplerModel", "ConvVideoVAE", "DiffusionVAE", "AudioVAE"}
    assert all(e["full_load"] and e["loaded_by_comfy"] == e["size"] for e in others), others


def test_models_evicted_by_a_preview_mid_run_are_loaded_again_before_the_next_step(report):
    """A previewer whose model load makes model management free memory between steps (half of it, then all): the
    transformer is partially unloaded and detached mid-sampling, loaded and settled again before its next forward,
    and the outputs stay bit-identical. Fails when the bridge lets the sampler run on after the eviction."""
    entry = _run(report, "lowvram_preview_evicts")
    kinds = [(e["event"], e.get("model")) for e in entry["events"]]
    assert ("preview frees", None) in kinds
    assert ("partially_unload", "LTX25Transformer") in kinds and ("detach", "LTX25Transformer") in kinds, kinds
    assert entry["forwards_off_placement"] == []


def test_streamed_lora_layers_get_the_patch_on_each_device_copy(report):
    """A LoRA'd tiny transformer (float32): on the tight card its LoRA'd layers stream — with the LoRA applied on the
    fly from its factors (the pack's default for LoRAs, `streamed_patches` 0), or with ComfyUI's own LoRA patch on
    each device copy for merged weight patches (core's lowvram patch); the x0 equals the whole-load x0 far within the
    LoRA's own effect, and unloading leaves every weight as read from the file (the host copies were never patched).
    Fails when streamed layers run without the LoRA or the patch is baked into the host copy."""
    lora = report["lora"]
    assert "exception" not in lora, lora.get("exception")
    assert lora["streamed_blocks"] > 0 and lora["lora_effect"] > 1e-4, lora
    assert lora["streamed_vs_resident"] <= 0.01 * lora["lora_effect"], lora
    assert lora["restored"], lora
