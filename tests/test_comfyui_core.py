"""The pack's files and latents beside core ComfyUI's own LTXV nodes, in one ComfyUI process without a server
(tests/comfyui_inprocess_driver.py, run with COMFYUI_PYTHON):

- core's loaders load each tiny file, as a user mixing core and pack nodes would load the official ones;
- core's Empty LTXV latents feed the pack's sampler, and core's joint audio+video latent the pack's decoders,
  through ComfyUI's own validate_prompt and PromptExecutor;
- the pack's video and audio encoders give core's VAE Encode / LTXV Audio VAE Encode latents on the tiny files.

Runs only when COMFYUI_PATH names a ComfyUI checkout; skipped otherwise. See docs/COMFYUI_TESTS.md.
"""
from __future__ import annotations

import json
import os

import pytest

import comfyui_harness as h

pytestmark = h.requires_comfyui

CORE_GRAPH = "core_latents_into_pack_nodes"
# case → (tiny component, models folder, what core's loader must hold). The text encoder is left out: core's
# LTXAV text-encoder loader builds the 12B Gemma from constants (comfy/text_encoders/lt.py), not from the file's
# config, so the tiny encoder cannot load there and only a real 12B file would.
CORE_CASES = {
    "transformer": ("transformer", "diffusion_models", "LTXAV"),
    "conv_vae": ("conv_vae", "vae", "VideoVAE"),
    "diffusion_vae": ("diffusion_vae", "vae", "CausalDiffusionVAE"),
    "audio_vae": ("audio_vae", "vae", "AudioVAE"),
    "audio_vae_ltxv_loader": ("audio_vae", "checkpoints", "AudioVAE"),
    "upsampler": ("upsampler", "latent_upscale_models", "LatentUpsampler"),
}


# the files whose encoder core and the pack both run (tests/comfyui_inprocess_driver.py, ENCODE_CASES)
ENCODE_CASES = ("conv_vae", "diffusion_vae", "audio_vae")


def _core_graph(names: dict[str, str]) -> dict:
    """The shipped conv workflow with its Empty Latent replaced by core's Empty LTXV Latent Video and LTXV Empty
    Latent Audio (which read the audio VAE that core's VAELoader loads), and both decoders fed core's Concat AV
    Latent of the stage-2 pair. Sized like SMALL_CLIP: stage 1 at 96×64, 17 frames at 24 fps."""
    prompt = h.load_json(os.path.join(h.PACK_ROOT, "workflows", "api", "ltx25_t2v_distilled_conv.json"))
    empty = next(nid for nid, node in prompt.items() if node["class_type"] == "LTX25EmptyLatent")
    fps = float(prompt[empty]["inputs"].get("fps", 24.0))
    del prompt[empty]
    prompt["90"] = {"class_type": "VAELoader", "inputs": {"vae_name": names["audio_vae"]}}
    prompt["91"] = {"class_type": "EmptyLTXVLatentVideo",
                    "inputs": {"width": h.SMALL_CLIP["width"] // 2, "height": h.SMALL_CLIP["height"] // 2,
                               "length": h.SMALL_CLIP["frames"], "batch_size": 1}}
    prompt["92"] = {"class_type": "LTXVEmptyLatentAudio",
                    "inputs": {"frames_number": h.SMALL_CLIP["frames"], "frame_rate": fps, "batch_size": 1,
                               "audio_vae": ["90", 0]}}
    samplers = sorted((nid for nid, node in prompt.items() if node["class_type"] == "LTX25DistilledSampler"),
                      key=lambda nid: prompt[nid]["inputs"]["stage"])
    stage1, stage2 = samplers
    prompt[stage1]["inputs"].update(video_latent=["91", 0], audio_latent=["92", 0], frame_rate=fps)
    prompt["93"] = {"class_type": "LTXVConcatAVLatent",
                    "inputs": {"video_latent": [stage2, 0], "audio_latent": [stage2, 1]}}
    for node in prompt.values():
        if node["class_type"] == "LTX25ConvVAEDecode":
            node["inputs"]["latent"] = ["93", 0]
        elif node["class_type"] == "LTX25AudioDecode":
            node["inputs"]["audio_latent"] = ["93", 0]
        elif node["class_type"] == "LTX25SaveVideo":
            node["inputs"]["filename_prefix"] = "core_latents"
    return prompt


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_models) -> dict:
    """One driver run: core's loaders on the tiny files, then the core-latents graph."""
    h.comfyui_path()
    from nodes.tools.tiny import tiny_paths
    names = {component: os.path.basename(path) for component, path in tiny_paths(tiny_models).items()}
    work = str(tmp_path_factory.mktemp("comfyui_core"))
    graph = os.path.join(work, f"{CORE_GRAPH}.json")
    with open(graph, "w", encoding="utf-8") as f:
        json.dump(_core_graph(names), f)
    loaders = {case: (folder, names[component]) for case, (component, folder, _inner) in CORE_CASES.items()}
    encodes = {case: names[case] for case in ENCODE_CASES}
    return h.run_inprocess_driver(work, tiny_models, [graph], resize=False, core_loaders=loaders,
                                  encode_compare=encodes)


@pytest.mark.parametrize("case", list(CORE_CASES))
def test_core_loader_loads_the_tiny_file(report, case):
    """Core's own loader for the file's kind (UNETLoader, VAELoader, Load LTXV Audio VAE, Load Latent Upscale
    Model) loads the tiny file and holds the model core builds for it. Fails when a tiny file's keys or metadata
    stop matching the official layout that core reads, so a core user could not load the pack's files."""
    entry = report["core_loaders"][case]
    assert entry["ok"], f"{entry['node']} on {entry['folder']}/{entry['file']}:\n{entry['error']}"
    assert CORE_CASES[case][2] in entry["inner"], f"{entry['node']} returned {entry['returned']} {entry['inner']}"


def test_core_empty_latents_and_joint_latent_run_through_pack_nodes(report):
    """Core's Empty LTXV latents (no frame_rate in the LATENT) into the pack's stage-1 sampler, upsampled and
    sampled again by the pack, then core's Concat AV Latent (a NestedTensor) into the pack's conv and audio
    decoders: ComfyUI validates the graph and its executor runs it to success, saving a clip. Fails when the
    pack refuses a latent core makes (a missing frame_rate, a nested latent)."""
    entry = report["workflows"][CORE_GRAPH]
    assert "exception" not in entry, entry["exception"]
    assert entry["valid"], f"{json.dumps(entry['validation_error'])} {json.dumps(entry['node_errors'])}"
    errors = [m for m in entry["messages"] if m[0] not in ("execution_start", "execution_success")]
    assert entry["success"], json.dumps(errors)[:4000]
    saved = [item for ui in entry["ui"].values() for item in h.ui_files(ui) if item["type"] == "output"]
    assert saved and all(os.path.getsize(os.path.join(report["out_dir"], item.get("subfolder", ""),
                                                      item["filename"])) > 0 for item in saved), entry["ui"]


@pytest.mark.parametrize("case", ENCODE_CASES)
def test_pack_encoders_equal_cores_on_the_tiny_files(report, case):
    """The same frames through core's VAELoader + VAE Encode and through the pack's Load Video Encoder + Encode
    Video (from the conv file and from the diffusion file, which bundles the encoder too), and the same 44.1 kHz
    audio through core's LTXV Audio VAE Encode (torchaudio's resample and mel) and the pack's Encode Audio — of a
    length core does not crop (it keeps a centred multiple of 4096 samples of any audio; the reference and the
    pack keep it all): equal latents, normalized alike, within float32 rounding (1e-4 of the latent's scale;
    measured 2e-6). Fails when the pack's encoder, its normalization, its resampler or its mel stops being core's."""
    entry = report["encode_compare"][case]
    assert entry["ok"], f"{entry['core_node']} on {entry['file']}:\n{entry['error']}"
    assert entry["core_shape"] == entry["pack_shape"], entry
    assert entry["core_dtype"] == "torch.float32", entry
    assert entry["max_abs"] <= 1e-4 * entry["scale"], entry
