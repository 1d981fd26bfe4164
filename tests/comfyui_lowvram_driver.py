"""Run API workflows through ComfyUI's own executor under its low-VRAM states, on a simulated card, on the CPU; write a
JSON report.

    COMFYUI_PYTHON tests/comfyui_lowvram_driver.py --comfyui ROOT --pack LINK --models DIR --out DIR \
        --report FILE WORKFLOW.json...

Started by tests/test_comfyui_lowvram.py with ComfyUI's interpreter, set up by tests/comfyui_boot.py as
tests/comfyui_inprocess_driver.py is. Under `--cpu` model management never loads partially: the compute device is the CPU, so
`load_models_gpu` treats every model as DISABLED (loaded whole). Each mode after the reference therefore runs ComfyUI's
own model management against a simulated card (`SimulatedCard`):

- the compute device is `cpu:0`, a device that is not `cpu` to model management (`is_device_cpu` says no for it
  alone), so `load_models_gpu` computes `lowvram_model_memory`, evicts with `free_memory` and loads through
  `ModelPatcher.partially_load` exactly as for a GPU; tensors "moved" there stay in host memory, so the forward
  passes run on the CPU as in the reference;
- `get_free_memory`/`get_total_memory` of that device answer for a card of `card_bytes`, less what
  `current_loaded_models` says is loaded on it;
- `vram_state` is set as `--lowvram`/`--novram` set it, `EXTRA_RESERVED_VRAM` as `--reserve-vram N` sets it (N GiB),
  and `MIN_WEIGHT_MEMORY_RATIO` is the NVIDIA value (0).

What ComfyUI decided is read from its own bookkeeping (ModelPatcher marks every loaded module
`comfy_patched_weights`), which is what the bridge reads too; device placement cannot show it on a CPU-only machine.
The report holds, per mode: every pack node's raw output tensors as sha256 digests; each model load the pack made
(ComfyUI's loaded bytes, the size, blocks streamed and their bytes, modules ComfyUI left unloaded); the partial
unloads and detaches model management did to the pack's models; the bytes the streamers copied.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import time
import traceback
from typing import Any

import comfyui_boot as boot
GIB, MIB = 2**30, 2**20


class SimulatedCard:
    """Model management's memory queries for the device `cpu:0` answer for a card of `card_bytes` (see the module
    docstring); `apply(mode)` sets the flags' state, `reference()` puts ComfyUI's own `--cpu` functions back."""

    def __init__(self, mm) -> None:
        import torch
        self.mm, self.device, self.card_bytes = mm, torch.device("cpu", 0), 0
        self.real = {name: getattr(mm, name) for name in ("get_torch_device", "is_device_cpu", "get_free_memory",
                                                          "get_total_memory")}
        self.real_state = (mm.vram_state, mm.EXTRA_RESERVED_VRAM, mm.MIN_WEIGHT_MEMORY_RATIO)

    def _ours(self, device) -> bool:
        return getattr(device, "type", None) == "cpu" and getattr(device, "index", None) == 0

    def used(self) -> int:
        """The weights on the card: of every model loaded on it, all but the modules ModelPatcher left unloaded
        (unmarked loading units; whatever else the pack moved there counts, as it would on a GPU)."""
        used = 0
        for loaded in self.mm.current_loaded_models:
            if loaded.model is None or not self._ours(loaded.device):
                continue
            left = sum(sum(t.numel() * t.element_size() for t in (*m._parameters.values(), *m._buffers.values())
                           if t is not None)
                       for m in loaded.model.model.modules()
                       if _is_load_unit(m) and getattr(m, "comfy_patched_weights", False) is not True)
            used += loaded.model.model_size() - left
        return used

    def free(self, dev=None, torch_free_too=False):
        if not self._ours(dev if dev is not None else self.device):
            return self.real["get_free_memory"](dev, torch_free_too)
        free = self.card_bytes - self.used()
        return (free, 0) if torch_free_too else free

    def total(self, dev=None, torch_total_too=False):
        if not self._ours(dev if dev is not None else self.device):
            return self.real["get_total_memory"](dev, torch_total_too)
        return (self.card_bytes, 0) if torch_total_too else self.card_bytes

    def apply(self, state: str, weight_bytes: int, reserve_gib: float | None) -> None:
        """`state` as the flag sets it; a card with room for `weight_bytes` of weights beside ComfyUI's minimum
        inference memory (0.8 GiB and the default reserve); `reserve_gib` as `--reserve-vram` sets it."""
        mm = self.mm
        self.reference()
        self.card_bytes = int(mm.minimum_inference_memory()) + weight_bytes
        mm.get_torch_device = lambda: self.device
        mm.is_device_cpu = lambda device: self.real["is_device_cpu"](device) and not self._ours(device)
        mm.get_free_memory, mm.get_total_memory = self.free, self.total
        mm.vram_state = mm.VRAMState[state]
        if reserve_gib is not None:
            mm.EXTRA_RESERVED_VRAM = reserve_gib * 1024 * 1024 * 1024
        mm.MIN_WEIGHT_MEMORY_RATIO = 0.0  # the NVIDIA value

    def reference(self) -> None:
        for name, function in self.real.items():
            setattr(self.mm, name, function)
        self.mm.vram_state, self.mm.EXTRA_RESERVED_VRAM, self.mm.MIN_WEIGHT_MEMORY_RATIO = self.real_state


def _is_load_unit(module) -> bool:
    """ModelPatcher's loading unit (its `_load_list`): parameters of its own and none in a submodule."""
    own = {id(p) for p in module._parameters.values() if p is not None}
    return bool(own) and all(id(p) in own for p in module.parameters())


def _digest(tensor) -> str:
    import torch
    t = tensor.detach().cpu().contiguous()
    raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
    return f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:24]


def lora_case(spec: dict, card: SimulatedCard, pack) -> dict:
    """A LoRA'd tiny transformer (float32) denoised loaded whole (`--cpu`) and loaded partially on the LOW_VRAM card,
    where the LoRA'd layers ComfyUI leaves behind stream and get the patch on each device copy: the x0s, the LoRA's
    own effect for scale, how many streamed weights carried a patch, and whether unloading left every weight as read
    from the file."""
    import torch
    T, handles, assets = pack("ltx.dit.transformer"), pack("comfy.handles"), pack("ltx.files.assets")
    lora, streaming, bridge = pack("ltx.files.lora"), pack("ltx.streaming"), pack("comfy.bridge")
    dims = pack("tools.tiny.common").TINY_DIMS
    model = T.load_transformer(spec["transformer"], torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    base = handles.Loaded.register(model, assets.inspect_asset(spec["transformer"]))
    patched = base.with_weight_deltas(lora.read_lora(spec["lora"], lora.LoraTargets.of(model, T.KEY_MAP)), 0.7)
    g = torch.Generator().manual_seed(3)
    video, audio = torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g)
    cond = pack("ltx.conditioning").Conditioning(torch.randn(1, 1024, dims["video_inner"], generator=g),
                                                 torch.randn(1, 1024, dims["audio_inner"], generator=g))

    def run(handle) -> tuple:
        module = handle.ready()
        with torch.inference_mode():
            x0 = T.denoise(module, video, audio, 0.6, cond, 24.0)
        streamer = streaming.streamer_of(module)
        counts = (sum(len(s.transforms) for s in streamer.streamed.values()), streamer.streamed_count) \
            if streamer else (0, 0)
        bridge.unload_model(handle.patcher)
        return x0, counts

    def relative(a, b) -> float:
        return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))

    card.reference()
    plain, _ = run(base)
    resident, _ = run(patched)
    card.apply("LOW_VRAM", spec["weight_bytes"], None)
    streamed, (patches, blocks) = run(patched)
    card.reference()
    return {"streamed_patches": patches, "streamed_blocks": blocks, "lora_effect": relative(resident, plain),
            "streamed_vs_resident": relative(streamed, resident),
            "restored": all(torch.equal(t, original[k]) for k, t in model.state_dict().items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--comfyui", "--pack", "--models", "--out", "--report"):
        parser.add_argument(name, required=True)
    parser.add_argument("--modes", required=True,
                        help="JSON list of {name, state (a VRAMState name, null: --cpu), weight_bytes, reserve_gib, "
                             "preview_evicts}")
    parser.add_argument("--lora", default="", help="JSON {transformer, lora, weight_bytes}: the streamed-LoRA case")
    parser.add_argument("workflows", nargs="+")
    args = parser.parse_args(argv)
    boot.comfy_flags(args.comfyui)
    report: dict[str, Any] = {"modes": {}}
    boot.set_folders(args.out, args.models)

    import torch
    import comfy.model_management as mm
    import comfy.model_patcher
    import execution
    import latent_preview
    pack = boot.load_pack(args.pack)
    report["pack_loaded"] = pack.loaded
    # ComfyUI imports the pack under a name made from its folder's path (boot.Pack.package)
    pack_name = pack.package
    bridge, streaming, encoder = (pack.module(name) for name in ("comfy.bridge", "ltx.streaming", "ltx.text.encoder"))
    comfy_models = bridge.comfy_models  # the bridge's ComfyUI placement, whose internals the observers read
    pack_classes = set(pack.classes)
    card = SimulatedCard(mm)

    # Observers: each load the pack asks for, what model management did to its models, the streamers made.
    loads: list[dict] = []
    events: list[dict] = []
    streamers: dict[int, Any] = {}
    ours: dict[int, str] = {}
    real_load_models = bridge.load_models

    def observed_load_models(patchers, memory_required=0):
        asked.clear()
        real_load_models(patchers, memory_required)
        for patcher in patchers:
            remember_roots(patcher)
            engine = comfy_models._engine_module(patcher)
            name = type(engine).__name__
            ours[id(patcher.model)] = name
            streamer = streaming.streamer_of(engine)
            if streamer is not None:
                streamers[id(streamer)] = (name, streamer)
            units = [m for m in patcher.model.modules() if _is_load_unit(m)]
            in_blocks = {id(m) for block in streaming.blocks_of(engine) for m in block.modules()}
            left = [m for m in units if getattr(m, "comfy_patched_weights", False) is not True]
            loads.append({
                "model": name, "memory_required": int(memory_required), "size": int(patcher.model_size()),
                "comfy_loaded": int(patcher.loaded_size()), "blocks": len(streaming.blocks_of(engine)),
                "streamed_blocks": streamer.streamed_count if streamer else 0,
                "streamed_bytes": sum(s.nbytes for s in streamer.streamed.values()) if streamer else 0,
                "units": len(units), "units_on_host": len(left), "card_used": int(card.used()),
                "block_units": sum(id(m) in in_blocks for m in units),
                "on_host_outside_blocks": sum(id(m) not in in_blocks for m in left),
                "asked": asked[-1] if asked else None,
                "held_beside_budget": streaming.slot_reserve(engine) + streaming.outside_blocks_bytes(engine)})

    bridge.load_models = observed_load_models
    roots: dict[int, Any] = {}  # id of every module of a pack model → its patcher's root module

    def remember_roots(patcher) -> None:
        for module in patcher.model.modules():
            roots[id(module)] = patcher.model

    def placed(root) -> bool:
        """Model management has the model loaded and the bridge settled that very placement."""
        engine = root.inner if isinstance(root, comfy_models._DeviceHolder) else root
        settled = vars(engine).get("_ltx25_settled")
        return any(entry.model is not None and entry.model.model is root and settled is not None
                   and settled[0] == comfy_models._placement_token(entry.model) for entry in mm.current_loaded_models)

    off_placement: set[str] = set()

    def check_placement(module, _args) -> None:
        root = roots.get(id(module))
        if root is not None and not placed(root):
            off_placement.add(type(root).__name__)

    torch.nn.modules.module.register_module_forward_pre_hook(check_placement)
    real_partially_unload = comfy.model_patcher.ModelPatcher.partially_unload
    real_detach = comfy.model_patcher.ModelPatcher.detach

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        freed = real_partially_unload(self, device_to, memory_to_free, force_patch_weights)
        if id(self.model) in ours:
            events.append({"event": "partially_unload", "model": ours[id(self.model)], "freed": int(freed)})
        return freed

    def detach(self, unpatch_all=True):
        if id(self.model) in ours:
            events.append({"event": "detach", "model": ours[id(self.model)], "unpatch_all": bool(unpatch_all)})
        return real_detach(self, unpatch_all)

    real_load = comfy.model_patcher.ModelPatcher.load

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        real_load(self, device_to, lowvram_model_memory, force_patch_weights, full_load)
        if type(self.model).__module__.startswith(pack_name):
            engine = comfy_models._engine_module(self)
            events.append({"event": "load", "model": type(engine).__name__,
                           "lowvram_model_memory": float(lowvram_model_memory), "full_load": bool(full_load),
                           "loaded_by_comfy": int(self.model.model_loaded_weight_memory),
                           "size": int(self.model_size())})

    real_load_models_gpu = mm.load_models_gpu
    asked: list[int] = []  # memory_required of each load_models_gpu call

    def load_models_gpu(models, memory_required=0, *a, **kw):
        asked.append(int(memory_required))
        return real_load_models_gpu(models, memory_required, *a, **kw)

    mm.load_models_gpu = load_models_gpu
    comfy.model_patcher.ModelPatcher.partially_unload = partially_unload
    comfy.model_patcher.ModelPatcher.detach = detach
    comfy.model_patcher.ModelPatcher.load = load

    # A previewer whose drawing makes model management free memory, as loading a TAE previewer's model does on a full
    # card: at odd steps half of what the loaded models hold (a partial unload), at even steps all of it.
    real_preview = latent_preview.Latent2RGBPreviewer.decode_latent_to_preview
    previews = [0]

    def evicting_preview(self, x0):
        previews[0] += 1
        device = mm.get_torch_device()
        held = sum(entry.model_loaded_memory() for entry in mm.current_loaded_models if entry.model is not None)
        wanted = mm.get_free_memory(device) + held // 2 if previews[0] % 2 else 1e30
        events.append({"event": "preview frees", "bytes": float(wanted - mm.get_free_memory(device))})
        mm.free_memory(wanted, device)
        return real_preview(self, x0)

    latent_preview.Latent2RGBPreviewer.decode_latent_to_preview = evicting_preview

    for mode in json.loads(args.modes):
        entry: dict[str, Any] = report["modes"].setdefault(mode["name"], {"workflows": {}})
        if mode["state"] is None:
            card.reference()
        else:
            card.apply(mode["state"], mode["weight_bytes"], mode.get("reserve_gib"))
        preview = "latent2rgb" if mode.get("preview_evicts") else "none"  # the frontend's per-prompt choice
        entry.update(vram_state=mm.vram_state.name, card_bytes=card.card_bytes,
                     extra_reserved=int(mm.extra_reserved_memory()), device=str(mm.get_torch_device()))
        for path in args.workflows:
            name = os.path.splitext(os.path.basename(path))[0]
            result: dict[str, Any] = entry["workflows"].setdefault(name, {})
            with open(path, encoding="utf-8") as f:
                prompt = json.load(f)
            loads.clear()
            events.clear()
            streamers.clear()
            off_placement.clear()
            encoder.clear_caches()  # the prompt cache would skip the text encoder after the first mode
            t0 = time.perf_counter()
            try:
                valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(name, prompt, None))
                if not valid:
                    result.update(valid=False, validation_error=error, node_errors=node_errors)
                    continue
                executor = boot.new_executor()
                executor.execute(prompt, name, {"client_id": None, "preview_method": preview}, outputs)
                result["success"] = bool(executor.success)
                result["errors"] = [[event, {k: v for k, v in data.items() if k != "current_inputs"}]
                                    for event, data in executor.status_messages if event == "execution_error"]
                digests = {}
                for node_id, node in prompt.items():
                    if node["class_type"] not in pack_classes:
                        continue
                    for i, per_output in enumerate(boot.cached_outputs(executor, node_id)):
                        for label, t in boot.tensors(per_output, f"{node_id}:{node['class_type']}[{i}]", torch):
                            digests[label] = _digest(t)
                result["digests"] = digests
                result["loads"] = list(loads)
                result["events"] = list(events)
                copied: dict[str, int] = {}
                for model_name, streamer in streamers.values():
                    copied[model_name] = copied.get(model_name, 0) + int(streamer.bytes_copied)
                result["bytes_streamed"] = copied
                result["forwards_off_placement"] = sorted(off_placement)
                executor = None
            except Exception:  # the report carries the traceback; the test prints it
                result["exception"] = traceback.format_exc()
            result["seconds"] = round(time.perf_counter() - t0, 2)
            mm.unload_all_models()  # each mode starts from an empty card
            gc.collect()

    if args.lora:
        try:
            report["lora"] = lora_case(json.loads(args.lora), card, pack.module)
        except Exception:  # the report carries the traceback; the test prints it
            report["lora"] = {"exception": traceback.format_exc()}
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    card.reference()
    mm.unload_all_models()
    gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
