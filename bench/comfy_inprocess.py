"""ComfyUI 0.33 inside a benchmark's own process, without a server: what bench/bench_comfyui_lowvram.py and
bench/bench_core_graph.py share.

- `prepare_imports` / `import_comfyui`: ComfyUI's root first on `sys.path`, a carried site folder last, and stubs for
  the packages ComfyUI imports only for models these graphs never build (the GPU machine may lack them);
- `load_pack`: the pack through ComfyUI's own `nodes.load_custom_node`, from a `custom_nodes` link (the pack root
  never goes on `sys.path`: its package `nodes` would shadow ComfyUI's `nodes.py`);
- `load_core_extras`: the few files of core's `comfy_extras` a graph needs, as main.py loads each of them;
- `pack_as_nodes`: the bench helpers (bench_ab_graph and the per-component builders, which import `nodes.…`) get the
  very modules ComfyUI's copy of the pack uses;
- `NodeClock` and `run_prompt`: one prompt through ComfyUI's `PromptExecutor`, each executed node's seconds.

Standard library only at import: torch and ComfyUI come in after `prepare_imports` has set `sys.path`.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pkgutil
import sys
import time
import types
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.dirname(os.path.abspath(__file__))
PACK_FOLDER = "ltx25_nodes"
GiB = 2**30
# Imported by ComfyUI's modules for models and features these graphs never touch.
STUBBABLE = ("scipy", "torchvision", "torchaudio", "comfy_kitchen")
# The models folders the pack's loaders and core's loaders list (`checkpoints`: core's Load LTXV Audio VAE).
MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "latent_upscale_models", "loras")


# ------------------------------------------------------------------------------------------------ imports
class _Unavailable:
    """Stands in for anything of a stubbed package: usable as a decorator target or base, raises when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is not installed here (a stub from bench/comfy_inprocess.py)")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the missing packages in `names` made by ComfyUI's own files get empty modules whose attributes are
    `_Unavailable`; anyone else (transformers' and diffusers' availability probes) finds them absent. comfy_kitchen
    gets no submodules, so ComfyUI's quant_ops takes its own fallback (`from comfy_kitchen.tensor import ...` fails
    as without the package); its availability probe answers False."""

    def __init__(self, names: set[str], comfy_root: str) -> None:
        self.names, self.comfy_root = names, os.path.join(comfy_root, "")

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top not in self.names or (top == "comfy_kitchen" and fullname != top):
            return None
        frame, machinery = sys._getframe(1), ("<frozen", os.path.dirname(importlib.__file__))
        while frame is not None and frame.f_code.co_filename.startswith(machinery):  # to the importing file
            frame = frame.f_back
        if frame is None or not os.path.abspath(frame.f_code.co_filename).startswith(self.comfy_root):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        if spec.name == "comfy_kitchen":
            module.int8_attention_is_available = lambda: False

        def missing(attr: str, _name: str = spec.name) -> _Unavailable:
            if attr.startswith("__"):  # introspection (inspect, pickle) must see a plain module
                raise AttributeError(attr)
            return _Unavailable(f"{_name}.{attr}")
        module.__getattr__ = missing
        return module

    def exec_module(self, module):
        pass

    def forget(self) -> None:
        """Drop the stub modules from `sys.modules` (ComfyUI's modules keep theirs), so later availability probes see
        the packages absent."""
        for name in [n for n in sys.modules if n.split(".")[0] in self.names]:
            if isinstance(sys.modules[name].__spec__.loader, _StubFinder):
                del sys.modules[name]


def unpack_site(archive: str) -> str:
    """The folder a carried site archive (`.comfy/site.tar.xz`, made by bench/comfy_carry.sh) unpacks to, in the
    temporary folder; unpacked once per archive (its size and time stamp are the marker)."""
    import tarfile
    import tempfile
    stat = os.stat(archive)
    folder = os.path.join(tempfile.gettempdir(), "ltx25_comfy_site")
    marker = os.path.join(folder, ".unpacked_from")
    stamp = f"{os.path.abspath(archive)} {stat.st_size} {stat.st_mtime_ns}"
    if os.path.isfile(marker) and open(marker, encoding="utf-8").read() == stamp:
        return folder
    start = time.perf_counter()
    with tarfile.open(archive) as tar:
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    with open(marker, "w", encoding="utf-8") as f:
        f.write(stamp)
    print(f"[bench] {archive} unpacked to {folder} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return folder


def prepare_imports(comfy_root: str, site: str | None) -> _StubFinder | None:
    """ComfyUI's root first on `sys.path`, the carried site last (a folder, or a site archive unpacked first); for
    what is still missing, a stub finder serving ComfyUI's own imports (installed after transformers and diffusers
    have looked for the real packages)."""
    here = {os.path.abspath(p) for p in (BENCH, ROOT)}
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) not in here]
    sys.path.insert(0, comfy_root)
    if site:
        sys.path.append(unpack_site(site) if os.path.isfile(site) else site)
    missing = {name for name in STUBBABLE if importlib.util.find_spec(name) is None}
    if not missing:
        return None
    import diffusers  # noqa: F401  (their import-time probes see the packages as they are)
    import transformers  # noqa: F401
    finder = _StubFinder(missing, comfy_root)
    sys.meta_path.append(finder)
    return finder


def import_comfyui(cpu: bool) -> types.SimpleNamespace:
    """ComfyUI's modules a bench drives, after `prepare_imports`: its flags at their defaults (its argument parsing
    stays off) except `--cpu` when `cpu` and `--disable-api-nodes`. Raises ImportError for a requirement neither the
    machine nor the carried site has."""
    import comfy.options  # noqa: F401  (imported first: cli_args then leaves this script's arguments alone)
    from comfy.cli_args import args as comfy_args
    comfy_args.cpu = cpu
    comfy_args.disable_api_nodes = True
    import folder_paths
    import comfy.model_management as mm
    import comfyui_version
    import execution
    import nodes
    return types.SimpleNamespace(args=comfy_args, folder_paths=folder_paths, mm=mm, execution=execution,
                                 nodes=nodes, version=comfyui_version.__version__)


def set_up_folders(comfy: types.SimpleNamespace, work: str) -> tuple[str, str]:
    """(models, output) folders under `work`, registered with ComfyUI; nothing in its checkout."""
    models, output = os.path.join(work, "models"), os.path.join(work, "output")
    fp = comfy.folder_paths
    fp.set_output_directory(output)
    fp.set_temp_directory(os.path.join(output, "temp"))
    for folder in MODEL_FOLDERS:
        fp.add_model_folder_path(folder, os.path.join(models, folder), is_default=True)
    fp.add_model_folder_path("checkpoints", os.path.join(models, "vae"), is_default=True)
    return models, output


def load_pack(comfy: types.SimpleNamespace, work: str) -> tuple[str, dict[str, type]] | None:
    """The pack loaded by ComfyUI from `work/custom_nodes/<PACK_FOLDER>` (a link to this checkout): (the package name
    ComfyUI gave it, its node classes by name), or None when ComfyUI could not import it (its log says why)."""
    os.makedirs(os.path.join(work, "custom_nodes"), exist_ok=True)
    link = os.path.join(work, "custom_nodes", PACK_FOLDER)
    os.symlink(ROOT, link, target_is_directory=True)
    nodes = comfy.nodes
    if not asyncio.run(nodes.load_custom_node(link, ignore=set(nodes.NODE_CLASS_MAPPINGS),
                                              module_parent="custom_nodes")):
        return None
    bridge = next(n for n, m in sys.modules.items() if n.endswith(".nodes.comfy.bridge") and m is not None)
    classes = {name: cls for name, cls in nodes.NODE_CLASS_MAPPINGS.items()
               if getattr(cls, "RELATIVE_PYTHON_MODULE", None) == f"custom_nodes.{PACK_FOLDER}"}
    return bridge[: -len(".nodes.comfy.bridge")], classes


def load_core_extras(comfy: types.SimpleNamespace, comfy_root: str, files: tuple[str, ...]) -> list[str]:
    """Core's `comfy_extras/<file>` node files, each loaded as main.py's `init_builtin_extra_nodes` loads it; the
    files that failed (missing from a carried copy, or an import error in ComfyUI's log)."""
    failed = []
    for name in files:
        path = os.path.join(comfy_root, "comfy_extras", name)
        loaded = os.path.isfile(path) and asyncio.run(comfy.nodes.load_custom_node(path, module_parent="comfy_extras"))
        if not loaded:
            failed.append(name)
    return failed


@contextlib.contextmanager
def pack_as_nodes(package: str):
    """While the bench helpers import and build, the name `nodes` is the pack as ComfyUI imported it (`package`), so
    the helpers get the very modules (and classes) ComfyUI's copy uses; ComfyUI's own `nodes` comes back after."""
    pack = f"{package}.nodes"
    root = importlib.import_module(pack)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{pack}."):
        if info.name.endswith(".__main__"):  # a command line, run on import
            continue
        try:  # every module under the pack's name first: an import under `nodes.` alone would make a second copy
            importlib.import_module(info.name)
        except Exception as error:  # optional kernels (natten) and the like
            print(f"[bench] not imported: {info.name}: {error}", file=sys.stderr)
    saved = {name: module for name, module in sys.modules.items() if name == "nodes" or name.startswith("nodes.")}
    for name in saved:
        del sys.modules[name]
    for name, module in list(sys.modules.items()):
        if name == pack or name.startswith(pack + "."):
            sys.modules["nodes" + name[len(pack):]] = module
    sys.path.insert(0, BENCH)
    try:
        yield
    finally:
        sys.path.remove(BENCH)
        for name in [n for n in sys.modules if n == "nodes" or n.startswith("nodes.")]:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != ROOT]  # bench_ab_graph adds it


def boot() -> types.ModuleType:
    """tests/comfyui_boot.py, loaded by its path (standard library only): the executor helpers the real-ComfyUI
    tier's drivers share (`new_executor`, `cached_outputs`, `tensors`), so a bench runs and reads graphs exactly as
    the tier does."""
    name = "ltx25_comfyui_boot"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", "comfyui_boot.py"))
        module = sys.modules[name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
        spec.loader.exec_module(module)
    return sys.modules[name]


# ------------------------------------------------------------------------------------------------ the pack's loaders
def hand_out_pack_loaders(pack_classes: dict, preset: dict) -> None:
    """The pack's loader nodes return the in-memory modules (by node: bench_ab_graph's loader node ids)."""
    by_class = {"LTX25TransformerLoader": "1", "LTX25TextEncoderLoader": "2", "LTX25UpsamplerLoader": "6",
                "LTX25AudioVAELoader": "9"}
    for name, node_id in by_class.items():
        setattr(pack_classes[name], "load", lambda self, *a, __id=node_id, **kw: preset[__id])

    def video_vae(self, vae_file: str, weight_dtype: str):
        return preset["7"] if "conv" in vae_file else preset["8"]
    pack_classes["LTX25VideoVAELoader"].load = video_vae


# ------------------------------------------------------------------------------------------------ running a prompt
class NodeClock:
    """Each node ComfyUI's executor runs (not those it takes from its cache): seconds, start and end in the
    run. It wraps `execution.get_output_data`, which every executed node of every kind (V1, V3, async) goes through;
    the device is synchronized on both sides so a node's queued GPU work is its own. An async node (the pack's saves)
    returns its tasks at once: its end is when the last of them finishes, taken by a done-callback."""

    def __init__(self, execution: types.ModuleType, sync: Callable[[], None]) -> None:
        self.execution, self.sync, self.rows, self.origin = execution, sync, {}, time.perf_counter()
        self._original = execution.get_output_data

        async def timed(prompt_id, unique_id, obj, *args, **kwargs):
            self.sync()
            start = time.perf_counter()
            result = await self._original(prompt_id, unique_id, obj, *args, **kwargs)
            self.sync()
            end = time.perf_counter()
            row = self.rows[unique_id] = {"s": round(end - start, 3), "start": round(start - self.origin, 3),
                                          "end": round(end - self.origin, 3)}
            tasks = [t for t in result[0] if isinstance(t, asyncio.Task)] if result[3] else []
            for task in tasks:
                task.add_done_callback(lambda _t, row=row, start=start: self._task_done(row, start))
            return result
        execution.get_output_data = timed

    def _task_done(self, row: dict, start: float) -> None:
        end = time.perf_counter()
        row["end"] = round(max(row["end"], end - self.origin), 3)
        row["s"] = round(row["end"] - (start - self.origin), 3)
        row["async"] = True

    def reset(self) -> None:
        self.rows, self.origin = {}, time.perf_counter()

    def close(self) -> None:
        self.execution.get_output_data = self._original


def run_prompt(comfy: types.SimpleNamespace, executor, prompt: dict, prompt_id: str,
               clock: NodeClock | None = None) -> dict[str, Any]:
    """Validate `prompt` (not timed: the server validates before queueing), then run it through `executor`:
    {"success", "errors", "wall_s", "nodes": {node id: the clock's row}}."""
    valid, error, outputs, node_errors = asyncio.run(comfy.execution.validate_prompt(prompt_id, prompt, None))
    if not valid:
        return {"success": False, "errors": [f"invalid prompt: {error} {node_errors}"], "wall_s": None, "nodes": {}}
    if clock is not None:
        clock.reset()
    start = time.perf_counter()
    # ComfyUI takes the outputs from a set, in the hash seed's order, which decides which ready output node runs first
    # (the compare or a save); in node-id order every run of a graph schedules alike
    executor.execute(prompt, prompt_id, {"client_id": None, "preview_method": "none"},
                     sorted(outputs, key=lambda i: (len(i), i)))
    wall = time.perf_counter() - start
    errors = [data.get("exception_message", "")[:2000] for event, data in executor.status_messages
              if event == "execution_error"]
    nodes = {}
    if clock is not None:
        nodes = {k: {"class": prompt[k]["class_type"], **row}
                 for k, row in sorted(clock.rows.items(), key=lambda kv: kv[1]["start"])}
    return {"success": bool(executor.success), "errors": errors, "wall_s": round(wall, 3), "nodes": nodes}


def write_result(result: dict, out: str | None, code: int) -> int:
    """The result as one JSON line, to `out` (when given) and stdout; returns `code`."""
    line = json.dumps(result, default=str)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    print(line)
    return code


def git_commit() -> str | None:
    """This checkout's short commit, or None where git or the repository is absent (a copied tree)."""
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
