"""Host memory of the real loaders: peak RSS and where each weight lives, on real-width, reduced-depth files.

    python bench/bench_host_memory.py --out host_memory.json                  # CPU or CUDA, 4 DiT blocks, 4 Gemma layers
    python bench/bench_host_memory.py --out host_memory.json --card-gib 24    # CUDA: a 24 GiB card (filler allocation)
    python bench/bench_host_memory.py --out smoke.json --smoke                # tiny files: checks the script
    python bench/bench_host_memory.py --out before.json --keep-pages --cases placed_te  # file pages never released

At full depth (`--dit-blocks 48 --gemma-layers 48`, 63 GiB of files) the GPU machine's disk holds the transformer
only: link `<dir>/dit48-gemma48/text_encoders` to a folder in /dev/shm first. Its pages count in RSS as a disk
file's do (RssShmem instead of RssFile); in that run they never passed 0.02 GiB: given back after each copy
as a disk file's are.

The files are written in the exact native layout at the released widths (the 22B transformer's config with
`--dit-blocks` of its 48 blocks, a bf16 and an NVFP4 copy; Gemma-4 12B with `--gemma-layers` of its 48 layers, the
full 262144-token embedding, the projection sized for those layers), one tensor at a time so writing them costs
little memory. Each case runs in a fresh subprocess and reports, at each stage, /proc/self/status (VmRSS, VmHWM,
RssAnon, RssFile, RssShmem), `ru_maxrss`, the peaks a 5 ms sampler saw of RssAnon and RssFile, and where the
module's weights are: views of the file's memory map (file-backed pages, the kernel may drop them), other host
memory (anonymous), pinned host memory, the device; plus the pinned host copies `streaming.place` keeps for
tensors on the device. Every figure is also given as a multiple of the file's size.

Cases: `dit_as_stored` / `dit_bf16` / `dit_nvfp4` — the transformer loader node's `load_transformer`, then every
weight read once (a CPU forward touches each page); `text_encoder` — Encode Prompt's engine path on the CPU
(load, one encode, free); `bridge` — both through the nodes and the standalone bridge on the compute device: load
the transformer, encode a prompt (Gemma placed, released), place the transformer, evict it (as the decoders do),
encode a new prompt (Gemma placed beside the evicted transformer's host copies), place the transformer again. On
the CPU the bridge moves nothing (load and offload device are the same); on CUDA it exercises the pinned copies,
streaming and eviction, within `--card-gib` when given. `placed_te` / `placed_dit` — Gemma or the bf16 transformer
loaded and placed whole by `streaming.place`: on the compute device on CUDA; without one on the meta device as its
stand-in, each copy to meta preceded by a read of its source (a copy to the GPU reads every page of it once; one to
meta reads nothing), so the file pages a placement maps, and gives back once each weight is copied
(nodes/ltx/files/mapped_pages.py), are measured on the CPU too. `--keep-pages` turns that release off (the loaders
before it) for a before/after comparison.

`full_size` gives the released files' sizes from the reduced files' headers (DiT 48 blocks, Gemma 48 layers) and
`scaled_to_full_size` each case's VmHWM with the blocks left out added once; `second_prompt` the VmHWM predicted at
the second new prompt with `placed_te`'s measured peak of Gemma's mapped pages: arithmetic on the measurements, not a
measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from safetensors import safe_open  # noqa: E402

GiB = 2**30
CASES = ("dit_as_stored", "dit_bf16", "dit_nvfp4", "text_encoder", "bridge", "placed_te", "placed_dit")
FULL_BLOCKS = 48   # the released transformer's blocks and Gemma-4 12B's layers (docs/MODEL.md)
FULL_LAYERS = 48
DIT_FILE, DIT_NVFP4_FILE, TE_FILE = "transformer-bf16.safetensors", "transformer-nvfp4.safetensors", "gemma.safetensors"
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
NOISE_VALUES = 1 << 24  # bf16 values of the random block the weights repeat
STREAMED_SHARE_24GIB = 0.2  # of Gemma's weights, streamed from pinned memory on a 24 GiB card (docs/PERFORMANCE.md)


# ---------------------------------------------------------------------------------------------------- files
def write_streamed(path: str, tensors: dict, metadata: dict) -> None:
    """A safetensors file from `{name: tensor}`, where a meta tensor is filled with small random values as it is
    written (in row chunks): the file never exists in memory whole. Floating tensors are written in bf16."""
    dtypes = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.int8: "I8"}
    entries, offset = {}, 0
    for name, t in tensors.items():
        dtype = torch.bfloat16 if t.is_floating_point() else t.dtype
        size = t.numel() * (2 if dtype == torch.bfloat16 else t.element_size())
        entries[name] = {"dtype": dtypes[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps({"__metadata__": {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()},
                         **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    # One block of random values, written over and over: drawing every value took 9 s a GiB on the CPU, longer
    # than a full-depth run; which values a weight holds does not change where its pages live
    g = torch.Generator().manual_seed(0)
    noise = (torch.randn(NOISE_VALUES, generator=g) * 0.02).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    with open(path + ".part", "wb") as out:
        out.write(len(header).to_bytes(8, "little") + header)
        for name, t in tensors.items():
            if not t.is_meta:
                out.write((t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous().view(torch.uint8)
                          .numpy().tobytes())
            elif t.ndim == 1 and ("norm" in name or name.endswith("scale")):
                out.write(torch.ones(t.numel(), dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
            elif name.endswith("layer_scalar"):  # RMSNorm gains near 1 and this at 0.5 keep a forward finite
                out.write(torch.full((t.numel(),), 0.5, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
            else:
                left = t.numel() * 2
                while left:
                    out.write(noise[:min(left, len(noise))])
                    left -= min(left, len(noise))
    os.replace(path + ".part", path)


def write_transformer(path: str, blocks: int, smoke: bool) -> None:
    from nodes.ltx.dit.transformer import KEY_MAP, SHIPPED_CONFIG, LTX25Transformer, TransformerConfig
    from nodes.tools.tiny.transformer import tiny_config_block, tiny_metadata
    block = {**(tiny_config_block() if smoke else SHIPPED_CONFIG), "num_layers": blocks}
    metadata = tiny_metadata(block)
    with torch.device("meta"):
        model = LTX25Transformer(TransformerConfig.from_metadata(path, metadata))
    write_streamed(path, KEY_MAP.to_native(model.state_dict()), metadata)


def write_text_encoder(path: str, layers: int, smoke: bool) -> None:
    """Gemma-4 12B's text config at `layers` layers (bench_text_encoder's REAL_TEXT_CONFIG); the tokenizer, the
    sidecars and the (dropped, never read) image/audio towers come from the tiny writer."""
    import copy
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedConfig
    from nodes.ltx.text.encoder import KEY_MAP, TextEncoderModule
    from nodes.tools.tiny import text_encoder as tiny
    from bench_text_encoder import REAL_TEXT_CONFIG
    tiny_path = path + ".tiny"
    tiny.write_tiny(tiny_path, 0)
    with safe_open(tiny_path, framework="pt") as f:
        raw = json.loads(f.metadata()["gemma_config"])
        small = {k: f.get_tensor(k).clone() for k in f.keys() if not k.startswith(("model.", "text_embedding"))}
    os.remove(tiny_path)
    if not smoke:
        kinds = [*REAL_TEXT_CONFIG["layer_types"][:layers - 1], "full_attention"]  # Gemma-4 ends on a global layer
        text = dict(REAL_TEXT_CONFIG, num_hidden_layers=layers, layer_types=kinds)
        raw["text_config"] = {**raw["text_config"], **text}
    config = Gemma4UnifiedConfig.from_dict(copy.deepcopy(raw))
    dims = (64, 32) if smoke else (4096, 2048)
    with torch.device("meta"):
        module = TextEncoderModule(config, *dims)
    tensors = KEY_MAP.to_native(module.state_dict())
    write_streamed(path, {**tensors, **small}, {"gemma_config": raw, "format": "pt"})


def write_files(root: str, blocks: int, layers: int, smoke: bool, nvfp4: bool = True) -> dict[str, str]:
    """The bf16 transformer, Gemma and, with `nvfp4`, the NVFP4 transformer (each kept for the next run); the paths of
    those that exist."""
    from nodes.tools.tiny.quantized import TRANSFORMER_LINEARS, quantize_file
    os.makedirs(os.path.join(root, "diffusion_models"), exist_ok=True)
    os.makedirs(os.path.join(root, "text_encoders"), exist_ok=True)
    paths = {"dit": os.path.join(root, "diffusion_models", DIT_FILE),
             "dit_nvfp4": os.path.join(root, "diffusion_models", DIT_NVFP4_FILE),
             "te": os.path.join(root, "text_encoders", TE_FILE)}
    if not os.path.exists(paths["dit"]):
        write_transformer(paths["dit"], blocks, smoke)
    if nvfp4 and not os.path.exists(paths["dit_nvfp4"]):
        quantize_file(paths["dit"], paths["dit_nvfp4"], "nvfp4", TRANSFORMER_LINEARS)
    if not os.path.exists(paths["te"]):
        write_text_encoder(paths["te"], layers, smoke)
    return {name: path for name, path in paths.items() if os.path.exists(path)}


def file_parts(path: str, block_prefix: str) -> dict[str, int]:
    """Bytes of the file, of its first block (keys under `block_prefix` + '0.'), and the block count."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    blocks = {k[len(block_prefix):].split(".")[0] for k in header if k.startswith(block_prefix)}
    first = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                if k.startswith(block_prefix + "0."))
    return {"file": os.path.getsize(path), "block": first, "blocks": len(blocks)}


# ---------------------------------------------------------------------------------------------------- measuring
def status() -> dict[str, int]:
    """/proc/self/status memory fields in bytes, and ru_maxrss."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in STATUS_FIELDS:
                out[key] = int(line.split()[1]) * 1024
    out["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


class Sampler:
    """The peaks of RssAnon, RssFile and VmRSS seen every 5 ms (VmHWM has no anonymous/file split)."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            now = status()
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now[key])
            time.sleep(0.005)

    def stop(self) -> dict[str, int]:
        self.running = False
        self.thread.join()
        return dict(self.peak)


def mapped_ranges(path: str) -> list[tuple[int, int]]:
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[-1] == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def weight_places(module: torch.nn.Module, paths: list[str]) -> dict[str, int]:
    """Bytes of the module's own tensors by where they live, each storage once; and its pinned host copies."""
    from nodes.ltx import streaming
    ranges = [r for p in paths for r in mapped_ranges(p)]
    places = {"file_map": 0, "host_pinned": 0, "host_anon": 0, "device": 0, "meta": 0, "host_copies_pinned": 0,
              "host_copies_other": 0}
    seen = set()

    def where(t: torch.Tensor) -> str:
        if t.is_meta:
            return "meta"
        if t.device.type != "cpu":
            return "device"
        if any(a <= t.data_ptr() < b for a, b in ranges):
            return "file_map"
        return "host_pinned" if torch.cuda.is_available() and t.is_pinned() else "host_anon"

    for _, _, t in streaming._owned_tensors(module):
        key = id(t) if t.is_meta else (t.device, t.data_ptr())  # meta tensors all sit at address 0
        if key in seen:
            continue
        seen.add(key)
        places[where(t)] += t.numel() * t.element_size()
    for _device_tensor, host in vars(module).get("_ltx25_host_copies", {}).values():
        pinned = torch.cuda.is_available() and host.is_pinned()
        places["host_copies_pinned" if pinned else "host_copies_other"] += host.numel() * host.element_size()
    return places


def snapshot(stage: str, sampler: Sampler, modules: dict, paths: list[str]) -> dict:
    return {"stage": stage, **status(), "sampled_peak": dict(sampler.peak),
            "cuda_allocated": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0,
            "weights": {name: weight_places(m, paths) for name, m in modules.items() if m is not None}}


def touch(module: torch.nn.Module) -> None:
    """Read every weight once, as a CPU forward does (each page of the file map is faulted in)."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            touch_tensor(t)


def touch_tensor(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and t.numel():
        t.detach().reshape(-1)[:: max(1, 4096 // t.element_size())].float().sum()


class ReadBeforeMeta(torch.overrides.TorchFunctionMode):
    """The meta device as the GPU's stand-in: a copy of a CPU tensor to meta reads its source too, as a copy to the
    device reads each of its pages once (a copy to meta alone reads nothing)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.to and isinstance(result, torch.Tensor) and result.is_meta:
            touch_tensor(args[0])
        return result


# ---------------------------------------------------------------------------------------------------- cases
def case_dit(paths: dict, kind: str) -> list[dict]:
    from nodes.ltx.dit.transformer import load_transformer
    path = paths["dit_nvfp4" if kind == "dit_nvfp4" else "dit"]
    sampler, stages = Sampler(), []
    stages.append(snapshot("start", sampler, {}, [path]))
    model = load_transformer(path, torch.bfloat16 if kind == "dit_bf16" else None)
    stages.append(snapshot("loaded", sampler, {"dit": model}, [path]))
    touch(model)
    stages.append(snapshot("every weight read", sampler, {"dit": model}, [path]))
    del model
    stages.append(snapshot("freed", sampler, {}, [path]))
    sampler.stop()
    return stages


def case_text_encoder(paths: dict) -> list[dict]:
    from nodes.ltx.text import encoder as te
    path = paths["te"]
    sampler, stages = Sampler(), []
    stages.append(snapshot("start", sampler, {}, [path]))
    spec = te.TextEncoderSpec.from_file(path, None, "cpu")
    stages.append(snapshot("spec read", sampler, {}, [path]))

    def load_hook(module, handle):  # the engine's placement hook: here only a look at the loaded module
        stages.append(snapshot("loaded", sampler, {"text_encoder": module}, [path]))
        return handle
    te.encode_prompts(spec, ["A red fox runs through a snowy forest at dawn."], load_hook=load_hook)
    stages.append(snapshot("encoded, encoder freed", sampler, {}, [path]))
    sampler.stop()
    return stages


def case_bridge(paths: dict) -> list[dict]:
    from nodes.comfy import bridge
    from nodes.comfy.loaders import LTX25TextEncoderLoader, LTX25TransformerLoader
    from nodes.comfy.text import LTX25EncodePrompt
    from nodes.ltx.text import encoder as te
    bridge.set_models_dir(os.path.dirname(os.path.dirname(paths["dit"])))
    files = [paths["dit"], paths["te"]]
    sampler, stages = Sampler(), []
    stages.append(snapshot("start", sampler, {}, files))
    dit = LTX25TransformerLoader().load(DIT_FILE, "as stored")[0]
    spec = LTX25TextEncoderLoader().load(TE_FILE, "as stored", "auto")[0]
    stages.append(snapshot("transformer loaded", sampler, {"dit": dit.module}, files))
    seen = {}
    load = bridge.load_models

    def watched_load(patchers, memory_required=0):  # a look at Gemma placed, before the encode frees it
        load(patchers, memory_required)
        for p in patchers:
            if isinstance(p.model, te.TextEncoderModule):
                seen["te"] = p.model
                stages.append(snapshot(f"text encoder placed ({seen['prompt']})", sampler,
                                       {"dit": dit.module, "text_encoder": p.model}, files))
    bridge.load_models = watched_load
    try:
        for prompt, then in (("first prompt", "place"), ("second prompt", "evict")):
            seen["prompt"] = prompt
            LTX25EncodePrompt().encode(spec, f"A red fox runs through the snow, {prompt}.")
            stages.append(snapshot(f"{prompt} encoded, encoder released", sampler,
                                   {"dit": dit.module, "text_encoder": seen.pop("te", None)}, files))
            if then == "place":
                dit.ready(1 << 30)
                stages.append(snapshot("transformer placed", sampler, {"dit": dit.module}, files))
                dit.patcher.unload()  # what the standalone manager does to make room for a decoder
                stages.append(snapshot("transformer evicted", sampler, {"dit": dit.module}, files))
        dit.ready(1 << 30)
        stages.append(snapshot("transformer placed again", sampler, {"dit": dit.module}, files))
    finally:
        bridge.load_models = load
    sampler.stop()
    return stages


def case_placed(paths: dict, kind: str) -> list[dict]:
    from nodes.ltx import streaming
    from nodes.ltx.dit.transformer import load_transformer
    from nodes.ltx.text import encoder as te
    path = paths["te" if kind == "placed_te" else "dit"]
    sampler, stages = Sampler(), []
    stages.append(snapshot("start", sampler, {}, [path]))
    if kind == "placed_te":
        model = te.load_text_encoder(te.TextEncoderSpec.from_file(path, None))
    else:
        model = load_transformer(path, None)
    stages.append(snapshot("loaded", sampler, {"model": model}, [path]))
    if torch.cuda.is_available():  # within what is free: under --card-gib the blocks that do not fit stream (pinned)
        streaming.place(model, torch.device("cuda"), torch.cuda.mem_get_info()[0] - GiB)
    else:
        with ReadBeforeMeta():
            streaming.place(model, torch.device("meta"), 1 << 62)
    stages.append(snapshot("placed", sampler, {"model": model}, [path]))
    sampler.stop()
    return stages


def run_case(name: str, paths: dict, card_gib: float) -> list[dict]:
    if torch.cuda.is_available() and card_gib:
        total = torch.cuda.mem_get_info()[1]
        filler = torch.empty(int(total - card_gib * GiB), dtype=torch.uint8, device="cuda")  # noqa: F841
    if name.startswith("dit"):
        return case_dit(paths, name)
    if name == "text_encoder":
        return case_text_encoder(paths)
    if name.startswith("placed"):
        return case_placed(paths, name)
    return case_bridge(paths)


# ---------------------------------------------------------------------------------------------------- summary
def multiples(stages: list[dict], sizes: dict[str, int]) -> dict:
    """Each stage's host figures above the process's start (torch and the imports), over the files' total size; each
    module's places over its file's size."""
    total, start = sum(sizes.values()), stages[0]
    out = []
    for s in stages:
        row = {"stage": s["stage"],
               "above_start_x_files": {k: round((s[k] - start[k]) / total, 3) for k in (*STATUS_FIELDS, "ru_maxrss")},
               "sampled_peak_above_start_x_files": {k: round((v - start[k]) / total, 3)
                                                     for k, v in s["sampled_peak"].items()}}
        row["weights_x_file"] = {name: {k: round(v / sizes[name], 3) for k, v in places.items() if v}
                                 for name, places in s["weights"].items() if name in sizes}
        out.append(row)
    return out


def full_size(parts: dict) -> dict:
    """Released sizes from the reduced files' headers: the other tensors once, the blocks × 48 (Gemma's projection
    also grows with the layers: hidden × (layers + 1) columns)."""
    def scale(p: dict, full: int) -> int:
        return p["file"] + (full - p["blocks"]) * p["block"]
    te = parts["te"]
    projection = te.get("projection", 0)
    te_full = scale(te, FULL_LAYERS) + projection * (FULL_LAYERS + 1) // (te["blocks"] + 1) - projection
    full = {"dit_bf16_gib": scale(parts["dit"], FULL_BLOCKS) / GiB, "text_encoder_gib": te_full / GiB}
    if "dit_nvfp4" in parts:
        full["dit_nvfp4_gib"] = scale(parts["dit_nvfp4"], FULL_BLOCKS) / GiB
    return full


def scaled(cases: dict, parts: dict, full: dict, on_device: bool) -> dict:
    """Each case's VmHWM with the released files: the measured one plus the bytes the released files add (the
    blocks and layers left out), each held once as the measured blocks are; activations do not grow with depth, and
    Gemma's embedding table is already whole in the reduced file. A first guess, exact only where each weight is
    held once (the CPU cases), an upper bound where a case reads part of a file only (on the CPU the bridge case
    never reads the transformer's weights). On a GPU the bridge case's Gemma goes to the device, its file pages
    given back, so only the DiT's left-out blocks (its pinned host copy once evicted) are added; Gemma's share
    streamed from pinned memory on a card it does not fit is `second_prompt`'s. The `placed_*` cases are left out:
    what they map at once does not grow with depth once pages are released (`second_prompt` uses it as measured)."""
    files = {"dit_as_stored": [("dit", "dit_bf16_gib")], "dit_bf16": [("dit", "dit_bf16_gib")],
             "dit_nvfp4": [("dit_nvfp4", "dit_nvfp4_gib")], "text_encoder": [("te", "text_encoder_gib")],
             "bridge": [("dit", "dit_bf16_gib")] + ([] if on_device else [("te", "text_encoder_gib")])}
    out = {}
    for name, case in cases.items():
        if "stages" not in case or name not in files:
            continue
        added = sum(full[f] * GiB - parts[p]["file"] for p, f in files[name])
        out[name] = {"added_gib": round(added / GiB, 1),
                     "VmHWM_gib": round((case["stages"][-1]["VmHWM"] + added) / GiB, 1)}
    return out


def second_prompt(cases: dict, full: dict, parts: dict, released: bool, on_device: bool) -> dict:
    """VmHWM at the second new prompt on a 24 GiB card that evicts the DiT for the decoders: the evicted DiT's pinned
    copy (all of it), Gemma's streamed share pinned (`STREAMED_SHARE_24GIB`, read from the code: docs/PERFORMANCE.md)
    and the most of Gemma's file mapped at once while it is placed (`placed_te`: its VmHWM above the loaded stage).
    With the pages released that peak is about the largest tensor copied, whatever the depth; without, it is every
    page read, so it grows to the full file."""
    case = cases.get("placed_te", {})
    if "stages" not in case:
        return {}
    loaded, last = case["stages"][1], case["stages"][-1]
    mapped = (last["VmHWM"] - loaded["VmRSS"]) / GiB
    mapped_full = mapped if released else mapped * full["text_encoder_gib"] * GiB / parts["te"]["file"]
    pinned = {k: full[k] + STREAMED_SHARE_24GIB * full["text_encoder_gib"] for k in ("dit_bf16_gib", "dit_nvfp4_gib")
              if k in full}
    out = {"gemma_mapped_peak_gib": round(mapped, 2), "gemma_mapped_peak_full_size_gib": round(mapped_full, 2),
           "pinned_gib": {k: round(v, 1) for k, v in pinned.items()},
           "VmHWM_gib": {k: round(v + mapped_full, 1) for k, v in pinned.items()}}
    bridge = cases.get("bridge", {})
    if on_device and "stages" in bridge:
        # The bridge case's own peak (the process, its imports and CUDA's host memory, the evicted DiT's pinned
        # copy, Gemma's mapped pages), with the DiT's left-out blocks and Gemma's streamed share on a 24 GiB card
        # added (the reduced Gemma fits the bench's card whole, so nothing of it streamed there)
        measured = bridge["stages"][-1]["VmHWM"] / GiB
        out["from_bridge_VmHWM_gib"] = {k: round(measured + full[k] - parts["dit"]["file"] / GiB
                                                 + STREAMED_SHARE_24GIB * full["text_encoder_gib"], 1)
                                        for k in ("dit_bf16_gib", "dit_nvfp4_gib") if k in full}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSON result")
    parser.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ltx25_host_memory"),
                        help="where the files are written (kept for the next run)")
    parser.add_argument("--dit-blocks", type=int, default=4)
    parser.add_argument("--gemma-layers", type=int, default=4)
    parser.add_argument("--card-gib", type=float, default=0.0,
                        help="CUDA: hold a filler so only this many GiB of the card are usable (streaming, evictions)")
    parser.add_argument("--smoke", action="store_true", help="tiny widths: checks the script in seconds")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--keep-pages", action="store_true",
                        help="do not give file pages back after a copy (the loaders before mapped_pages.py)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process (the driver's subprocess)
    args = parser.parse_args()
    nvfp4 = "dit_nvfp4" in (args.case or args.cases).split(",")  # the quantized copy only when a case reads it
    root = os.path.join(args.dir, "smoke" if args.smoke else f"dit{args.dit_blocks}-gemma{args.gemma_layers}")
    os.environ.setdefault("LTX25_QUIET", "1")
    if args.case:
        if args.keep_pages:
            from nodes.ltx.files import mapped_pages
            mapped_pages._MADVISE = None  # FileMappings then finds nothing to release
        paths = write_files(root, args.dit_blocks, args.gemma_layers, args.smoke, nvfp4)
        print("RESULT " + json.dumps(run_case(args.case, paths, args.card_gib)))
        return 0
    started = time.time()
    paths = write_files(root, args.dit_blocks, args.gemma_layers, args.smoke, nvfp4)
    parts = {name: file_parts(path, "model.layers." if name == "te" else "model.diffusion_model.transformer_blocks.")
             for name, path in paths.items()}
    with open(paths["te"], "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    parts["te"]["projection"] = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                                    if k.startswith("text_embedding_projection."))
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "card_gib": args.card_gib, "pages_released": not args.keep_pages,
              "files": parts, "cases": {}}
    import safetensors
    result["safetensors"] = safetensors.__version__
    for name in args.cases.split(","):
        command = [sys.executable, os.path.abspath(__file__), "--case", name, "--dir", args.dir,
                   "--dit-blocks", str(args.dit_blocks), "--gemma-layers", str(args.gemma_layers),
                   "--card-gib", str(args.card_gib)] + (["--smoke"] if args.smoke else []) \
            + (["--keep-pages"] if args.keep_pages else [])
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            result["cases"][name] = {"error": done.stderr[-3000:]}
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        stages = json.loads(lines[-1][len("RESULT "):])
        sizes = {"dit": parts["dit_nvfp4" if name == "dit_nvfp4" else "dit"]["file"]} if name.startswith("dit") \
            else {"text_encoder": parts["te"]["file"]} if name == "text_encoder" \
            else {"model": parts["te" if name == "placed_te" else "dit"]["file"]} if name.startswith("placed") \
            else {"dit": parts["dit"]["file"], "text_encoder": parts["te"]["file"]}
        result["cases"][name] = {"stages": stages, "multiples": multiples(stages, sizes),
                                 "files_bytes": sum(sizes.values())}
        last = stages[-1]
        first = stages[0]
        print(f"{name}: above the start: VmHWM {(last['VmHWM'] - first['VmHWM']) / GiB:.2f} GiB, peak RssAnon "
              f"{(last['sampled_peak']['RssAnon'] - first['RssAnon']) / GiB:.2f} GiB, peak RssFile "
              f"{(last['sampled_peak']['RssFile'] - first['RssFile']) / GiB:.2f} GiB (files "
              f"{sum(sizes.values()) / GiB:.2f} GiB)", file=sys.stderr)
    result["full_size"] = full_size(parts)
    on_device = result["device"] != "cpu"
    result["scaled_to_full_size"] = scaled(result["cases"], parts, result["full_size"], on_device)
    result["second_prompt"] = second_prompt(result["cases"], result["full_size"], parts, not args.keep_pages,
                                            on_device)
    result["seconds"] = round(time.time() - started, 1)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps({k: result[k] for k in ("device", "full_size", "scaled_to_full_size", "second_prompt",
                                             "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
