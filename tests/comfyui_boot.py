"""The start-up every driver of the real-ComfyUI tier shares (tests/comfyui_*_driver.py, run as scripts with ComfyUI's
interpreter), and the executor helpers the workflow drivers share.

Standard library only at import: a driver imports this module first, from its own folder, before ComfyUI is on
`sys.path`; `comfy_flags` then takes that folder off `sys.path` and puts ComfyUI's root first. The pack root is never
put on `sys.path` (its package `nodes` would shadow ComfyUI's `nodes.py`): the pack is imported either by ComfyUI's
own custom-node loader (`load_pack`) or as a package of its own name (`import_pack`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
# The models folders the pack reads (the harness makes them, the drivers register them).
MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "latent_upscale_models", "loras")


def comfy_flags(comfy_root: str):
    """ComfyUI's root first on `sys.path` (this folder off it), and its flags as `--cpu --disable-api-nodes` set
    them; call before anything imports `comfy.model_management`, which picks the device at import. ComfyUI's
    `comfy.cli_args.args` (the defaults otherwise: its argument parsing stays off)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != HERE]
    sys.path.insert(0, os.path.abspath(comfy_root))
    import comfy.options  # noqa: F401  (imported first so that cli_args does not parse this script's arguments)
    from comfy.cli_args import args
    args.cpu = True
    args.disable_api_nodes = True
    return args


def set_folders(out: str, models: str, input_dir: str | None = None) -> None:
    """ComfyUI's output and temp folders under `out`, its input folder `input_dir` (when given), the tiny set's
    folders under `models` as the models folders; nothing in the checkout."""
    import folder_paths
    os.makedirs(out, exist_ok=True)
    folder_paths.set_output_directory(out)
    folder_paths.set_temp_directory(os.path.join(out, "temp"))
    if input_dir:
        folder_paths.set_input_directory(input_dir)
    for folder in MODEL_FOLDERS:
        folder_paths.add_model_folder_path(folder, os.path.join(models, folder), is_default=True)
    # core's Load LTXV Audio VAE lists checkpoints/, not vae/
    folder_paths.add_model_folder_path("checkpoints", os.path.join(models, "vae"), is_default=True)


@dataclasses.dataclass
class Pack:
    """The pack as ComfyUI loaded it: whether the loader succeeded, the package it was imported as (a name made from
    its folder's path), its node classes as registered, and ComfyUI's `nodes` module."""
    loaded: bool
    package: str
    classes: dict[str, type]
    nodes: ModuleType

    def module(self, tail: str) -> ModuleType:
        """A pack module by its name inside the pack, e.g. `comfy.bridge` or `ltx.dit.guides`."""
        return importlib.import_module(f"{self.package}.nodes.{tail}")


def load_pack(link: str, extra_nodes: bool = False) -> Pack:
    """The pack from its `custom_nodes/<folder>` link through ComfyUI's own `nodes.load_custom_node`, as the server
    loads it; `extra_nodes` loads core's comfy_extras nodes first (the LTXV latents, Load Image's neighbours, Load
    Audio...), as main.py does."""
    import nodes
    if extra_nodes:
        asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
    builtin = set(nodes.NODE_CLASS_MAPPINGS)
    loaded = asyncio.run(nodes.load_custom_node(link, ignore=builtin, module_parent="custom_nodes"))
    relative = f"custom_nodes.{os.path.basename(link)}"
    classes = {name: cls for name, cls in nodes.NODE_CLASS_MAPPINGS.items()
               if getattr(cls, "RELATIVE_PYTHON_MODULE", None) == relative}
    bridge = next((name for name, module in sys.modules.items()
                   if name.endswith(".nodes.comfy.bridge") and module is not None), None)
    package = bridge.rsplit(".nodes.", 1)[0] if bridge else ""
    return Pack(bool(loaded), package, classes, nodes)


def import_pack(pack_root: str, package: str = "ltx25_pack") -> ModuleType:
    """The pack imported as a package named `package` (its `nodes` stays inside it), without ComfyUI's `nodes`:
    for drivers that call the pack's modules directly (`from ltx25_pack.nodes... import ...`)."""
    spec = importlib.util.spec_from_file_location(package, os.path.join(pack_root, "__init__.py"),
                                                  submodule_search_locations=[pack_root])
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------- executing
class StubServer:
    """What PromptExecutor needs of PromptServer: a client id, the last node id and `send_sync`."""

    def __init__(self) -> None:
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.sockets_metadata: dict = {}
        self.events: list[tuple[str, Any]] = []

    def send_sync(self, event: str, data: Any, sid: Any = None) -> None:
        self.events.append((event, data))

    def queue_updated(self) -> None:
        pass


def new_executor():
    """A PromptExecutor with the classic cache, as main.py makes it for --cache-classic (0.33 reads "ram" and
    "ram_inactive" even then): a fresh one per graph shares no cached output with another."""
    import execution
    return execution.PromptExecutor(StubServer(), cache_type=execution.CacheType.CLASSIC,
                                    cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})


def cached_outputs(executor, node_id: str) -> list:
    """A node's raw outputs from the executor's output cache. ComfyUI 0.33's cache `get` is a coroutine returning a
    `CacheEntry(ui, outputs)`; 0.3.x returned the outputs list itself, synchronously."""
    entry = executor.caches.outputs.get(node_id)
    if inspect.isawaitable(entry):
        entry = asyncio.run(entry)
    if entry is None:
        return []
    return list(entry.outputs) if hasattr(entry, "outputs") else list(entry)


def tensors(value: Any, path: str, torch, depth: int = 0):
    """(path, tensor) for every tensor in a node output: plain values, dicts, lists, dataclasses; not modules, nor
    transformers configs (numbers only; from 5.2x some of their fields raise when read on a per-layer config)."""
    if depth > 6 or isinstance(value, torch.nn.Module) or type(value).__module__.startswith("transformers."):
        return
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensors(item, f"{path}.{key}", torch, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, f"{path}[{i}]", torch, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors(getattr(value, f.name), f"{path}.{f.name}", torch, depth + 1)
