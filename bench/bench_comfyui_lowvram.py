"""The A/B graph inside ComfyUI 0.33 under its low-VRAM flags (issue 19): seconds, peak memory, and whether the outputs
equal the uncapped run, per flag set.

    python bench/bench_comfyui_lowvram.py --comfyui .comfy/ComfyUI --site .comfy/site.tar.xz --out $OUT/x.json
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

ComfyUI needs packages the GPU machine may lack. `--site` (a folder, or the archive .comfy/site.tar.xz that
bench/comfy_carry.sh packs, unpacked first; appended to `sys.path`, so the machine's own packages win) holds them;
ComfyUI modules still missing after that and imported by ComfyUI only for models this graph never builds (scipy,
torchvision, torchaudio, comfy_kitchen) are replaced by stubs that raise when used; the JSON lists them (`stubbed`).
The ComfyUI set-up is bench/comfy_inprocess.py's, shared with bench/bench_core_graph.py.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
import traceback

from comfy_inprocess import (GiB, ROOT, boot, hand_out_pack_loaders, import_comfyui, load_pack, pack_as_nodes,
                             prepare_imports, set_up_folders, write_result)

WORKFLOW = os.path.join(ROOT, "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json")
MODES = ("uncapped", "normal", "lowvram", "reserve", "novram")
STATES = {"uncapped": "NORMAL_VRAM", "normal": "NORMAL_VRAM", "lowvram": "LOW_VRAM", "reserve": "NORMAL_VRAM",
          "novram": "NO_VRAM"}
SAMPLERS = ("10", "12")
LATENT_NODES = ("LTX25DistilledSampler", "LTX25LatentUpsample", "LTX25AudioDecode")


# ------------------------------------------------------------------------------------------------ observation
def _digest(tensor) -> str:
    import torch
    t = tensor.detach().contiguous().cpu()
    raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
    return f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:24]


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

    try:
        comfy = import_comfyui(cpu=args.smoke)
    except ImportError as error:  # a requirement neither the machine nor .comfy/wheels has
        traceback.print_exc()
        result["errors"]["import"] = f"{type(error).__name__}: {error}"
        return write_result(result, args.out, 1)
    import torch
    folder_paths, mm, execution = comfy.folder_paths, comfy.mm, comfy.execution
    tier = boot()
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    if stubs is not None:
        stubs.forget()
    result.update(comfyui=comfy.version, torch=torch.__version__,
                  device=torch.cuda.get_device_name(0) if not args.smoke else "cpu")

    work = tempfile.mkdtemp(prefix="bench_comfyui_lowvram_")
    models, output = set_up_folders(comfy, work)
    loaded = load_pack(comfy, work)
    if loaded is None:
        result["errors"]["pack"] = "ComfyUI could not import the pack (see the log above)"
        return write_result(result, args.out, 1)
    package, pack_classes = loaded
    pack = lambda name: importlib.import_module(f"{package}.nodes.{name}")  # noqa: E731
    bridge, streaming, encoder = pack("comfy.bridge"), pack("ltx.streaming"), pack("ltx.text.encoder")
    pack("tools.tiny").write_tiny_set(models)  # the loaders' widgets list these names (the official ones)

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
    hand_out_pack_loaders(pack_classes, preset)

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
            executor = tier.new_executor()
            executor.execute(prompt, mode, {"client_id": None, "preview_method": "none"}, outputs)
            entry["success"] = bool(executor.success)
            entry["errors"] = [data.get("exception_message", "")[:2000] for event, data in executor.status_messages
                               if event == "execution_error"]
            digests = {}
            for node_id, node in prompt.items():
                if node["class_type"] in pack_classes:
                    for i, value in enumerate(tier.cached_outputs(executor, node_id)):
                        for label, t in tier.tensors(value, f"{node_id}:{node['class_type']}[{i}]", torch):
                            digests[label] = _digest(t)
                    for value in tier.cached_outputs(executor, node_id):  # the decoders' tile plans
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
    return write_result(result, args.out, 0 if ok else 1)


if __name__ == "__main__":
    raise SystemExit(main())
