"""The A/B graph inside ComfyUI 0.33 under its low-VRAM flags (issue 19): seconds, peak memory, and whether the outputs
equal the uncapped run, per flag set.

    python bench/bench_comfyui_lowvram.py --comfyui .comfy/ComfyUI --site /tmp/comfy_site --out $OUT/x.json
    python bench/bench_comfyui_lowvram.py --comfyui /work/comfyui-033 --smoke      # CPU: the plumbing, tiny set

ComfyUI runs in this process as tests/comfyui_inprocess_driver.py runs it: its own executor (`PromptExecutor`) and model
management, the pack loaded by `nodes.load_custom_node` from a custom_nodes link (the pack root never goes on
`sys.path`: its package `nodes` would shadow ComfyUI's). On CUDA the graph runs at 768×512×121 with real-shape RANDOM
weights built in memory by bench/bench_ab_graph.py's `build_real` (real files are 66 GB), offloaded to the host as
the loaders leave them; the pack's loader nodes hand those out. Then, in one process:

- `uncapped`: ComfyUI's defaults, the whole card;
- `normal`, `lowvram`, `reserve`, `novram`: a filler allocation leaves `--card-gib` usable and model management runs
  as with no flag, `--lowvram`, `--reserve-vram R` (`--reserve-gib`) or `--novram` (the module state those flags set
  when ComfyUI starts: `vram_state`, `EXTRA_RESERVED_VRAM`; every model is unloaded between flag sets).

Per flag set: wall seconds, each pack node's seconds and peak allocated memory (the filler not counted), each model
load the pack asked for (how much ComfyUI loaded, blocks streamed and bytes per forward), sha256 digests of every
tensor the pack nodes returned compared with `uncapped` (the latents and audio must match bit for bit; the frames
match when both decoders planned the same tiles, which the decode stats show). The samplers run eagerly in every set
(`--acceleration`): a model that streams runs eagerly anyway, and CUDA graphs are not bit-identical to eager. Dynamic
VRAM (comfy-aimdo) is not started (main.py starts it; `--novram` disables it anyway); the pack's models use ComfyUI's
classic ModelPatcher either way.

ComfyUI needs packages the GPU machine may lack. `--site DIR` (appended to `sys.path`, so the machine's own packages
win) holds the carried wheels of .comfy/wheels; ComfyUI modules still missing after that and imported by ComfyUI only
for models this graph never builds (scipy, torchvision, torchaudio, comfy_kitchen) are replaced by stubs that raise
when used; the JSON lists them (`stubbed`).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import importlib
import importlib.abc
import importlib.util
import importlib.machinery
import inspect
import json
import os
import pkgutil
import sys
import tempfile
import time
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.dirname(os.path.abspath(__file__))
WORKFLOW = os.path.join(ROOT, "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json")
PACK_FOLDER = "ltx25_nodes"
GiB = 2**30
MODES = ("uncapped", "normal", "lowvram", "reserve", "novram")
STATES = {"uncapped": "NORMAL_VRAM", "normal": "NORMAL_VRAM", "lowvram": "LOW_VRAM", "reserve": "NORMAL_VRAM",
          "novram": "NO_VRAM"}
# Imported by ComfyUI's modules for models and features this graph never touches.
STUBBABLE = ("scipy", "torchvision", "torchaudio", "comfy_kitchen")
SAMPLERS = ("10", "12")
LATENT_NODES = ("LTX25DistilledSampler", "LTX25LatentUpsample", "LTX25AudioDecode")


# ------------------------------------------------------------------------------------------------ environment
class _Unavailable:
    """Stands in for anything of a stubbed package: usable as a decorator target or base, raises when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is not installed here (a stub from bench_comfyui_lowvram.py)")


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


def prepare_imports(comfy_root: str, site: str | None) -> _StubFinder | None:
    """ComfyUI's root first on `sys.path`, the carried site last; for what is still missing, a stub finder serving
    ComfyUI's own imports (installed after transformers and diffusers have looked for the real packages)."""
    here = {os.path.abspath(p) for p in (BENCH, ROOT)}
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) not in here]
    sys.path.insert(0, comfy_root)
    if site:
        sys.path.append(site)
    missing = {name for name in STUBBABLE if importlib.util.find_spec(name) is None}
    if not missing:
        return None
    import diffusers  # noqa: F401  (their import-time probes see the packages as they are)
    import transformers  # noqa: F401
    finder = _StubFinder(missing, comfy_root)
    sys.meta_path.append(finder)
    return finder


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


# ------------------------------------------------------------------------------------------------ observation
def _digest(tensor) -> str:
    import torch
    t = tensor.detach().contiguous().cpu()
    raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
    return f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:24]


def _boot() -> types.ModuleType:
    """tests/comfyui_boot.py, loaded by its path (standard library only): the executor helpers the real-ComfyUI
    tier's drivers share, `cached_outputs` and `tensors`, so the bench reads outputs exactly as the tier does."""
    spec = importlib.util.spec_from_file_location("ltx25_comfyui_boot", os.path.join(ROOT, "tests", "comfyui_boot.py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


class StubServer:
    """What PromptExecutor needs of PromptServer."""

    def __init__(self) -> None:
        self.client_id = self.last_node_id = self.last_prompt_id = None
        self.sockets_metadata: dict = {}

    def send_sync(self, event, data, sid=None) -> None:
        pass

    def queue_updated(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------ the run
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", default=os.path.join(ROOT, ".comfy", "ComfyUI"), help="ComfyUI 0.33's source")
    parser.add_argument("--site", default=None, help="a folder of packages installed from .comfy/wheels")
    parser.add_argument("--card-gib", type=float, default=24.0, help="usable GiB for the capped flag sets")
    parser.add_argument("--reserve-gib", type=float, default=4.0, help="--reserve-vram for the `reserve` set")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--acceleration", default="eager",
                        help="the samplers' acceleration in every flag set (eager: a streamed model runs eagerly, "
                             "and CUDA graphs are not bit-identical to eager, so eager keeps the outputs comparable)")
    parser.add_argument("--transformer", choices=("bf16", "nvfp4"), default="bf16",
                        help="CUDA: nvfp4 keeps the DiT blocks' Linears packed, as the -nvfp4 file loads as stored")
    parser.add_argument("--deadline-s", type=float, default=450.0,
                        help="skip the flag sets that would end after this many seconds of the run")
    parser.add_argument("--smoke", action="store_true", help="CPU (--cpu), the loader nodes' tiny models handed out")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_comfyui_lowvram.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or modes[0] != "uncapped":
        parser.error(f"--modes: start with uncapped, then any of {', '.join(MODES[1:])} (got {args.modes})")
    stubs = prepare_imports(os.path.abspath(args.comfyui), args.site)
    result: dict = {"bench": "comfyui_lowvram", "stubbed": sorted(stubs.names) if stubs else [],
                    "card_gib": args.card_gib,
                    "reserve_gib": args.reserve_gib, "modes": {}, "errors": {}}

    import comfy.options  # noqa: F401  (argument parsing stays off: args hold the defaults)
    from comfy.cli_args import args as comfy_args
    comfy_args.cpu = args.smoke
    comfy_args.disable_api_nodes = True
    import torch
    boot = _boot()
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    try:
        import folder_paths
        import comfy.model_management as mm
        import comfyui_version
        import execution
        import nodes
    except ImportError as error:  # a requirement neither the machine nor .comfy/wheels has
        traceback.print_exc()
        result["errors"]["import"] = f"{type(error).__name__}: {error}"
        return _finish(result, args.out, 1)
    if stubs is not None:
        stubs.forget()
    result.update(comfyui=comfyui_version.__version__, torch=torch.__version__,
                  device=torch.cuda.get_device_name(0) if not args.smoke else "cpu")

    work = tempfile.mkdtemp(prefix="bench_comfyui_lowvram_")
    models, output = os.path.join(work, "models"), os.path.join(work, "output")
    folder_paths.set_output_directory(output)
    folder_paths.set_temp_directory(os.path.join(output, "temp"))
    for folder in ("diffusion_models", "text_encoders", "vae", "latent_upscale_models", "loras"):
        folder_paths.add_model_folder_path(folder, os.path.join(models, folder), is_default=True)
    os.makedirs(os.path.join(work, "custom_nodes"))
    link = os.path.join(work, "custom_nodes", PACK_FOLDER)
    os.symlink(ROOT, link, target_is_directory=True)
    builtin = set(nodes.NODE_CLASS_MAPPINGS)
    if not asyncio.run(nodes.load_custom_node(link, ignore=builtin, module_parent="custom_nodes")):
        result["errors"]["pack"] = "ComfyUI could not import the pack (see the log above)"
        return _finish(result, args.out, 1)
    bridge_name = next(n for n, m in sys.modules.items() if n.endswith(".nodes.comfy.bridge") and m is not None)
    package = bridge_name[: -len(".nodes.comfy.bridge")]
    pack = lambda name: importlib.import_module(f"{package}.nodes.{name}")  # noqa: E731
    bridge, streaming, encoder = pack("comfy.bridge"), pack("ltx.streaming"), pack("ltx.text.encoder")
    pack("tools.tiny").write_tiny_set(models)  # the loaders' widgets list these names (the official ones)
    pack_classes = {name: cls for name, cls in nodes.NODE_CLASS_MAPPINGS.items()
                    if getattr(cls, "RELATIVE_PYTHON_MODULE", None) == f"custom_nodes.{PACK_FOLDER}"}

    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    width, height, frames = (192, 128, 17) if args.smoke else (768, 512, 121)
    prompt["5"]["inputs"].update(width=width, height=height, frames=frames)
    for node_id in SAMPLERS:
        prompt[node_id]["inputs"]["acceleration"] = args.acceleration
    result["shape"], result["acceleration"] = f"{width}x{height}x{frames}", args.acceleration
    device = torch.device("cpu") if args.smoke else mm.get_torch_device()
    with pack_as_nodes(package):
        import bench_ab_graph
        if not args.smoke:
            torch.backends.cudnn.benchmark = True
            tiny_te = os.path.join(models, "text_encoders", "gemma4-12b-with-proj-ltx-2.5-bf16.safetensors")
            preset, result["build_s"], gemma = bench_ab_graph.build_real(device, tiny_te, args.transformer)
            result["transformer_format"] = args.transformer
    # the helpers built with the classes ComfyUI's copy of the pack uses (else its nodes refuse their handles)
    result["helpers_use_comfyuis_pack"] = bench_ab_graph.Loaded is pack("comfy.handles").Loaded
    if args.smoke:  # the loader nodes' own outputs on the tiny files, handed out the same way
        preset = {node_id: tuple(getattr(pack_classes[prompt[node_id]["class_type"]](), "load")(
            **prompt[node_id]["inputs"])) for node_id in bench_ab_graph.LOADERS}
    else:
        for outputs in preset.values():  # offloaded, as the loaders leave them
            handle = outputs[0]
            if hasattr(handle, "module"):
                handle.module.to("cpu")
        gemma.to("cpu")
        torch.cuda.empty_cache()
    _hand_out(pack_classes, preset)

    # Observers: each pack node's seconds and peak memory; each load the pack asks for.
    nodes_seen: dict[str, dict] = {}
    filler_bytes = [0]

    def start(name: str) -> dict:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        row = {"node": name, "t": time.perf_counter()}
        nodes_seen.setdefault(name, []).append(row)
        return row

    def end(row: dict) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            row["peak_gib"] = round((torch.cuda.max_memory_allocated(device) - filler_bytes[0]) / GiB, 2)
        row["s"] = round(time.perf_counter() - row.pop("t"), 3)

    for name, cls in pack_classes.items():
        original = getattr(cls, cls.FUNCTION)
        if inspect.iscoroutinefunction(original):
            async def timed(self, *a, __original=original, __name=name, **kw):
                row = start(__name)
                try:
                    return await __original(self, *a, **kw)
                finally:
                    end(row)
        else:
            def timed(self, *a, __original=original, __name=name, **kw):
                row = start(__name)
                try:
                    return __original(self, *a, **kw)
                finally:
                    end(row)
        setattr(cls, cls.FUNCTION, timed)
    loads: list[dict] = []
    real_load_models = bridge.load_models

    def observed_load_models(patchers, memory_required=0):
        real_load_models(patchers, memory_required)
        for patcher in patchers:
            engine = bridge.comfy_models._engine_module(patcher)
            streamer = streaming.streamer_of(engine)
            loads.append({"model": type(engine).__name__, "size_gib": round(patcher.model_size() / GiB, 2),
                          "comfy_loaded_gib": round(patcher.loaded_size() / GiB, 2),
                          "blocks": len(streaming.blocks_of(engine)),
                          "streamed_blocks": streamer.streamed_count if streamer else 0,
                          "streamed_gib_per_forward": round(sum(s.nbytes for s in streamer.streamed.values()) / GiB, 2)
                          if streamer else 0.0})

    bridge.load_models = observed_load_models
    reference = None
    defaults = (mm.vram_state, mm.EXTRA_RESERVED_VRAM)
    last_seconds = 0.0
    for mode in modes:
        elapsed = time.perf_counter() - started
        if last_seconds and elapsed + 1.2 * last_seconds > args.deadline_s:
            result["modes"][mode] = {"skipped": f"would end after --deadline-s {args.deadline_s:.0f} s"}
            continue
        mm.unload_all_models()
        encoder.clear_caches()  # Encode Prompt would reuse the first mode's features
        gc.collect()
        filler = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
            if mode != "uncapped":
                total = torch.cuda.mem_get_info(device)[1]
                filler = torch.empty(int(total - args.card_gib * GiB), dtype=torch.uint8, device=device)
            filler_bytes[0] = filler.numel() if filler is not None else 0
        mm.vram_state = mm.VRAMState[STATES[mode]] if device.type == "cuda" else defaults[0]
        mm.EXTRA_RESERVED_VRAM = args.reserve_gib * GiB if mode == "reserve" else defaults[1]
        nodes_seen.clear()
        loads.clear()
        folder_paths.set_output_directory(os.path.join(output, mode))
        entry: dict = {"vram_state": mm.vram_state.name, "extra_reserved_gib": round(mm.EXTRA_RESERVED_VRAM / GiB, 2),
                       "usable_gib": args.card_gib if filler is not None else None}
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(mode, prompt, None))
            if not valid:
                raise RuntimeError(f"invalid prompt: {error} {node_errors}")
            executor = execution.PromptExecutor(StubServer(), cache_type=execution.CacheType.CLASSIC,
                                                cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
            executor.execute(prompt, mode, {"client_id": None, "preview_method": "none"}, outputs)
            entry["success"] = bool(executor.success)
            entry["errors"] = [data.get("exception_message", "")[:2000] for event, data in executor.status_messages
                               if event == "execution_error"]
            digests = {}
            for node_id, node in prompt.items():
                if node["class_type"] in pack_classes:
                    for i, value in enumerate(boot.cached_outputs(executor, node_id)):
                        for label, t in boot.tensors(value, f"{node_id}:{node['class_type']}[{i}]", torch):
                            digests[label] = _digest(t)
                    for value in boot.cached_outputs(executor, node_id):  # the decoders' tile plans
                        stats = getattr(value[0] if isinstance(value, list) and value else value, "as_dict", None)
                        if callable(stats):
                            entry.setdefault("decode_stats", {})[node_id] = stats()
            executor = None
        except Exception as error:  # recorded; the traceback goes to stderr
            traceback.print_exc()
            entry["success"], entry["errors"] = False, [f"{type(error).__name__}: {error}"]
            digests = {}
        entry["wall_s"] = round(time.perf_counter() - t0, 2)
        last_seconds = entry["wall_s"]
        if device.type == "cuda":
            entry["peak_gib"] = round((torch.cuda.max_memory_allocated(device) - filler_bytes[0]) / GiB, 2)
        entry["nodes"] = nodes_seen.copy()
        entry["loads"] = list(loads)
        if mode == "uncapped":
            reference = digests
        elif reference and digests:
            differing = sorted(label for label in reference if digests.get(label) != reference[label])
            entry["outputs_match_uncapped"] = not differing
            entry["latents_and_audio_match_uncapped"] = not [
                label for label in differing if any(kind in label for kind in LATENT_NODES)]
            entry["differing"] = differing
        result["modes"][mode] = entry
        print(f"[bench] {mode}: {'ok' if entry.get('success') else 'FAILED'} in {entry['wall_s']:.1f} s, peak "
              f"{entry.get('peak_gib', float('nan')):.2f} GiB, outputs match: {entry.get('outputs_match_uncapped')}",
              file=sys.stderr, flush=True)
        del filler
        filler_bytes[0] = 0
    mm.vram_state, mm.EXTRA_RESERVED_VRAM = defaults
    result["total_s"] = round(time.perf_counter() - started, 1)
    ok = all(m.get("success", True) for m in result["modes"].values())
    return _finish(result, args.out, 0 if ok else 1)


def _hand_out(pack_classes: dict, preset: dict) -> None:
    """The pack's loader nodes return the in-memory modules (by node: bench_ab_graph's loader node ids)."""
    by_class = {"LTX25TransformerLoader": "1", "LTX25TextEncoderLoader": "2", "LTX25UpsamplerLoader": "6",
                "LTX25AudioVAELoader": "9"}
    for name, node_id in by_class.items():
        setattr(pack_classes[name], "load", lambda self, *a, __id=node_id, **kw: preset[__id])

    def video_vae(self, vae_file: str, weight_dtype: str):
        return preset["7"] if "conv" in vae_file else preset["8"]
    pack_classes["LTX25VideoVAELoader"].load = video_vae


def _finish(result: dict, out: str | None, code: int) -> int:
    line = json.dumps(result, default=str)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    print(line)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
