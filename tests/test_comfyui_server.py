"""The pack inside a real ComfyUI server (`main.py --cpu` in a subprocess on a free loopback port).

Runs only when COMFYUI_PATH names a ComfyUI checkout (COMFYUI_PYTHON: its venv's python); skipped otherwise.
The pack is linked into a temporary custom_nodes folder, the tiny set is the models folder, and the server is
stopped by its pid. See docs/COMFYUI_TESTS.md.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import time
import urllib.parse
import urllib.request

import pytest

import comfyui_harness as h
from comfyui_harness import EXPECTED_NODES, EXPECTED_TEMPLATE_TITLES, RUN_TEMPLATES

pytestmark = h.requires_comfyui

PROMPT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One ComfyUI server for the module, models folder empty until `tiny_set` fills it."""
    srv = h.start_server(str(tmp_path_factory.mktemp("comfyui_server")))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def object_info(server) -> dict:
    return server.client.get("/object_info")


@pytest.fixture(scope="module")
def tiny_set(server, tiny_models) -> str:
    """The session's tiny set, linked file by file into the running server's models folders (ComfyUI re-reads
    a folder when its mtime changes)."""
    from nodes.tools.tiny import tiny_paths
    from nodes.tools.tiny.lora import write_tiny_dev_files
    for source in [*tiny_paths(tiny_models).values(), *write_tiny_dev_files(tiny_models).values()]:
        target = os.path.join(server.models_dir, os.path.relpath(source, tiny_models))
        if not os.path.lexists(target):
            os.symlink(source, target)
    return server.models_dir


@pytest.fixture(scope="module")
def example_inputs(server) -> str:
    """The conditioning templates' example image and audio files in the server's input folder (--input-directory),
    where core Load Image / Load Audio list and read them."""
    return h.write_example_inputs(server.input_dir)


def _json_roundtrip(value):
    return json.loads(json.dumps(value))


def _pack_log_errors(server) -> str:
    """The pack's import traceback from ComfyUI's log (it logs "Cannot import <path> module ..." after it)."""
    lines = server.log_text().splitlines()
    for i, line in enumerate(lines):
        if "Cannot import" in line and h.PACK_FOLDER in line:
            start = max((j for j in range(i) if lines[j].startswith("Traceback")), default=max(0, i - 40))
            return "\n".join(lines[start:i + 1])
    return "\n".join(line for line in lines if h.PACK_FOLDER in line)


def test_object_info_lists_every_pack_node_with_its_declared_inputs(server, object_info, monkeypatch):
    """Every LTX25 node is registered by ComfyUI's own loader and /object_info describes it exactly as the class
    declares it (inputs with options, outputs, names, category, module). Fails when the pack does not import
    inside ComfyUI (a name clash with ComfyUI's `nodes`, a missing dependency), when a node is left out of
    NODE_CLASS_MAPPINGS or clashes with a core id, or when INPUT_TYPES raises (ComfyUI then drops the node)."""
    found = sorted(name for name in object_info if name.startswith("LTX25"))
    assert found == sorted(EXPECTED_NODES), (
        f"missing {sorted(set(EXPECTED_NODES) - set(found))}, unexpected {sorted(set(found) - set(EXPECTED_NODES))}"
        f"\n{_pack_log_errors(server)}")

    from nodes.comfy import bridge as comfy_bridge
    from nodes.registry import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
    # model-file widgets list the same folder on both sides
    monkeypatch.setattr(comfy_bridge.folders, "_models_dir_override", server.models_dir)
    for name in EXPECTED_NODES:
        cls, info = NODE_CLASS_MAPPINGS[name], object_info[name]
        declared = _json_roundtrip(cls.INPUT_TYPES())
        assert info["input"] == declared, f"{name}: served inputs {info['input']} != declared {declared}"
        assert info["input_order"] == {section: list(inputs) for section, inputs in declared.items()}, name
        assert info["output"] == list(cls.RETURN_TYPES), f"{name}: outputs {info['output']}"
        assert info["output_name"] == list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)), name
        assert info["python_module"] == f"custom_nodes.{h.PACK_FOLDER}", f"{name}: {info['python_module']}"
        assert info["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[name], name
        assert info["display_name"].startswith("LTX-2.5 "), f"{name}: display name {info['display_name']!r}"
        assert info["category"].startswith("LTX-2.5/"), f"{name}: category {info['category']!r}"
        assert info["output_node"] == bool(getattr(cls, "OUTPUT_NODE", False)), name


def test_workflow_templates_list_the_shipped_workflows(server):
    """ComfyUI lists the pack's `workflows/` folder as templates under the pack's folder name and serves each file
    unchanged, with the thumbnail its card asks for (`<name>.jpg`). Fails when a workflow or its thumbnail is
    missing, renamed, or put where ComfyUI does not look."""
    templates = server.client.get("/workflow_templates")
    assert sorted(templates.get(h.PACK_FOLDER, [])) == sorted(EXPECTED_TEMPLATE_TITLES), \
        f"/workflow_templates: {templates}"
    for name in EXPECTED_TEMPLATE_TITLES:
        route = f"/api/workflow_templates/{h.PACK_FOLDER}/{urllib.parse.quote(name)}"
        served = server.client.get(f"{route}.json")
        served = json.loads(served) if isinstance(served, (bytes, str)) else served
        on_disk = h.load_json(os.path.join(h.PACK_ROOT, "workflows", f"{name}.json"))
        assert served == on_disk, f"{name}: the served template differs from workflows/{name}.json"
        assert on_disk.get("version") == 0.4 and on_disk.get("nodes"), f"{name}: not a v0.4 UI workflow"
        with open(os.path.join(h.PACK_ROOT, "workflows", f"{name}.jpg"), "rb") as f:
            assert server.client.get(f"{route}.jpg") == f.read(), f"{name}.jpg is not served as the card asks"


def test_extensions_serve_every_pack_script(server):
    """The frontend imports every script /extensions lists: each `web/**/*.js` of the pack is listed under
    /extensions/<pack folder>/ and served byte for byte. Fails when WEB_DIRECTORY is lost or points elsewhere."""
    web = os.path.join(h.PACK_ROOT, "web")
    scripts = sorted(os.path.relpath(os.path.join(d, f), web).replace(os.sep, "/")
                     for d, _dirs, files in os.walk(web) for f in files if f.endswith(".js"))
    assert scripts, "the pack declares WEB_DIRECTORY but web/ holds no .js file"
    listed = sorted(e for e in server.client.get("/extensions") if e.startswith(f"/extensions/{h.PACK_FOLDER}/"))
    assert listed == [f"/extensions/{h.PACK_FOLDER}/{s}" for s in scripts], f"/extensions lists {listed}"
    for script in scripts:
        with urllib.request.urlopen(f"{server.client.base_url}/extensions/{h.PACK_FOLDER}/{script}") as resp:
            served = resp.read()
        with open(os.path.join(web, script), "rb") as f:
            assert served == f.read(), f"{script}: served bytes differ from the file"


def test_loader_widgets_list_the_tiny_files_under_their_official_names(server, tiny_set):
    """The loaders' file widgets see the models folders given by --extra-model-paths-config, including
    `latent_upscale_models`, which ComfyUI 0.3.x does not define itself, each file in the loader of its kind
    only (vae/ is shared by the video and audio VAEs). Fails when the pack registers the folder too late or in
    the wrong place, so the upsampler loader offers nothing, or when a loader offers a file of another kind."""
    from nodes.ltx.release import OFFICIAL_FILES
    info = server.client.get("/object_info")
    loader_of = {"transformer": "LTX25TransformerLoader", "text_encoder": "LTX25TextEncoderLoader",
                 "conv_vae": "LTX25VideoVAELoader", "diffusion_vae": "LTX25VideoVAELoader",
                 "audio_vae": "LTX25AudioVAELoader", "upsampler": "LTX25UpsamplerLoader"}
    for component, (_folder, filename) in OFFICIAL_FILES.items():
        for node in set(loader_of.values()):
            combos = [spec[0] for spec in info[node]["input"]["required"].values() if isinstance(spec[0], list)]
            offered = any(filename in choices for choices in combos)
            assert offered == (node == loader_of[component]), f"{node} offers {combos}: {filename}?"


def _api_workflow_names() -> list[str]:
    return sorted(RUN_TEMPLATES)


@pytest.mark.parametrize("name", _api_workflow_names())
def test_api_workflow_runs_to_success_and_its_outputs_exist(server, tiny_set, example_inputs, object_info, name):
    """Each `workflows/api/*.json` (its clip sized down for the tiny set; the conditioning ones reading the example
    files through core Load Image / Load Audio) POSTed to /prompt is accepted, ComfyUI's executor finishes it with
    status success in /history, and every file an output node reports exists (mp4s start with an `ftyp` box and
    hold the clip's frames and an audio stream). Fails on any node error inside the real executor, e.g. model
    management or dtype/device assumptions that only hold in the pack's own runner. /free before each prompt makes
    ComfyUI drop its cached results, so each graph runs all its nodes (best effort: the worker acts on it when
    idle)."""
    path = os.path.join(h.PACK_ROOT, "workflows", "api", f"{name}.json")
    assert os.path.isfile(path), f"workflows/api/{name}.json is missing"
    prompt = h.small_clip(h.load_json(path))
    server.client.free()
    resp = server.client.post_prompt(prompt)
    assert resp.status == 200, f"POST /prompt → {resp.status}: {json.dumps(resp.body)[:3000]}"
    assert resp.body.get("node_errors") == {}, resp.body
    entry = server.client.wait_history(resp.body["prompt_id"], PROMPT_TIMEOUT_S, server)
    status = entry["status"]
    errors = [m for m in status.get("messages", []) if m[0] == "execution_error"]
    assert status["status_str"] == "success" and status["completed"], (
        f"{name}: {status['status_str']}: {json.dumps(errors)[:4000]}\n{server.log_tail(3000)}")

    save_nodes = [nid for nid, node in prompt.items() if node["class_type"] == "LTX25SaveVideo"]
    assert save_nodes, f"{name}: no LTX25SaveVideo node"
    for node_id in save_nodes:
        assert h.ui_files(entry["outputs"].get(node_id)), f"{name}: save node {node_id} reported no file"
    output_nodes = [nid for nid, node in prompt.items() if object_info[node["class_type"]]["output_node"]]
    assert set(entry["outputs"]) >= set(save_nodes), f"{name}: outputs only for {sorted(entry['outputs'])}"
    for node_id in output_nodes:
        for item in h.ui_files(entry["outputs"].get(node_id)):
            assert item.get("type") in ("output", "temp"), item
            root = server.output_dir if item["type"] == "output" else os.path.join(server.work_dir, "base", "temp")
            file_path = os.path.join(root, item.get("subfolder", ""), item["filename"])
            if item["type"] == "temp":  # the compare's viewer frames are written in the background after it returns
                deadline = time.monotonic() + 10
                while not os.path.isfile(file_path) and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert os.path.isfile(file_path) and os.path.getsize(file_path) > 0, f"{name}: {file_path} missing/empty"
            if file_path.endswith(".mp4"):
                with open(file_path, "rb") as f:
                    assert f.read(12)[4:8] == b"ftyp", f"{file_path} is not an mp4"
                assert h.mp4_frames(file_path) == (h.clip_frames(prompt), True), file_path


def _broken_base() -> dict:
    assert RUN_TEMPLATES, "no text-to-video workflow to break"
    return h.load_json(os.path.join(h.PACK_ROOT, "workflows", "api", f"{RUN_TEMPLATES[0]}.json"))


def _refused(server, prompt: dict) -> dict:
    resp = server.client.post_prompt(prompt)
    assert resp.status == 400, f"expected 400, got {resp.status}: {json.dumps(resp.body)[:2000]}"
    assert resp.body["error"]["type"] == "prompt_outputs_failed_validation", resp.body["error"]
    return resp.body["node_errors"]


def test_prompt_missing_a_required_input_is_refused_with_node_errors(server, object_info):
    """Cutting a required link into a pack node gives ComfyUI's 400 whose node_errors name that node, its class
    and the input. Fails when a pack node declares the input optional, or the refusal does not say where."""
    prompt = _broken_base()
    node_id, removed = next((nid, name) for nid, n in sorted(prompt.items()) if n["class_type"].startswith("LTX25")
                            for name, value in sorted(n["inputs"].items()) if isinstance(value, list)
                            and name in object_info[n["class_type"]]["input"].get("required", {}))
    node = prompt[node_id]
    broken = copy.deepcopy(prompt)
    del broken[node_id]["inputs"][removed]
    node_errors = _refused(server, broken)
    assert node_id in node_errors, f"node_errors {list(node_errors)} do not name node {node_id}"
    assert node_errors[node_id]["class_type"] == node["class_type"]
    kinds = [(e["type"], e.get("extra_info", {}).get("input_name")) for e in node_errors[node_id]["errors"]]
    assert ("required_input_missing", removed) in kinds, kinds


def test_prompt_with_a_link_of_the_wrong_type_is_refused_with_node_errors(server, object_info):
    """Re-wiring a pack node's input to an output of another type gives ComfyUI's 400 with a
    return_type_mismatch naming the node and the input. Fails when the declared types stop being checkable
    (e.g. a `*` wildcard input) or the pack's RETURN_TYPES and INPUT_TYPES disagree."""
    prompt = _broken_base()
    out_types = {nid: object_info[n["class_type"]]["output"] for nid, n in prompt.items()}
    for node_id, node in sorted(prompt.items()):
        spec = object_info[node["class_type"]]["input"]
        for input_name, value in sorted(node["inputs"].items()):
            if not (isinstance(value, list) and len(value) == 2):
                continue
            expected = {**spec.get("required", {}), **spec.get("optional", {})}[input_name][0]
            wrong = next(((src, i) for src, types in sorted(out_types.items()) if src != node_id
                          for i, t in enumerate(types) if t != expected), None)
            if wrong is None:
                continue
            broken = copy.deepcopy(prompt)
            broken[node_id]["inputs"][input_name] = [wrong[0], wrong[1]]
            node_errors = _refused(server, broken)
            assert node_id in node_errors, f"node_errors {list(node_errors)} do not name node {node_id}"
            kinds = [(e["type"], e.get("extra_info", {}).get("input_name")) for e in node_errors[node_id]["errors"]]
            assert ("return_type_mismatch", input_name) in kinds, kinds
            return
    pytest.fail("no linked input in the workflow to re-wire")


def test_a_save_prefix_outside_the_output_folder_is_refused_when_queued(server, tiny_set):
    """Save nodes whose filename prefix leaves the output folder are named by ComfyUI's validate_prompt (the node's
    VALIDATE_INPUTS) with their input when the prompt is queued, not after the run's sampling. As ComfyUI does for
    any invalid output node, the valid outputs (here the A/B compare) still run and the broken saves do not: the
    run ends in success with nothing written outside the output folder. Fails if the check waits for the save."""
    prompt = h.small_clip(_broken_base())
    saves = sorted(nid for nid, n in prompt.items() if n["class_type"] == "LTX25SaveVideo")
    assert saves and all(not isinstance(prompt[nid]["inputs"].get("filename_prefix"), list) for nid in saves)
    for nid in saves:
        prompt[nid]["inputs"]["filename_prefix"] = "../outside/clip"
    server.client.free()
    resp = server.client.post_prompt(prompt)
    node_errors = resp.body.get("node_errors", {})
    assert sorted(node_errors) == saves, json.dumps(resp.body)[:3000]
    for nid in saves:
        errors = node_errors[nid]["errors"]
        assert [(e["type"], e["extra_info"]["input_name"]) for e in errors] == [
            ("custom_validation_failed", "filename_prefix")], errors
        assert "a name inside" in errors[0]["details"], errors
    assert resp.status == 200, resp.body  # the compare, an output node too, is valid
    entry = server.client.wait_history(resp.body["prompt_id"], PROMPT_TIMEOUT_S, server)
    assert entry["status"]["status_str"] == "success", entry["status"]
    compares = {nid for nid, n in prompt.items() if n["class_type"] == "LTX25DecoderCompare"}
    assert compares and compares <= set(entry.get("outputs", {})), entry.get("outputs")  # the valid output ran
    assert not set(entry.get("outputs", {})) & set(saves), entry.get("outputs")
    outside = os.path.join(os.path.dirname(server.output_dir), "outside")
    assert not os.path.exists(outside), os.listdir(outside)


def test_server_stops_by_its_pid(server):
    """Runs last in this module: the fixture's server ends on SIGTERM to its pid and frees its port, so no
    ComfyUI outlives the tests. Fails when the harness leaves the process running."""
    pid, port = server.proc.pid, server.port
    server.stop()
    assert server.proc.poll() is not None, f"ComfyUI (pid {pid}) still running"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still accepts connections"
