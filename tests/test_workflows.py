"""The bundled workflows: committed files equal what the specs generate, UI→API conversion gives the API twin, and
each graph runs headless on the tiny set with decodable outputs; repeated A/B runs do not grow process memory."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os

import av
import pytest
import torch

from nodes.comfy import bridge as comfy_bridge
from nodes.comfy import previews
from nodes.registry import NODE_CLASS_MAPPINGS
from nodes.tools import run, workflow_specs
from nodes.tools.graph import input_specs, is_widget, ui_to_api, validate

ROOT = workflow_specs.ROOT
NAMES = sorted(workflow_specs.WORKFLOWS)
# Small enough for 2 CPU cores, still two-stage (multiples of 64) with 3 latent frames.
TINY_OVERRIDES = {"5": {"width": 192, "height": 128, "frames": 17}}
# The tiny transformer has 2 blocks: STG perturbs its last one instead of the reference's block 28; 3 of the dev
# schedule's steps exercise the guided stage as well as 30 (each runs four forwards).
TINY_CLASS_OVERRIDES = {"LTX25MultimodalGuider": {"video_stg_blocks": "1", "audio_stg_blocks": "1"},
                        "LTX25GuidedSampler": {"steps": 3}}


def load(*parts: str) -> dict:
    with open(os.path.join(ROOT, "workflows", *parts), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("name", NAMES)
def test_committed_files_match_their_specs(name):
    """`python -m nodes.tools.workflow_specs` must have been run after changing a spec or a node's inputs."""
    spec = workflow_specs.WORKFLOWS[name]
    api = workflow_specs.to_api(spec["nodes"])
    assert load("api", f"{name}.json") == api
    ui = workflow_specs.to_ui(api, spec["notes"], phases=spec.get("phases"))
    assert load(f"{workflow_specs.ui_name(name)}.json") == json.loads(json.dumps(ui))


@pytest.mark.parametrize("name", NAMES)
def test_ui_format_converts_to_its_api_twin(name):
    """What the canvas saves must queue as the committed API graph (validation runs in the tiny-set test)."""
    ui = load(f"{workflow_specs.ui_name(name)}.json")
    assert ui["version"] == 0.4 and all("title" in n for n in ui["nodes"])
    api = ui_to_api(ui, workflow_specs.CLASSES)
    assert api == load("api", f"{name}.json")


def follow_two_stage_note(ui: dict) -> dict:
    """`ui` as a user leaves it after the note on every template's Empty Latent: two_stage off, 'Upsample x2' and
    'Stage 2' (nodes 11 and 12) bypassed."""
    ui = json.loads(json.dumps(ui))
    for node in ui["nodes"]:
        if node["id"] in (11, 12):
            node["mode"] = 4
        if node["type"] == "LTX25EmptyLatent":
            widgets = [n for n, (kind, _o, _r) in input_specs(NODE_CLASS_MAPPINGS["LTX25EmptyLatent"]).items()
                       if is_widget(kind)]
            node["widgets_values"][widgets.index("two_stage")] = False
    return ui


@pytest.mark.parametrize("name", NAMES)
def test_bypassing_stage_2_as_the_note_says_passes_each_latent_through(name):
    """With 'Upsample x2' and 'Stage 2' bypassed, what read stage 2's video and audio latents reads stage 1's,
    resolved as ComfyUI's frontend resolves a bypassed node (output i from input i when the types fit, else the
    first input of that type). Fails with the latents after `model` and `conditioning` on the sampler: both
    outputs then came from its video latent, and Audio Decode refused the video latent."""
    ui = load(f"{workflow_specs.ui_name(name)}.json")
    before = ui_to_api(ui, workflow_specs.CLASSES)
    after = ui_to_api(follow_two_stage_note(ui), workflow_specs.CLASSES)
    assert not {"11", "12"} & set(after) and after["5"]["inputs"]["two_stage"] is False
    rewired = 0
    for node_id, node in before.items():
        for input_name, value in node["inputs"].items():
            if isinstance(value, list) and value[0] == "12":
                assert after[node_id]["inputs"][input_name] == ["10", value[1]], (node_id, input_name)
                rewired += 1
    assert rewired >= 2


def test_the_t2v_template_runs_headless_with_stage_2_bypassed(tiny_models, tmp_path):
    """The bypassed template queues and runs: one stage at the full size, the audio decoded from stage 1's audio."""
    comfy_bridge.set_output_dir(str(tmp_path))
    ui = follow_two_stage_note(load(f"{workflow_specs.ui_name('ltx25_t2v_distilled_conv')}.json"))
    prompt = ui_to_api(ui, NODE_CLASS_MAPPINGS)
    prompt["5"]["inputs"].update(TINY_OVERRIDES["5"])
    validate(prompt, NODE_CLASS_MAPPINGS)
    result = run.execute(prompt)
    (path,) = saved_videos(prompt, result)
    with av.open(path) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.width, stream.codec_context.height) == (192, 128)
        assert sum(1 for _ in container.decode(video=0)) == 17 and container.streams.audio


def tiny_prompt(name: str) -> dict:
    prompt = load("api", f"{name}.json")
    for node_id, values in TINY_OVERRIDES.items():
        prompt[node_id]["inputs"].update(values)
    for node in prompt.values():
        node["inputs"].update(TINY_CLASS_OVERRIDES.get(node["class_type"], {}))
    return prompt


def saved_videos(prompt: dict, result: dict) -> list[str]:
    return [result["outputs"][i][0] for i, node in prompt.items() if node["class_type"] == "LTX25SaveVideo"]


@pytest.mark.parametrize("name", [n for n in NAMES if "_t2v_" in n])  # the others: test_guide_workflows.py
def test_workflow_runs_headless_on_the_tiny_set(name, tiny_models, tmp_path):
    """Every graph runs end to end with the pack's node classes; every saved mp4 decodes back."""
    comfy_bridge.set_output_dir(str(tmp_path))
    prompt = tiny_prompt(name)
    validate(prompt, NODE_CLASS_MAPPINGS)
    result = run.execute(prompt)
    videos = saved_videos(prompt, result)
    expected = sum(node["class_type"] == "LTX25SaveVideo" for node in prompt.values())
    assert len(videos) == expected and all(p.startswith(str(tmp_path)) for p in videos), videos
    for path in videos:
        with av.open(path) as container:
            frames = sum(1 for _ in container.decode(video=0))
            assert frames == 17 and container.streams.audio, path
    if name.endswith("decoder_ab"):
        report = json.loads(result["outputs"]["16"][1])
        assert report["frames"] == 17 and set(report["decoders"]) == {"conv VAE", "diffusion VAE"}


M_ARENA_MAX, M_MMAP_THRESHOLD = -8, -3  # glibc's mallopt parameters


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _one_malloc_arena():
    """glibc gives each new thread (the saves' encoders, the previews) a malloc arena of its own, up to 8 per core,
    and keeps their freed pages: resident memory then grows run after run with nothing alive (measured: +12 MiB a run
    for 10 runs, the tensor and object counts flat). It also raises its mmap threshold each time a large block is
    freed, so later large blocks come from the heap and fragment it (measured in CI after the rest of the suite:
    +23 MiB in one run, the live tensors flat). With new threads sharing the existing arenas, large blocks always
    mapped and freed pages trimmed before each sample, what is left to grow is what runs keep alive."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_ARENA_MAX, 1)
        libc.mallopt(M_MMAP_THRESHOLD, 128 * 2**10)
    except (OSError, AttributeError):  # not glibc: measure as it is
        yield lambda: None
        return
    try:
        yield lambda: libc.malloc_trim(0)
    finally:
        # No explicit arena limit (glibc may keep one it derived meanwhile: harmless here). The mmap threshold stays
        # fixed at its default value: only its growth is turned off.
        libc.mallopt(M_ARENA_MAX, 0)


def _live_tensor_storages() -> tuple[int, int]:
    """(count, bytes) of the distinct storages behind the tensors Python holds: exact, unlike resident memory."""
    storages = {}
    for obj in gc.get_objects():
        # type(), not isinstance: a deprecated alias of torch.distributed warns when its `__class__` is read
        if issubclass(type(obj), torch.Tensor) and obj.layout == torch.strided and obj.device.type != "meta":
            try:
                storage = obj.untyped_storage()
                storages[(obj.device.type, storage.data_ptr())] = storage.nbytes()
            except RuntimeError:  # a fake tensor of an earlier test's compile: it holds no memory
                continue
    return len(storages), sum(storages.values())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_repeated_ab_runs_do_not_grow_process_memory_fds_or_files(tiny_models, tmp_path):
    """Five A/B runs in one process, each as the headless runner makes it (previews removed afterwards): after the
    second, the tensors alive do not change at all (encoders freed, caches bounded, nothing kept alive by graphs),
    resident memory (the allocator's own growth turned off) may not grow by more than 32 MiB (what is not a tensor:
    frames in numpy, codec buffers) and the open file descriptors not at all (a video, preview or model file left
    open); the preview folder stays empty (it held 1,360 files after 40 runs) and each run adds its three videos
    and nothing else (no partial file)."""
    comfy_bridge.set_output_dir(str(tmp_path))
    samples, tensors, fds, previews_left, files = [], [], [], [], []
    with _one_malloc_arena() as trim:
        for _ in range(5):
            with previews.removed_afterwards():
                run.execute(tiny_prompt("ltx25_t2v_distilled_decoder_ab"))
            gc.collect()
            trim()
            samples.append(_rss_bytes())
            tensors.append(_live_tensor_storages())
            fds.append(_open_fds())
            temp = comfy_bridge.temp_dir()
            previews_left.append(len(os.listdir(temp)) if os.path.isdir(temp) else 0)
            files.append(sorted(p.suffix for p in tmp_path.iterdir() if p.is_file()))
    assert tensors[2:] == [tensors[1]] * 3, f"(storages, bytes) alive after each run: {tensors}"
    growth = samples[-1] - samples[1]
    assert growth < 32 * 2**20, f"RSS after each run (MiB): {[s // 2**20 for s in samples]}"
    assert fds[2:] == [fds[1]] * 3 and previews_left == [0] * 5, (fds, previews_left)  # run 1 opens lazily
    assert files == [[".mp4"] * 3 * (i + 1) for i in range(5)], files
