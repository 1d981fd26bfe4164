"""Helpers for the real-ComfyUI test tier: a ComfyUI checkout named by `COMFYUI_PATH`, run by `COMFYUI_PYTHON`
(default: this interpreter), with the pack linked into a temporary custom_nodes folder and a temporary models
folder. Nothing of ComfyUI is imported here: the pack's own venv runs pytest, ComfyUI runs in a child process.

The pack's top-level package is called `nodes`, like ComfyUI's own `nodes.py`; so the pack root is never put on
ComfyUI's `sys.path`. ComfyUI imports the pack the way it imports every custom node: from the folder, as a
package named after its path, where the pack's relative imports resolve inside it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from comfyui_boot import MODEL_FOLDERS

PACK_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folder name ComfyUI sees: it keys /workflow_templates, /extensions/<name>/ and `custom_nodes.<name>`.
PACK_FOLDER = "ltx25_nodes"
ENV_PATH, ENV_PYTHON = "COMFYUI_PATH", "COMFYUI_PYTHON"
SKIP_REASON = (f"{ENV_PATH} is not set: set it to a ComfyUI checkout whose requirements are installed "
               f"(and {ENV_PYTHON} to that venv's python) to run the real-ComfyUI tests; see docs/COMFYUI_TESTS.md")
STARTUP_TIMEOUT_S = 90.0
# Module mark: skips before any fixture (the tiny set, a server) is built.
requires_comfyui = pytest.mark.skipif(not os.environ.get(ENV_PATH, "").strip(), reason=SKIP_REASON)
# What ComfyUI must register and serve: exactly the node ids the pack's registry declares and the templates its
# workflows folder ships (so a new node or template is checked in ComfyUI without editing a list here).
if PACK_ROOT not in sys.path:
    sys.path.insert(0, PACK_ROOT)
from nodes.registry import NODE_CLASS_MAPPINGS as _PACK_NODES  # noqa: E402

EXPECTED_NODES = tuple(sorted(_PACK_NODES))


def _json_names(folder: str) -> tuple[str, ...]:
    return tuple(sorted(os.path.splitext(name)[0] for name in os.listdir(folder) if name.endswith(".json")))


# The template browser lists the UI files by name, so they are named after their card titles
# (nodes/tools/workflow_specs.py TITLES); their API twins in workflows/api keep the short names.
EXPECTED_TEMPLATE_TITLES = _json_names(os.path.join(PACK_ROOT, "workflows"))
EXPECTED_TEMPLATES = _json_names(os.path.join(PACK_ROOT, "workflows", "api"))
# The templates this tier RUNS: the text-to-video ones, and the conditioning ones, whose core Load Image / Load Audio
# read the example files `write_example_inputs` puts into ComfyUI's input folder (one name a line).
CONDITIONING_TEMPLATES = (
    "ltx25_a2v_distilled",
    "ltx25_extend",
    "ltx25_flf2v_distilled",
    "ltx25_i2v_distilled",
    "ltx25_ic_lora",
)
RUN_TEMPLATES = tuple(name for name in EXPECTED_TEMPLATES if "_t2v_" in name) + CONDITIONING_TEMPLATES


# ---------------------------------------------------------------------------------------------------- locating
def comfyui_path() -> str:
    """The ComfyUI checkout, or skip the calling test when `COMFYUI_PATH` is unset.

    A set but wrong `COMFYUI_PATH` fails instead of skipping: whoever set it meant to run this tier."""
    path = os.environ.get(ENV_PATH, "").strip()
    if not path:
        pytest.skip(SKIP_REASON)
    path = os.path.abspath(os.path.expanduser(path))
    for marker in ("main.py", "execution.py", "folder_paths.py"):
        if not os.path.isfile(os.path.join(path, marker)):
            pytest.fail(f"{ENV_PATH}={path} is not a ComfyUI checkout: {marker} is missing there")
    return path


def comfyui_python() -> str:
    """The interpreter that has ComfyUI's requirements installed (`COMFYUI_PYTHON`, default: this one)."""
    python = os.environ.get(ENV_PYTHON, "").strip() or sys.executable
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        pytest.fail(f"{ENV_PYTHON}={python} is not an executable python interpreter")
    return python


# ---------------------------------------------------------------------------------------------------- folders
def make_custom_nodes_dir(root: str) -> str:
    """`root/custom_nodes/ltx25_nodes` → symlink to the pack root; returns the custom_nodes folder."""
    custom_nodes = os.path.join(root, "custom_nodes")
    os.makedirs(custom_nodes, exist_ok=True)
    link = os.path.join(custom_nodes, PACK_FOLDER)
    if not os.path.islink(link):
        os.symlink(PACK_ROOT, link, target_is_directory=True)
    return custom_nodes


def make_models_dir(root: str) -> str:
    """An empty ComfyUI-style models folder (the folders the pack reads); the tiny set is written into it."""
    models = os.path.join(root, "models")
    for folder in MODEL_FOLDERS:
        os.makedirs(os.path.join(models, folder), exist_ok=True)
    return models


def write_extra_model_paths(path: str, models_dir: str, custom_nodes_dir: str) -> str:
    """ComfyUI's extra_model_paths YAML: the model folders → `models_dir`, custom nodes → `custom_nodes_dir`.
    Written by hand (flat string values only) so the pack's venv needs no YAML library."""
    lines = ["ltx25_tests:", f"  base_path: {json.dumps(models_dir)}"]
    lines += [f"  {folder}: {folder}" for folder in MODEL_FOLDERS]
    lines.append(f"  custom_nodes: {json.dumps(custom_nodes_dir)}")  # absolute: os.path.join keeps it as is
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def api_workflows() -> list[str]:
    """The pack's API-format workflows (`workflows/api/*.json`), sorted."""
    folder = os.path.join(PACK_ROOT, "workflows", "api")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json")) \
        if os.path.isdir(folder) else []


# The shipped graphs are sized for real weights (768×512×121); the tiny set on 2 CPU cores gets a small clip that
# is still two-stage (multiples of 64) with 3 latent frames, like the headless workflow tests.
SMALL_CLIP = {"width": 192, "height": 128, "frames": 17}
# The tiny transformer has 2 blocks: STG perturbs its last one instead of the reference's block 28; 3 of the dev
# schedule's steps exercise the guided stage as well as 30 (each runs four forwards). The extend template's window
# is made as short as the tiny clip (17 + 16 frames: 5 latent frames, 2 of them the overlap).
TINY_GUIDED = {"LTX25MultimodalGuider": {"video_stg_blocks": "1", "audio_stg_blocks": "1"},
               "LTX25GuidedSampler": {"steps": 3},
               "LTX25ExtendClip": {"new_frames": 16}}


def small_clip(prompt: dict) -> dict:
    """A copy of an API graph whose LTX25EmptyLatent nodes ask for SMALL_CLIP (and whose guided nodes fit the
    tiny transformer, TINY_GUIDED); an input wired to a link keeps its link (a2v's frames come from its audio);
    everything else is unchanged."""
    resized = json.loads(json.dumps(prompt))
    empties = [node for node in resized.values() if node.get("class_type") == "LTX25EmptyLatent"]
    assert empties, "the workflow has no LTX25EmptyLatent node to size"
    for node in resized.values():
        values = {**(SMALL_CLIP if node.get("class_type") == "LTX25EmptyLatent" else {}),
                  **TINY_GUIDED.get(node.get("class_type"), {})}
        node["inputs"].update({k: v for k, v in values.items() if not isinstance(node["inputs"].get(k), list)})
    return resized


def clip_frames(prompt: dict) -> int:
    """The pixel frames every save of a `small_clip` graph holds: the clip's (an a2v clip's from its 0.6 s of
    audio: 17 at 24 fps, as SMALL_CLIP's), plus an extension's new frames."""
    extend = sum(node["inputs"]["new_frames"] for node in prompt.values() if node["class_type"] == "LTX25ExtendClip")
    return SMALL_CLIP["frames"] + extend


def mp4_frames(path: str) -> tuple[int, bool]:
    """A saved video's frame count (decoded), and whether it has an audio stream."""
    import av
    with av.open(path) as container:
        return sum(1 for _ in container.decode(video=0)), bool(container.streams.audio)


def write_example_inputs(folder: str) -> str:
    """The files the conditioning templates' core Load Image / Load Audio / Load Video name
    (workflow_specs.EXAMPLE_FILES), into a ComfyUI input folder: two small gradients, the first of another aspect than
    the clip's, 0.6 s of a 440 Hz tone (17 frames at 24 fps) and a 17-frame moving gradient at the clip's size (the
    IC-LoRA reference). The folder."""
    import wave
    import av
    import numpy as np
    from nodes.tools.workflow_specs import EXAMPLE_FILES
    os.makedirs(folder, exist_ok=True)
    for key, (height, width) in (("first", (70, 100)), ("last", (128, 192))):
        y, x = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
        rgb = np.stack([x, y, (x + y) / 2], -1).astype(np.uint8)
        with av.open(os.path.join(folder, EXAMPLE_FILES[key]), "w", format="image2") as container:
            stream = container.add_stream("png")
            stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
            container.mux(stream.encode())
    with av.open(os.path.join(folder, EXAMPLE_FILES["reference"]), "w") as container:  # 17 frames, the clip's size
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 192, 128, "yuv420p"
        y, x = np.meshgrid(np.linspace(0, 255, 128), np.linspace(0, 255, 192), indexing="ij")
        for i in range(17):
            rgb = np.stack([(x + 12 * i) % 256, y, (x + y) / 2], -1).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        container.mux(stream.encode())
    tone = (np.sin(np.arange(9600) / 16000 * 2 * np.pi * 440) * 9000).astype(np.int16)
    with wave.open(os.path.join(folder, EXAMPLE_FILES["audio"]), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(tone.tobytes())
    return folder


def load_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ui_files(ui: Any) -> list[dict]:
    """Every `{filename, subfolder, type}` entry in a node's UI output (images, videos, audio, ...)."""
    found: list[dict] = []
    if isinstance(ui, dict):
        if isinstance(ui.get("filename"), str):
            found.append(ui)
        for value in ui.values():
            found += ui_files(value)
    elif isinstance(ui, list):
        for value in ui:
            found += ui_files(value)
    return found


def child_env() -> dict[str, str]:
    """Environment of the ComfyUI processes: no PYTHONPATH (the pack root must not shadow ComfyUI's `nodes`), and
    one OpenMP thread unless the caller chose otherwise: the tiny models gain nothing from more, and OpenMP's
    spin-waiting on shared cores tripled the tier's time (2 busy cores: 21 s instead of 65 s in-process)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LTX25_QUIET": "1"}
    env.pop("PYTHONPATH", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ---------------------------------------------------------------------------------------------------- HTTP client
@dataclass
class Response:
    status: int
    body: Any


class Client:
    """A tiny urllib client for ComfyUI's HTTP API (no websocket: /history is polled)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def request(self, path: str, payload: Any = None, timeout: float = 30.0) -> Response:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.base_url + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            status, raw, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
        return Response(status, json.loads(raw) if "json" in ctype else raw)

    def get(self, path: str) -> Any:
        resp = self.request(path)
        assert resp.status == 200, f"GET {path} → HTTP {resp.status}: {resp.body!r:.500}"
        return resp.body

    def free(self) -> None:
        """POST /free: after the current prompt the worker unloads every model and clears the executor's output
        cache, so the next prompt runs every node instead of reusing another workflow's results."""
        resp = self.request("/free", {"unload_models": True, "free_memory": True})
        assert resp.status == 200, f"POST /free → HTTP {resp.status}"
        time.sleep(0.5)  # the idle worker wakes on the flag at once; give it time to act before the next prompt

    def post_prompt(self, prompt: dict) -> Response:
        return self.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})

    def wait_history(self, prompt_id: str, timeout: float, server: "ComfyServer | None" = None) -> dict:
        """Poll /history/<id> until the prompt is finished (success or error); its history entry."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None \
                    and entry["status"].get("status_str") in ("success", "error"):
                return entry
            if server is not None:
                server.check_alive()
            time.sleep(0.2)
        raise AssertionError(f"prompt {prompt_id} not finished after {timeout:.0f} s; queue: {self.get('/queue')}"
                             + (f"\n{server.log_tail()}" if server else ""))


# ---------------------------------------------------------------------------------------------------- the server
@dataclass
class ComfyServer:
    """`main.py` in a subprocess on a free loopback port; stop() ends it by its pid."""
    comfy_root: str
    python: str
    work_dir: str
    models_dir: str
    custom_nodes_dir: str
    output_dir: str
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: str = ""
    extra_args: list[str] = field(default_factory=list)

    @property
    def input_dir(self) -> str:
        """ComfyUI's input folder (`--input-directory`): what core Load Image / Load Audio list and read."""
        return os.path.join(self.work_dir, "input")

    @property
    def client(self) -> Client:
        return Client(f"http://127.0.0.1:{self.port}")

    def command(self, yaml_path: str) -> list[str]:
        return [self.python, os.path.join(self.comfy_root, "main.py"),
                "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
                # everything ComfyUI writes stays in the temp folder, never in the checkout
                "--base-directory", os.path.join(self.work_dir, "base"),
                "--output-directory", self.output_dir, "--input-directory", self.input_dir,
                "--extra-model-paths-config", yaml_path,
                "--database-url", "sqlite:///:memory:",
                # load our pack and no other (the checkout's own custom_nodes stay out), no API nodes
                "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK_FOLDER,
                "--disable-api-nodes", "--disable-auto-launch", *self.extra_args]

    def start(self) -> "ComfyServer":
        yaml_path = write_extra_model_paths(os.path.join(self.work_dir, "extra_model_paths.yaml"),
                                            self.models_dir, self.custom_nodes_dir)
        # --base-directory keeps ComfyUI's user, input and temp folders out of the checkout; its own (empty)
        # custom_nodes folder must exist, ours comes from the YAML
        os.makedirs(os.path.join(self.work_dir, "base", "custom_nodes"), exist_ok=True)
        os.makedirs(self.input_dir, exist_ok=True)
        self.port = self.port or free_port()
        self.log_path = os.path.join(self.work_dir, "comfyui.log")
        env = child_env()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(yaml_path), cwd=self.work_dir, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if self.client.request("/system_stats", timeout=2).status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise AssertionError(f"ComfyUI not ready after {STARTUP_TIMEOUT_S:.0f} s\n{self.log_tail()}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"ComfyUI exited with status {self.proc.returncode}\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "---- ComfyUI log (tail) ----\n" + f.read()[-chars:]
        except OSError:
            return "(no ComfyUI log)"

    def log_text(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM to the server's pid, SIGKILL if it lingers; its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout)


def start_server(work_dir: str) -> ComfyServer:
    """A server with the pack linked in and an (initially empty) models folder under `work_dir`."""
    comfy_root, python = comfyui_path(), comfyui_python()
    return ComfyServer(comfy_root=comfy_root, python=python, work_dir=work_dir,
                       models_dir=make_models_dir(work_dir), custom_nodes_dir=make_custom_nodes_dir(work_dir),
                       output_dir=os.path.join(work_dir, "output")).start()


# ---------------------------------------------------------------------------------------------------- in-process
def run_inprocess_driver(work_dir: str, models_dir: str, workflows: list[str], timeout: float = 300,
                         resize: bool = True, core_loaders: dict[str, tuple[str, str]] | None = None,
                         encode_compare: dict[str, str] | None = None) -> dict:
    """Run `tests/comfyui_inprocess_driver.py` with COMFYUI_PYTHON on the workflows, sized as `small_clip` unless
    `resize` is off, with the example inputs (`write_example_inputs`) in its ComfyUI input folder; `core_loaders`
    ({case: (folder, file)}) has core's own loaders load those files too, and `encode_compare` ({case: file})
    encodes one input with core's encoder and the pack's for each file. Its JSON report."""
    comfy_root, python = comfyui_path(), comfyui_python()
    custom_nodes = make_custom_nodes_dir(work_dir)
    os.makedirs(os.path.join(work_dir, "workflows"), exist_ok=True)
    resized, prompts = [], {}
    for path in workflows:
        resized.append(os.path.join(work_dir, "workflows", os.path.basename(path)))
        name = os.path.splitext(os.path.basename(path))[0]
        prompts[name] = small_clip(load_json(path)) if resize else load_json(path)
        with open(resized[-1], "w", encoding="utf-8") as f:
            json.dump(prompts[name], f)
    workflows = resized
    report_path = os.path.join(work_dir, "inprocess_report.json")
    cmd = [python, os.path.join(PACK_ROOT, "tests", "comfyui_inprocess_driver.py"),
           "--comfyui", comfy_root, "--pack", os.path.join(custom_nodes, PACK_FOLDER), "--models", models_dir,
           "--out", os.path.join(work_dir, "output"), "--report", report_path,
           "--input", write_example_inputs(os.path.join(work_dir, "input")),
           "--core-loaders", json.dumps(core_loaders or {}), "--encode-compare", json.dumps(encode_compare or {}),
           *workflows]
    result = subprocess.run(cmd, cwd=work_dir, env=child_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 or not os.path.isfile(report_path):
        raise AssertionError(f"in-process driver failed (exit {result.returncode}):\n"
                             f"{(result.stdout + result.stderr)[-6000:]}")
    report = load_json(report_path)
    report["out_dir"] = os.path.join(work_dir, "output")
    report["prompts"] = prompts  # as the driver ran them
    report["log"] = (result.stdout + result.stderr)[-6000:]
    return report
