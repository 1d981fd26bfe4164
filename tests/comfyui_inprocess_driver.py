"""Run API-format workflows through ComfyUI's own executor, in this process, with no server; write a JSON report.

    COMFYUI_PYTHON tests/comfyui_inprocess_driver.py --comfyui ROOT --pack LINK --models DIR --out DIR \
        --input DIR --report FILE WORKFLOW.json...

Started by tests/test_comfyui_inprocess.py with ComfyUI's interpreter, set up by tests/comfyui_boot.py: ComfyUI's
root goes first on `sys.path`; the pack root never does (its package `nodes` would shadow ComfyUI's `nodes.py`): the
pack is loaded only through `nodes.load_custom_node`, from a `custom_nodes/<folder>` link, exactly as the server
loads it. `--input` is ComfyUI's input folder, where core Load Image / Load Audio find the conditioning templates'
files.

The report holds, per workflow: validation, executor success and messages, the UI outputs; and two observations
taken while the real executor ran:
- `node_calls`: for every call of a pack node's FUNCTION, whether inference mode was on and grad off inside it;
- `tensors`: `is_inference()` of every tensor in the pack nodes' raw outputs (the executor's output cache);
- `handles` / `load_models_gpu`: the model-management patcher of every model handle a pack node returned, whether
  ComfyUI's `load_models_gpu` received it, and whether its module (or a submodule) ran a forward pass;
  `loaded_models_after`: `current_loaded_models` afterwards;
and `conditioning`: what each sampler holds of its guides (tests/conditioning_checks.py `measure`).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import inspect
import json
import os
import time
import traceback
from typing import Any

import comfyui_boot as boot  # this script's folder is still first on sys.path here; boot.comfy_flags takes it off


# case → (core node id, its inputs; "{file}" is the file): the loader a core user picks for each tiny file.
CORE_LOADERS = {
    "transformer": ("UNETLoader", {"unet_name": "{file}", "weight_dtype": "default"}),
    "conv_vae": ("VAELoader", {"vae_name": "{file}"}),
    "diffusion_vae": ("VAELoader", {"vae_name": "{file}"}),
    "audio_vae": ("VAELoader", {"vae_name": "{file}"}),
    "audio_vae_ltxv_loader": ("LTXVAudioVAELoader", {"ckpt_name": "{file}"}),
    "upsampler": ("LatentUpscaleModelLoader", {"model_name": "{file}"}),
}


def _load_with_core(nodes, case: str, folder: str, name: str) -> dict:
    """Call core's loader node for `case` on `name` directly (a loader alone is no prompt: it has no output node);
    what it returned (types, the model class inside), or its traceback."""
    from comfy_api.internal import _ComfyNodeInternal
    node_id, inputs = CORE_LOADERS[case]
    cls = nodes.NODE_CLASS_MAPPINGS[node_id]
    kwargs = {key: value.format(file=name) for key, value in inputs.items()}
    entry: dict[str, Any] = {"node": node_id, "folder": folder, "file": name}
    try:
        if issubclass(cls, _ComfyNodeInternal):  # a v3 node: a classmethod returning NodeOutput
            returned = tuple(cls.execute(**kwargs).result)
        else:
            returned = tuple(getattr(cls(), cls.FUNCTION)(**kwargs))
    except Exception:  # the report carries the traceback; the test prints it
        entry.update(ok=False, error=traceback.format_exc()[-4000:])
        return entry
    inner = [getattr(value, "model", None) or getattr(value, "first_stage_model", None) for value in returned]
    entry.update(ok=True, returned=[type(value).__name__ for value in returned],
                 inner=[type(value).__name__ for value in inner if value is not None])
    return entry


# case → (core's node for that file, the pack's loader and encode nodes): the same input through both
ENCODE_CASES = {
    "conv_vae": ("VAEEncode", "LTX25VideoEncoderLoader", "LTX25EncodeVideo"),
    "diffusion_vae": ("VAEEncode", "LTX25VideoEncoderLoader", "LTX25EncodeVideo"),
    "audio_vae": ("LTXVAudioVAEEncode", "LTX25AudioEncoderLoader", "LTX25EncodeAudio"),
}


def _encode_with_core_and_pack(nodes, case: str, name: str) -> dict:
    """Core's VAELoader + VAE Encode (video) or LTXV Audio VAE Encode (audio) on `name`, and the pack's encoder
    loader + encode node on the same file and input, both in float32 on the CPU: the two latents' shapes and
    their largest difference, or the traceback. Video: 9 frames of 64×96 noise; audio: 11·4096 samples of stereo
    noise at 44.1 kHz (core resamples any other rate to 44.1 kHz first, then to the model's 16 kHz, and its generic
    VAE input crop keeps a centred multiple of 4096 samples: this length it keeps whole)."""
    import torch
    from comfy_api.internal import _ComfyNodeInternal
    core_node, loader, encode = ENCODE_CASES[case]
    generator = torch.Generator().manual_seed(0)
    entry: dict[str, Any] = {"file": name, "core_node": core_node}
    try:
        (vae,) = nodes.NODE_CLASS_MAPPINGS["VAELoader"]().load_vae(name)
        pack_loaded = nodes.NODE_CLASS_MAPPINGS[loader]().load(name, "fp32")[0]
        if case == "audio_vae":
            audio = {"waveform": torch.randn(1, 2, 11 * 4096, generator=generator) * 0.3, "sample_rate": 44100}
            cls = nodes.NODE_CLASS_MAPPINGS[core_node]
            out = cls.execute(audio, vae) if issubclass(cls, _ComfyNodeInternal) else cls().encode(audio, vae)
            core = (out.result if hasattr(out, "result") else out)[0]["samples"]
            pack = nodes.NODE_CLASS_MAPPINGS[encode]().encode(pack_loaded, audio)[0]["samples"]
        else:
            frames = torch.rand(9, 64, 96, 3, generator=generator)
            core = nodes.NODE_CLASS_MAPPINGS[core_node]().encode(vae, frames)[0]["samples"]
            pack = nodes.NODE_CLASS_MAPPINGS[encode]().encode(pack_loaded, frames, 24.0, 0, 0, 0, "off", 80, 768, 24,
                                                                64, 0.0)[0]["samples"]
        core, pack = core.float().cpu(), pack.float().cpu()
        entry.update(ok=True, core_shape=list(core.shape), pack_shape=list(pack.shape), core_dtype=str(vae.vae_dtype),
                     max_abs=float((core - pack).abs().max()) if core.shape == pack.shape else None,
                     scale=float(core.abs().max()))
    except Exception:  # the report carries the traceback; the test prints it
        entry.update(ok=False, error=traceback.format_exc()[-4000:])
    return entry


def _conditioning_checks():
    """tests/conditioning_checks.py, by its path: this folder is off sys.path once ComfyUI is on it."""
    spec = importlib.util.spec_from_file_location("ltx25_conditioning_checks",
                                                  os.path.join(boot.HERE, "conditioning_checks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", required=True)
    parser.add_argument("--pack", required=True, help="custom_nodes/<folder> link to the pack root")
    parser.add_argument("--models", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--core-loaders", default="{}",
                        help='JSON {case: [folder, file]}: each file loaded by core ComfyUI\'s own loader for it')
    parser.add_argument("--encode-compare", default="{}",
                        help='JSON {case: file}: core\'s and the pack\'s encoders on the same input (ENCODE_CASES)')
    parser.add_argument("--input", default="", help="ComfyUI's input folder (core Load Image / Load Audio read it)")
    parser.add_argument("workflows", nargs="*")
    args = parser.parse_args(argv)
    boot.comfy_flags(args.comfyui)  # before anything imports comfy.model_management
    report: dict[str, Any] = {"workflows": {}}
    start = time.perf_counter()
    boot.set_folders(args.out, args.models, args.input)
    import torch
    import comfy.model_management as mm
    import comfy.model_patcher
    import execution
    # core's extra nodes (comfy_extras: the LTXV latents, audio VAE and upscale-model loaders, Load Audio) first, as
    # main.py loads them; then the pack, the way ComfyUI loads a custom node
    pack = boot.load_pack(args.pack, extra_nodes=True)
    nodes, pack_classes = pack.nodes, pack.classes
    report["pack_loaded"] = pack.loaded
    report["pack_nodes"] = sorted(pack_classes)
    report["comfy_nodes_module"] = os.path.abspath(nodes.__file__)
    report["setup_seconds"] = time.perf_counter() - start
    checks = _conditioning_checks()

    report["core_loaders"] = {case: _load_with_core(nodes, case, folder, name)
                              for case, (folder, name) in json.loads(args.core_loaders).items()}
    report["encode_compare"] = {case: _encode_with_core_and_pack(nodes, case, name)
                                for case, name in json.loads(args.encode_compare).items()}

    # 4. Observers: a wrapper around each pack node's FUNCTION, and a spy on load_models_gpu.
    calls: list[dict] = []
    def start(name: str, is_async: bool) -> dict:
        calls.append({"class_type": name, "inference_mode": torch.is_inference_mode_enabled(),
                      "grad_enabled": torch.is_grad_enabled(), "async": is_async, "t": time.perf_counter()})
        return calls[-1]

    for name, cls in pack_classes.items():
        original = getattr(cls, cls.FUNCTION)

        def observed(self, *a, __original=original, __name=name, **kw):
            call = start(__name, False)
            result = __original(self, *a, **kw)
            call["seconds"] = round(time.perf_counter() - call.pop("t"), 3)
            return result

        async def observed_async(self, *a, __original=original, __name=name, **kw):  # the executor runs it as a task
            call = start(__name, True)
            result = await __original(self, *a, **kw)
            call["seconds"] = round(time.perf_counter() - call.pop("t"), 3)
            return result

        setattr(cls, cls.FUNCTION, observed_async if inspect.iscoroutinefunction(original) else observed)
    loaded_patchers: list = []
    real_load_models_gpu = mm.load_models_gpu

    text_encoders: list = []  # every Gemma model management loaded, kept to see where its release left its weights

    def spy_load_models_gpu(models, *a, **kw):
        loaded_patchers.extend(models)
        text_encoders.extend(module for module in (getattr(p.model, "inner", p.model) for p in models)
                             if type(module).__name__ == "TextEncoderModule")
        return real_load_models_gpu(models, *a, **kw)

    mm.load_models_gpu = spy_load_models_gpu
    ran: set[int] = set()  # ids of every module whose forward ran (a global pre-hook; the models are tiny)
    torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: ran.add(id(module)))

    # 5. Validate and execute each workflow with a fresh executor (no cache shared between workflows).
    for path in args.workflows:
        name = os.path.splitext(os.path.basename(path))[0]
        entry: dict[str, Any] = report["workflows"].setdefault(name, {})
        with open(path, encoding="utf-8") as f:
            prompt = json.load(f)
        calls.clear()
        loaded_patchers.clear()
        ran.clear()
        executor = None
        t0 = time.perf_counter()
        try:
            valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(name, prompt, None))
            entry.update(valid=bool(valid), validation_error=error, node_errors=node_errors)
            if not valid:
                continue
            executor = boot.new_executor()
            # ComfyUI takes the outputs from a set, ordered by the hash seed; in node-id order the run is the same
            # each time, and in the shipped A/B graph that order lists the compare first (the worst for the saves)
            executor.execute(prompt, name, {"client_id": None}, sorted(outputs, key=lambda i: (len(i), i)))
            entry["success"] = bool(executor.success)
            entry["messages"] = [[event, {k: v for k, v in data.items() if k != "current_inputs"}]
                                 for event, data in executor.status_messages if event != "execution_cached"]
            entry["ui"] = executor.history_result["outputs"]
            entry["node_calls"] = list(calls)
            tensors, handles = [], []
            seen = {id(p) for p in loaded_patchers}
            for node_id, node in prompt.items():
                if node["class_type"] not in pack_classes:
                    continue
                raw = boot.cached_outputs(executor, node_id)
                for i, per_output in enumerate(raw):
                    for label, t in boot.tensors(per_output, f"{node_id}:{node['class_type']}[{i}]", torch):
                        tensors.append({"node": node_id, "class_type": node["class_type"], "path": label,
                                        "is_inference": bool(t.is_inference()), "requires_grad": t.requires_grad})
                    for value in per_output if isinstance(per_output, list) else [per_output]:
                        patcher = getattr(value, "patcher", None)
                        if patcher is not None:
                            handles.append({
                                "node": node_id, "class_type": node["class_type"], "output": i,
                                "patcher_type": f"{type(patcher).__module__}.{type(patcher).__qualname__}",
                                "is_model_patcher": isinstance(patcher, comfy.model_patcher.ModelPatcher),
                                "loaded_by_load_models_gpu": id(patcher) in seen,
                                "ran_forward": any(id(m) in ran for m in value.module.modules()),
                                "module": type(value.module).__name__})
            entry["tensors"] = tensors
            entry["handles"] = handles
            entry["load_models_gpu"] = [type(getattr(p, "model", p)).__name__ for p in loaded_patchers]
            entry["loaded_models_after"] = len(mm.current_loaded_models)
            if entry["success"]:
                with torch.inference_mode():
                    entry["conditioning"] = checks.measure(
                        prompt, lambda node_id: [out[0] for out in boot.cached_outputs(executor, node_id)],
                        pack.module)
        except Exception:  # the report carries the traceback; the test prints it
            entry["exception"] = traceback.format_exc()
        entry["seconds"] = time.perf_counter() - t0
        executor = None

    # Encode Prompt drops its encoder after the encode (encodes are cached, so not every workflow loads one)
    report["text_encoders_loaded"] = len(text_encoders)
    report["text_encoder_weights_after"] = sorted({t.device.type for module in text_encoders
                                                   for t in module.state_dict().values()})
    text_encoders.clear()
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    # Free the models now: a ModelPatcher still alive at interpreter teardown logs an error from its __del__.
    loaded_patchers.clear()
    mm.unload_all_models()
    gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
