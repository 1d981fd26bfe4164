"""Check the bridge's `spare_device_memory` against ComfyUI's own `load_models_gpu` on a simulated card, and run the
conv decode node after sampling on such a card; write a JSON report.

    COMFYUI_PYTHON tests/comfyui_spare_driver.py --comfyui ROOT --pack LINK --models DIR --out DIR --report FILE \
        WORKFLOW.json

Started by tests/test_comfyui_spare_memory.py with ComfyUI's interpreter, set up by tests/comfyui_boot.py. The card is
the low-VRAM driver's `SimulatedCard` (its module docstring says how ComfyUI's real model management runs against it
on the CPU). The workflow is a sampler and a conv decode; its loader nodes also make the handles of the direct cases.
What ComfyUI decided is read from its own bookkeeping: which models `current_loaded_models` holds and the bytes
ModelPatcher loaded of each (`loaded_size`).

The report holds:
- `sizes`: the transformer's and the conv VAE's bytes as model management counts them, and ComfyUI's reserve and
  minimum inference memory;
- `cases`: per direct case (a card, a vram state, `--disable-smart-memory` or not, the `--cpu` reference), the spare
  memory the bridge reported with the transformer loaded and, for each request the VAE was then loaded with, what
  model management held before and after;
- `decode`: the graph run on a card where the untiled decode does not fit beside the sampled transformer: the spare
  memory the decode node was told, its untiled estimate, what its VAE load asked for, what was held around that load,
  the tiles it decoded and its frames against the engine's decode of the same latent planned within the same memory.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import traceback
from typing import Any

import comfyui_boot as boot  # this script's folder is still first on sys.path here; boot.comfy_flags takes it off
from comfyui_lowvram_driver import SimulatedCard, _digest

MIB = 2**20
ROOM = MIB          # the roomy card: this much more than the transformer and 1.1 × the VAE beside the minimum
ABOVE = 4096        # "more than the spare memory": far below every term of ComfyUI's rule (0.1 × the VAE: 257 KB)
HOST_FREE = 64 * 2**30  # the host memory the `--cpu` case reports free


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--comfyui", "--pack", "--models", "--out", "--report"):
        parser.add_argument(name, required=True)
    parser.add_argument("workflow")
    args = parser.parse_args(argv)
    boot.comfy_flags(args.comfyui)
    boot.set_folders(args.out, args.models)

    import torch
    import comfy.model_management as mm
    import execution
    import nodes
    pack = boot.load_pack(args.pack)
    # core's Preview Any: the output node that makes the executor run the decode
    asyncio.run(nodes.load_custom_node(os.path.join(args.comfyui, "comfy_extras", "nodes_preview_any.py"),
                                       module_parent="comfy_extras"))
    bridge, comfy_models = pack.module("comfy.bridge"), pack.module("comfy.bridge.comfy_models")
    cv, tiling = pack.module("ltx.decode.conv_vae"), pack.module("ltx.decode.tiling")
    card = SimulatedCard(mm)
    with open(args.workflow, encoding="utf-8") as f:
        prompt = json.load(f)

    def held() -> dict[str, int]:
        """Model management's loaded models: engine class → bytes ModelPatcher loaded of it."""
        return {type(comfy_models._engine_module(e.model)).__name__: int(e.model.loaded_size())
                for e in mm.current_loaded_models if e.model is not None}

    # Observers of the pack's own calls: every load (what was held around it) and every spare-memory answer.
    loads: list[dict] = []
    spares: list[int] = []
    real_load_models, real_spare = bridge.load_models, bridge.spare_device_memory

    def observed_load_models(patchers, memory_required=0):
        before = held()
        real_load_models(patchers, memory_required)
        loads.append({"models": [type(comfy_models._engine_module(p)).__name__ for p in patchers],
                      "memory_required": int(memory_required), "before": before, "after": held()})

    def observed_spare(patcher) -> int:
        spares.append(int(real_spare(patcher)))
        return spares[-1]

    bridge.load_models, bridge.spare_device_memory = observed_load_models, observed_spare

    def node_output(node_id: str) -> tuple:
        node = prompt[node_id]
        cls = pack.classes[node["class_type"]]
        return getattr(cls(), cls.FUNCTION)(**node["inputs"])

    kinds = {node["class_type"]: node_id for node_id, node in prompt.items()}

    def handles() -> tuple:
        """The transformer and the VAE from the graph's loaders: their patchers load onto the device model management
        gives when they are made (the simulated card once it is applied)."""
        return tuple(node_output(kinds[loader])[0] for loader in ("LTX25TransformerLoader", "LTX25VideoVAELoader"))

    t_size, v_size = (int(handle.patcher.model_size()) for handle in handles())
    roomy = t_size + math.ceil(1.1 * v_size) + ROOM
    sizes = {"transformer": t_size, "vae": v_size, "reserve": int(mm.extra_reserved_memory()),
             "minimum_inference": int(mm.minimum_inference_memory())}
    report: dict[str, Any] = {"sizes": sizes, "cases": {}}

    def direct(name: str, state: str | None, weight_bytes: int, asks: list[str], smart: bool = True) -> None:
        """On the card of `weight_bytes` in `state` (None: the `--cpu` reference, HOST_FREE free), handles made there:
        the transformer loaded, the spare memory for the VAE, then for each request of `asks` ("spare"; "above": ABOVE
        bytes more; "far": a GiB more) the VAE loaded with it, unloaded again and the transformer loaded again."""
        entry: dict[str, Any] = report["cases"].setdefault(name, {"loads": []})
        try:
            if state is None:
                card.reference()
                mm.get_free_memory = lambda dev=None, torch_free_too=False: \
                    (HOST_FREE, HOST_FREE) if torch_free_too else HOST_FREE
            else:
                card.apply(state, weight_bytes, None)
            mm.DISABLE_SMART_MEMORY = not smart
            transformer, vae = handles()
            transformer.ready()
            spare = vae.spare_memory()
            entry.update(spare=spare, card_bytes=card.card_bytes if state else None, device=str(mm.get_torch_device()),
                         free=int(mm.get_free_memory(mm.get_torch_device())))
            for ask in asks:
                loads.clear()
                vae.ready(spare + {"spare": 0, "above": ABOVE, "far": 2**30}[ask])
                entry["loads"].append({"ask": ask, **loads[-1]})
                bridge.unload_model(vae.patcher)
                transformer.ready()
        except Exception:  # the report carries the traceback; the test prints it
            entry["exception"] = traceback.format_exc()
        finally:
            mm.DISABLE_SMART_MEMORY = False
            card.reference()
            mm.unload_all_models()
            gc.collect()

    direct("roomy", "NORMAL_VRAM", roomy, ["spare", "above"])
    # room for the transformer and half the VAE: less than 1.1 × the VAE beside ComfyUI's minimum inference memory
    direct("tight", "NORMAL_VRAM", t_size + v_size // 2, ["spare"])
    direct("disable_smart_memory", "NORMAL_VRAM", roomy, ["spare"], smart=False)
    direct("cpu", None, 0, ["far"])

    # The graph on the roomy card: sampled, then decoded beside the transformer.
    decode: dict[str, Any] = report.setdefault("decode", {})
    try:
        card.apply("NORMAL_VRAM", roomy, None)
        loads.clear()
        spares.clear()
        valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt("spare", prompt, None))
        if not valid:
            raise RuntimeError(f"invalid graph: {error} {node_errors}")
        executor = boot.new_executor()
        executor.execute(prompt, "spare", {"client_id": None, "preview_method": "none"}, outputs)
        errors = [data for event, data in executor.status_messages if event == "execution_error"]
        if not executor.success:
            raise RuntimeError(json.dumps(errors, default=str)[:4000])
        decode_id, vae_id = kinds["LTX25ConvVAEDecode"], kinds["LTX25VideoVAELoader"]
        (images,), (stats,) = boot.cached_outputs(executor, decode_id)  # one value per output (no list inputs)
        module = boot.cached_outputs(executor, vae_id)[0][0].module
        latent = boot.cached_outputs(executor, prompt[decode_id]["inputs"]["latent"][0])[0][0]["samples"]
        vae_loads = [load for load in loads if load["models"] == ["ConvVideoVAE"]]
        decode.update(spare=spares[-1], untiled=int(cv.working_memory(module, tuple(latent.shape))),
                      vae_load=vae_loads[-1], held_after=held(), tile_count=stats.tile_count,
                      planned=int(stats.extra["estimate_bytes"]), frames=_digest(images),
                      transformer_loads=[load for load in loads if load["models"] == ["LTX25Transformer"]])
        card.reference()
        with torch.inference_mode():
            reference, reference_stats = cv.decode_conv(module, latent, tiling.TilingRequest(), spares[-1])
        decode.update(reference_frames=_digest(reference), reference_tile_count=reference_stats.tile_count,
                      max_difference=float((images.float() - reference.float()).abs().max()))
    except Exception:  # the report carries the traceback; the test prints it
        decode["exception"] = traceback.format_exc()
    finally:
        card.reference()
        mm.unload_all_models()
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
