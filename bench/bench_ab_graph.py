"""End-to-end decoder A/B graph (issue 7, Performance): every node of workflows/api/ltx25_t2v_distilled_decoder_ab.json
at 768×512×121 with real-shape RANDOM weights for every component, seconds and peak GPU memory per node, cold and warm.

    python bench/bench_ab_graph.py            # CUDA: Gemma-4 12B, 22B DiT + connectors, upsampler, both VAEs, audio
    python bench/bench_ab_graph.py --smoke    # CPU: the tiny set through the normal loader nodes at 192×128×17

Real files are 66 GB, so on CUDA the loader nodes are not run: each engine module is built in memory on the GPU from
its released config by the builders of the per-component benchmarks (bench_transformer / bench_text_encoder /
bench_conv_vae / bench_diffusion_vae; upsampler and audio VAE here from their released configs, docs/MODEL.md §8, §11),
registered with `nodes.comfy.handles.Loaded.register` under a minimal AssetInfo carrying the official file name, and its
`Loaded` stands in for the loader's output. The text encoder is fed to the real Encode Prompt node: its spec is read
from the tiny text-encoder file (tokenizer: the tiny one, ids padded to the real 1024 tokens) with the real Gemma
config swapped in, and `text_encoder.load_text_encoder` is replaced by one returning the in-memory module (so the node's
load/offload hooks run as usual, except that its release unloads the module on a capped card, or leaves it on the
whole card, instead of freeing it: the bench has only this one copy for every prompt). Every other node runs
unchanged, in the workflow's dependency order.
With `--heavy-files DIR` the transformer and Gemma load from real-shape files through their loader nodes instead and
the small models become views of files written for them, so the host memory figures are those of a user's run.

The graph runs through the headless runner's executor, which (like ComfyUI's) starts ready output nodes first and
runs async nodes — the three saves, whose H.264 encodes run on worker threads — as tasks while later nodes go on;
end to end is the wall time of the whole run. Per node: seconds from start to end and those offsets in the run
(CUDA-synchronized; a save ends when the runner collects its finished task, between plain nodes, as ComfyUI's loop
does), peak allocated memory (reset before each node), allocated before/after, the
driver's used memory, and which heavy modules sit on the GPU at the node's start and end (the standalone bridge evicts
only on memory pressure: on an H200 everything fits, and that is reported as is; `--card-gib 80 --offload-first`
holds a filler allocation so only 80 GiB are usable, to watch the evictions). Run 1 is cold (it includes the
sampler's torch.compile + CUDA-graph capture, `acceleration=compile_cuda_graph`, reported as cold − warm); run 2 is
warm with the same prompt (Encode Prompt hits its cache, as in ComfyUI); then Encode Prompt once more with a new
prompt (with `--card-gib`, Gemma back onto the GPU, encode, offload; on the whole card it never left). Prints a
short table and one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import sys
import subprocess
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodes.comfy import bridge  # noqa: E402
from nodes.registry import NODE_CLASS_MAPPINGS  # noqa: E402
from nodes.comfy import compare as compare_node
from nodes.comfy import previews
from nodes.tools.graph import validate  # noqa: E402
from nodes.comfy.handles import Loaded  # noqa: E402
from nodes.tools.run import execute as run_execute  # noqa: E402
from nodes.ltx.text import encoder as te
from nodes.ltx.dit.accelerated_denoise import COUNTS as CAPTURES, release  # noqa: E402
from nodes.ltx.kernels.lora_linear import COUNTS as LORA_INSTALLS  # noqa: E402
from nodes.ltx.files.assets import AssetInfo, Header, Kind  # noqa: E402
from nodes.tools.tiny import write_tiny_set  # noqa: E402
from nodes.ltx.release import GEMMA_VERSION, MODEL_VERSION, OFFICIAL_FILES, SHIPPED_CONV_VAE_CONFIG  # noqa: E402
from nodes.tools.tiny.audio_vae import TINY_AUDIO_VAE_CONFIG, TINY_VOCODER_CONFIG  # noqa: E402

WORKFLOW = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json")
LOADERS = {"1": "transformer", "2": "text_encoder", "6": "upsampler", "7": "conv_vae", "8": "diffusion_vae",
           "9": "audio_vae"}
SAMPLERS, DECODERS, OUTPUTS = ("10", "12"), ("13", "14", "15"), ("16", "17", "18", "19")
CONV_ONLY_DROPS = ("8", "14", "16", "18", "19")  # --conv-only: the diffusion VAE's loader, decode, compare and saves
NEW_PROMPT = "A paper boat drifts down a rain-filled gutter at dusk, neon reflections, the patter of rain."
UPSAMPLER_CONFIG = {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 1024,  # docs/MODEL.md §8
                    "num_blocks_per_stage": 4, "dims": 3, "spatial_upsample": True, "temporal_upsample": False,
                    "spatial_scale": 2.0, "rational_resampler": False}
GiB = 2**30


# ------------------------------------------------------------------------------------------------ real-shape modules
def _info(component: str, kind: Kind) -> AssetInfo:
    """What the loader would have inspected, minus the tensors: official name, kind, versions."""
    folder, name = OFFICIAL_FILES[component]
    path = os.path.join("<in-memory>", folder, name)
    gemma = GEMMA_VERSION if kind in (Kind.TRANSFORMER, Kind.TEXT_ENCODER) else None
    return AssetInfo(path, kind, MODEL_VERSION, gemma, {"BF16": 0}, None, Header(path, {}, {}))


def _audio_metadata() -> dict:
    """The tiny metadata at the released widths (docs/MODEL.md §11: ch 128, ch_mult (1, 2, 4), 2 res blocks; vocoder
    1536 / BWE 512, AMP1 resblocks k (3, 7, 11) × dilations (1, 3, 5): diffusers' LTX2VocoderWithBWE defaults for
    LTX-2.3)."""
    ae = json.loads(json.dumps(TINY_AUDIO_VAE_CONFIG))
    ae["model"]["params"]["ddconfig"].update(ch=128, ch_mult=[1, 2, 4], num_res_blocks=2)
    voc = json.loads(json.dumps(TINY_VOCODER_CONFIG))
    res = {"resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5]] * 3}
    voc["vocoder"].update(upsample_initial_channel=1536, **res)
    voc["bwe"].update(upsample_initial_channel=512, **res)
    return {"config": {"audio_vae": ae, "vocoder": voc}, "model_version": MODEL_VERSION}


def _on_device(device: torch.device, dtype: torch.dtype, make):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return make()
    finally:
        torch.set_default_dtype(previous)


def build_real(device: torch.device, tiny_text_encoder: str | None, transformer_format: str = "bf16",
               text_encoder: bool = True, transformer: bool = True,
               release_to_host: bool = True) -> tuple[dict, dict, te.TextEncoderModule | None]:
    """{loader node id: its output tuple}, {component: build seconds}, the Gemma module (for residency checks).
    Without `text_encoder` no Gemma is built (node "2" has no output, the module is None): for a graph that is given
    its text features as tensors, or loads Gemma from a file; without `transformer` no DiT (node "1" has none).
    Without `release_to_host`, Encode Prompt's release leaves Gemma where it is (see the call)."""
    import bench_conv_vae
    import bench_diffusion_vae
    import bench_text_encoder
    import bench_transformer
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    from nodes.ltx import audio_vae as av
    from nodes.ltx.dit import transformer as T
    from nodes.ltx.upsampler import UpsamplerConfig
    if text_encoder:
        from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedConfig

    bf16, seconds, out = torch.bfloat16, {}, {}

    def timed(name, make):
        start = time.perf_counter()
        module = make()
        torch.cuda.synchronize(device)
        seconds[name] = round(time.perf_counter() - start, 2)
        return module

    if transformer:
        config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": dict(T.SHIPPED_CONFIG)}})
        dit = timed("transformer", lambda: bench_transformer.build(config, device, bf16))
        if transformer_format != "bf16":
            seconds["quantized_layers"] = quantize_blocks(dit, transformer_format)
        out["1"] = (Loaded.register(dit, _info("transformer", Kind.TRANSFORMER), on_unload=release),)

    gemma = None
    if text_encoder:
        gemma_config = Gemma4UnifiedConfig(text_config=bench_text_encoder.REAL_TEXT_CONFIG,
                                           gemma_version=GEMMA_VERSION)
        gemma = timed("text_encoder", lambda: bench_text_encoder.build(gemma_config, 4096, 2048, device, bf16))
        tiny_spec = te.TextEncoderSpec.from_file(tiny_text_encoder, bf16)
        spec = dataclasses.replace(tiny_spec, config=gemma_config, video_dim=4096, audio_dim=2048)
        te.load_text_encoder = lambda _spec: gemma  # the Encode Prompt node "loads" the in-memory module
        # The node frees a released encoder where it is (it loads the file again next time); this one module must
        # survive for the next uncached prompt. On a capped card its release unloads it to the host instead; on the
        # whole card it stays there (nothing needs its memory): that unload's first pinned copy of 24 GiB took 8 s
        # of the cold run's encode, which the node, freeing the encoder, does not spend (`diag_cold_profile.py`).
        bridge.discard_model = bridge.unload_model if release_to_host else (lambda patcher: None)
        out["2"] = (spec,)

    up_config = UpsamplerConfig.from_metadata("bench", {"config": UPSAMPLER_CONFIG})
    upsampler = timed("upsampler", lambda: _on_device(device, bf16, lambda: LTX2LatentUpsamplerModel(
        **up_config.diffusers_kwargs())).eval().requires_grad_(False))
    out["6"] = (Loaded.register(upsampler, _info("upsampler", Kind.UPSAMPLER)),)

    def conv():
        ref, ours = bench_conv_vae.build(SHIPPED_CONV_VAE_CONFIG, device, bf16)
        del ref  # its encoder is not part of the decode graph
        return ours
    out["7"] = (Loaded.register(timed("conv_vae", conv), _info("conv_vae", Kind.CONV_VAE)), "conv")
    diff = timed("diffusion_vae", lambda: bench_diffusion_vae.build(bench_diffusion_vae.RELEASED_METADATA, device, bf16))
    out["8"] = (Loaded.register(diff, _info("diffusion_vae", Kind.DIFFUSION_VAE)), "diffusion")

    def audio():
        metadata = _audio_metadata()
        config = av.AudioVAEConfig.from_metadata("bench", metadata)
        vocoder = av.vocoder_kwargs("bench", metadata)

        def make():
            vae = av.AudioVAE(config, vocoder)
            av._finish_vocoder(vae)  # the loader's init hook: sinc resampler + fp32 vocoder
            return vae
        vae = _on_device(device, bf16, make)
        vae.vocoder.float()
        return vae.eval().requires_grad_(False)
    out["9"] = (Loaded.register(timed("audio_vae", audio), _info("audio_vae", Kind.AUDIO_VAE)),)
    return out, seconds, gemma


def _file_backed(module: torch.nn.Module, path: str) -> None:
    """`module`'s weights written to `path` and replaced by views of its memory map, where a loader leaves a model's
    weights (each copied first: a file holds no tensors that share memory)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in module.state_dict().items()}, path)
    with safe_open(path, framework="pt") as f:
        module.load_state_dict({k: f.get_tensor(k) for k in f.keys()}, assign=True)


# ------------------------------------------------------------------------------------------------ the run
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _on_gpu(module: torch.nn.Module) -> bool:
    return any(p.device.type == "cuda" for p in module.parameters())


def _residency(heavy: dict[str, torch.nn.Module]) -> list[str]:
    return [name for name, module in heavy.items() if _on_gpu(module)]


def _engine_counts() -> dict:
    """The engine's counters: CUDA graphs captured and their warm-up forwards, LoRA layers whose on-the-fly factors
    were copied next to their weight or taken back from the parked set (kernels/lora_linear.py)."""
    return {"graph_captures": CAPTURES.captures, "graph_warmup_calls": CAPTURES.warmup_calls,
            "lora_layers_built": LORA_INSTALLS.built_layers, "lora_layers_reused": LORA_INSTALLS.reused_layers}


def run_graph(prompt: dict, preset: dict, device: torch.device, heavy: dict,
              only: tuple[str, ...] = ()) -> tuple[dict, dict, float]:
    """The graph through the runner's executor (async saves overlap later nodes, as in ComfyUI); loader ids in
    `preset` are not run; with `only`, just those nodes. ({node id: seconds, start/end offsets, memory, residency},
    {node id: output tuple}, wall seconds)."""
    if only:
        prompt = {k: v for k, v in prompt.items() if k in only or k in preset}
    cuda, rows, origin = device.type == "cuda", {}, time.perf_counter()

    def on_start(node_id: str) -> None:
        node = prompt[node_id]
        row = rows[node_id] = {"node": node.get("_meta", {}).get("title", node["class_type"]),
                               "on_gpu_start": _residency(heavy)}
        if cuda:
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            row["alloc_start_gib"] = torch.cuda.memory_allocated(device) / GiB
        row["counts_start"] = _engine_counts()
        row["t_start"] = time.perf_counter() - origin

    def on_end(node_id: str, result, seconds: float) -> None:
        _sync(device)
        row = rows[node_id]
        row["t_end"] = time.perf_counter() - origin
        row["s"] = row["t_end"] - row["t_start"]
        if cuda:
            free, total = torch.cuda.mem_get_info(device)
            row.update(peak_gib=torch.cuda.max_memory_allocated(device) / GiB,
                       alloc_end_gib=torch.cuda.memory_allocated(device) / GiB,
                       driver_used_end_gib=(total - free) / GiB)
        row["on_gpu_end"] = _residency(heavy)
        row.update({k: v - row["counts_start"][k] for k, v in _engine_counts().items()})
        if isinstance(result, dict) and prompt[node_id]["class_type"] == "LTX25DiffusionVAEDecode":
            row["decode_stats"] = result.get("ui", {}).get("ltx25_decode_stats")
        counts = "".join(f"  {k} {row[k]}" for k in _engine_counts() if row[k])
        print(f"[bench] {node_id:>3} {row['node']:<36} {row['s']:8.3f} s  (ends at {row['t_end']:.3f} s){counts}",
              file=sys.stderr, flush=True)

    result = run_execute(prompt, NODE_CLASS_MAPPINGS, preset=preset, on_start=on_start, on_end=on_end,
                         targets=only or None)
    return rows, result["outputs"], result["wall_s"]


# --cpu-trace: a sampler process reads /proc/stat (every core's busy time) and this process's own CPU time
_SAMPLER = """
import sys, time
pid, out = sys.argv[1], open(sys.argv[2], "w", buffering=1)
while True:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    with open(f"/proc/{pid}/stat") as f:
        mine = f.read().rsplit(")", 1)[1].split()
    busy, mine = sum(fields) - fields[3] - fields[4], int(mine[11]) + int(mine[12])  # all but idle and iowait
    out.write(f"{time.monotonic()} {busy} {sum(fields)} {mine}\\n")
    time.sleep(0.025)
"""


class Pauses:
    """What can stall a run besides its nodes: the garbage collector's passes (the GIL held throughout), each as
    (perf_counter start, seconds)."""

    def __init__(self) -> None:
        self.gc: list[tuple[float, float]] = []
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc.append((self._gc_start, time.perf_counter() - self._gc_start))

    def window(self, start: float, end: float) -> dict:
        def inside(events):
            return [(round(t - start, 3), round(s, 3)) for t, s in events if start <= t <= end]
        gc_passes = inside(self.gc)
        return {"gc_passes": len(gc_passes), "gc_s": round(sum(s for _, s in gc_passes), 3),
                "gc_longest": max(gc_passes, key=lambda e: e[1], default=None)}


class CpuTrace:
    """Cores busy over a time window, in 100 ms bins: all of them, and those of this process (the graph's threads,
    the saves' encoders among them; the rest is anything else on the machine)."""

    def __init__(self) -> None:
        handle, self.path = tempfile.mkstemp(prefix="cpu_trace_")
        os.close(handle)  # the sampler opens it by name
        self.sampler = subprocess.Popen([sys.executable, "-c", _SAMPLER, str(os.getpid()), self.path])

    def window(self, start: float, end: float, step: float = 0.1) -> dict:
        """{"t": bin starts after `start`, "all": cores busy, "graph": this process's cores} (time.perf_counter
        times: CLOCK_MONOTONIC, as the sampler's time.monotonic)."""
        with open(self.path) as f:
            rows = [tuple(float(v) for v in line.split()) for line in f if line.count(" ") == 3]
        cores = os.cpu_count() or 1
        bins: dict = {"t": [], "all": [], "graph": []}
        t = start
        while t < end:
            inside = [r for r in rows if t <= r[0] <= t + step]
            if len(inside) >= 2:
                (t0, b0, a0, m0), (t1, b1, a1, m1) = inside[0], inside[-1]
                bins["t"].append(round(t - start, 2))
                bins["all"].append(round(cores * (b1 - b0) / max(1.0, a1 - a0), 1))
                bins["graph"].append(round(cores * (m1 - m0) / max(1.0, a1 - a0), 1))
            t += step
        return bins

    def close(self) -> None:
        self.sampler.kill()
        self.sampler.wait()
        os.remove(self.path)


def _table(cold: dict, warm: dict) -> str:
    lines = [f"{'node':>4} {'title':<36} {'cold s':>8} {'warm s':>8} {'ends at':>8} {'peak GiB':>9} {'alloc end':>9}  "
             "on GPU at start"]
    for node_id, row in cold.items():
        w = warm.get(node_id, {})
        lines.append(f"{node_id:>4} {row['node']:<36} {row['s']:8.3f} {w.get('s', float('nan')):8.3f} "
                     f"{w.get('t_end', float('nan')):8.3f} "
                     f"{w.get('peak_gib', row.get('peak_gib', 0.0)):9.2f} {w.get('alloc_end_gib', 0.0):9.2f}  "
                     f"{','.join(w.get('on_gpu_start', row['on_gpu_start']))}")
    return "\n".join(lines)


def cold_and_warm(prompt: dict, preset: dict, device: torch.device, heavy: dict, result: dict, out: str) -> int:
    """A variant graph's two runs (bench_i2v_graph, bench_dev_graph): cold, then warm; per node seconds and peak
    GiB and both walls into `result`, written as JSON to `out`."""
    def rows(run: dict) -> dict:
        return {k: {"node": r["node"], "s": round(r["s"], 3), "peak_gib": round(r.get("peak_gib", 0.0), 3),
                    **{c: r[c] for c in _engine_counts()}} for k, r in run.items()}
    cold, _, cold_wall = run_graph(prompt, preset, device, heavy)
    warm, _, warm_wall = run_graph(prompt, preset, device, heavy)
    result.update(cold_wall_s=round(cold_wall, 3), warm_wall_s=round(warm_wall, 3), cold=rows(cold),
                  warm=rows(warm))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({"cold_wall_s": result["cold_wall_s"], "warm_wall_s": result["warm_wall_s"]}))
    return 0


def _patched(module, name: str, value):
    def patch():
        original = getattr(module, name)
        setattr(module, name, value)
        return lambda: setattr(module, name, original)
    return patch


def _previews_in_line(*args, **kwargs):
    names = previews.write_preview_frames(*args, **kwargs)
    previews.wait_for_previews()
    return names


def _compare_in_line(self, images_a, images_b, label_a, label_b, layout, resize_b, stats_a=None, stats_b=None):
    """The compare as a plain function: its work on the graph's thread, the saves waiting for it."""
    from nodes.ltx.decode.compare import check_labels
    check_labels(label_a, label_b)
    return self._compare(images_a, images_b, label_a, label_b, layout, resize_b, stats_a, stats_b,
                         bridge.check_interrupt)


# --ab: (variant, patch → undo) pairs, each a bench-only patch of one choice the pack makes
AB_VARIANTS = {
    "previews": [("previews_in_line", _patched(compare_node, "write_preview_frames", _previews_in_line)),
                 ("previews_in_background", lambda: (lambda: None))],
    "compare": [("compare_in_line", _patched(compare_node.LTX25DecoderCompare, "compare", _compare_in_line)),
                ("compare_beside_the_saves", lambda: (lambda: None))],
}


def quantize_blocks(model: torch.nn.Module, kind: str) -> int:
    """Replace every nn.Linear inside the DiT's blocks by a `QuantizedLinear` of its weight (as a quantized file loads
    'as stored'); returns how many were replaced."""
    from nodes.ltx.files.quant import LayerFormat
    from nodes.ltx.files import quant
    from nodes.ltx.kernels.quantized_linear import QuantizedLinear

    count = 0
    for block in model.streamable_blocks()[0]:
        for owner in list(block.modules()):
            for name, child in list(owner.named_children()):
                if type(child) is torch.nn.Linear and child.in_features % 16 == 0:
                    fmt = LayerFormat(kind, 0)
                    stored = quant.quantize(fmt, child.weight.detach().float())
                    bias = None if child.bias is None else child.bias.detach()
                    setattr(owner, name, QuantizedLinear(fmt, child.in_features, child.out_features, stored["weight"],
                                                         stored["weight_scale"], stored.get("weight_scale_2"),
                                                         bias).eval())
                    count += 1
    torch.cuda.empty_cache()
    return count


def _rss_gib() -> float:
    """The process's resident host memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GiB


def _peak_rss_gib() -> float:
    """The process's peak resident host memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, the tiny set through the loader nodes, 192×128×17")
    parser.add_argument("--acceleration", default=None, help="sampler acceleration (default: compile_cuda_graph on "
                        "CUDA, eager on the CPU)")
    parser.add_argument("--ab-runs", type=int, default=0, help="then N pairs of warm runs, alternating two ways "
                        "of one choice (--ab)")
    parser.add_argument("--ab", choices=sorted(AB_VARIANTS), default="previews", help="previews: the compare's "
                        "viewer frames written in line or in the background; compare: the compare's work on the "
                        "graph's thread or on a worker beside the saves")
    parser.add_argument("--cpu-trace", action="store_true", help="record the cores busy during each A/B run "
                        "(Linux /proc/stat), in 100 ms bins")
    parser.add_argument("--skip-new-prompt", action="store_true", help="skip the new-prompt encode after run 2")
    parser.add_argument("--offload-first", action="store_true",
                        help="CUDA: move every built module to the CPU before run 1 (as the loaders leave them)")
    parser.add_argument("--card-gib", type=float, default=0.0,
                        help="CUDA: hold a filler allocation so only this many GiB of the card are usable, to watch "
                        "model management evict (on a 141 GB card all 66.6 GiB of weights fit and nothing moves)")
    parser.add_argument("--transformer", choices=("bf16", "nvfp4"), default="bf16", help="CUDA: nvfp4 quantizes "
                        "every Linear of the DiT's blocks as the released -nvfp4 file stores them (kept packed, "
                        "dequantized just in time)")
    parser.add_argument("--conv-only", action="store_true", help="drop the diffusion decoder and the compare: the "
                        "conv-VAE graph (workflows/api/ltx25_t2v_distilled_conv.json's nodes), for the smallest cards")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHTxFRAMES on CUDA (default 768x512x121)")
    parser.add_argument("--heavy-files", default=None, help="CUDA: a folder with the transformer and Gemma as "
                        "real-shape files (diffusion_models/transformer-bf16.safetensors and text_encoders/"
                        "gemma.safetensors, as bench_host_memory.py --dit-blocks 48 --gemma-layers 48 writes them): "
                        "those two load through the loader nodes and Encode Prompt, as a user's files do, so the "
                        "host memory figures are the graph's own; the small models are built in memory and given "
                        "the same kind of host memory (views of a file they are written to there)")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_ab_graph.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    acceleration = args.acceleration or ("eager" if args.smoke else "compile_cuda_graph")
    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    width, height, frames = (192, 128, 17) if args.smoke else (768, 512, 121)
    if args.size:
        width, height, frames = (int(v) for v in args.size.lower().split("x"))
    prompt["5"]["inputs"].update(width=width, height=height, frames=frames)
    from nodes.ltx.latents import check_video_size
    check_video_size(width, height, frames, two_stage=True, where="--size")  # before minutes of building weights
    for node_id in SAMPLERS:
        prompt[node_id]["inputs"]["acceleration"] = acceleration
    if args.conv_only:
        for node_id in CONV_ONLY_DROPS:
            del prompt[node_id]
    else:
        prompt["14"]["inputs"]["processor"] = "auto"

    work = tempfile.mkdtemp(prefix="bench_ab_graph_")
    bridge.set_models_dir(os.path.join(work, "models"))
    bridge.set_output_dir(os.path.join(work, "output"))
    write_tiny_set(os.path.join(work, "models"))
    validate(prompt, NODE_CLASS_MAPPINGS)  # against the tiny files' names (= the official names)
    te.clear_caches()
    result: dict = {"bench": "ab_graph_conv_only" if args.conv_only else "ab_graph",
                    "shape": f"{width}x{height}x{frames}", "acceleration": acceleration,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "errors": {}}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        result["gpu_total_gib"] = torch.cuda.mem_get_info(device)[1] / GiB
        tiny_text_encoder = os.path.join(work, "models", *OFFICIAL_FILES["text_encoder"])
        from_files = args.heavy_files is not None
        preset, result["build_s"], gemma = build_real(device, tiny_text_encoder, args.transformer,
                                                      text_encoder=not from_files, transformer=not from_files,
                                                      release_to_host=bool(args.card_gib))
        if from_files:  # the released names in the models folder lead to the real-shape files
            for component, written in (("transformer", "diffusion_models/transformer-bf16.safetensors"),
                                       ("text_encoder", "text_encoders/gemma.safetensors")):
                official = os.path.join(work, "models", *OFFICIAL_FILES[component])
                os.remove(official)
                os.symlink(os.path.abspath(os.path.join(args.heavy_files, written)), official)
            for node_id, built in preset.items():  # the small models: views of a file too, as loaders leave them
                _file_backed(built[0].module, os.path.join(args.heavy_files, f"{LOADERS[node_id]}.safetensors"))
            torch.cuda.empty_cache()
            loaded, outputs, _ = run_graph(prompt, {}, device, {}, only=("1", "2"))
            preset.update({k: outputs[k] for k in ("1", "2")})
            result["build_s"].update({LOADERS[k]: round(row["s"], 3) for k, row in loaded.items()})
            result["host_rss_gib_after_loaders"] = _rss_gib()
        preset = {k: v for k, v in preset.items() if k in prompt}
        result["transformer_format"] = args.transformer
        heavy = {LOADERS[k]: v[0].module for k, v in preset.items() if k != "2"}
        if gemma is not None:
            heavy["text_encoder"] = gemma
        result["weights_gib"] = {name: bridge.module_bytes(m) / GiB for name, m in heavy.items()}
        if args.offload_first:
            for module in heavy.values():
                module.to("cpu")
            torch.cuda.empty_cache()
        result["alloc_after_build_gib"] = torch.cuda.memory_allocated(device) / GiB
        if args.card_gib:
            filler_bytes = int(result["gpu_total_gib"] * GiB - args.card_gib * GiB)
            filler = torch.empty(filler_bytes, dtype=torch.uint8, device=device)  # held until the process ends
            result["card_gib"], result["filler_gib"] = args.card_gib, filler.numel() / GiB
    else:
        loader_ids = tuple(k for k in LOADERS if k in prompt)
        loaders, outputs, _ = run_graph(prompt, {}, device, {}, only=loader_ids)  # the normal loader nodes
        preset = {k: outputs[k] for k in LOADERS if k in prompt}
        result["build_s"] = {LOADERS[k]: round(row["s"], 3) for k, row in loaders.items()}
        heavy = {LOADERS[k]: v[0].module for k, v in preset.items() if k != "2"}
    trace, pauses = CpuTrace() if args.cpu_trace else None, Pauses()
    try:
        start = time.perf_counter()
        cold, _, cold_wall = run_graph(prompt, preset, device, heavy)
        result["pauses"] = {"cold": pauses.window(start, start + cold_wall)}
        start = time.perf_counter()
        result["host_peak_rss_gib_after_cold"] = _peak_rss_gib()
        warm, _, warm_wall = run_graph(prompt, preset, device, heavy)
        result["pauses"]["warm"] = pauses.window(start, start + warm_wall)
        result["host_peak_rss_gib_after_warm"] = _peak_rss_gib()
        for run in range(args.ab_runs):  # the same warm graph, alternating the pack's way and the other
            for variant, patch in AB_VARIANTS[args.ab]:
                undo = patch()
                try:
                    start = time.perf_counter()
                    rows, _, wall = run_graph(prompt, preset, device, heavy)
                finally:
                    undo()
                    previews.wait_for_previews()
                result.setdefault("ab_runs", {}).setdefault(variant, []).append(round(wall, 3))
                result["pauses"].setdefault(variant, []).append(pauses.window(start, start + wall))
                if trace:
                    time.sleep(0.1)
                    result.setdefault("cpu_trace", {}).setdefault(variant, []).append(
                        {**trace.window(start, start + wall + 0.1),
                         "ends": {row["node"]: round(row["t_end"], 2) for row in rows.values()}})
                print(f"[bench] warm run, {variant}: {wall:.3f} s", file=sys.stderr, flush=True)
        fresh = dict(prompt)
        fresh["3"] = {**prompt["3"], "inputs": {**prompt["3"]["inputs"], "prompt": NEW_PROMPT}}
        new_prompt = {} if args.skip_new_prompt else run_graph(fresh, preset, device, heavy, only=("3",))[0]
        result["host_peak_rss_gib_after_new_prompt"] = _peak_rss_gib()
        result["host_rss_gib_at_end"] = _rss_gib()
    except Exception as e:  # record what ran; the traceback goes to stderr
        traceback.print_exc()
        result["errors"]["graph"] = f"{type(e).__name__}: {e}"
        print(json.dumps(result, default=str))
        return 1
    finally:
        if trace:
            trace.close()
    decoded = [k for k in cold if k not in OUTPUTS]
    result.update(
        cold=cold, warm=warm, encode_new_prompt=new_prompt.get("3"),
        end_to_end_cold_s=cold_wall, end_to_end_warm_s=warm_wall,
        to_decoded_warm_s=max(warm[k]["t_end"] for k in decoded),  # the saves may still run then
        compile_and_capture_s={k: cold[k]["s"] - warm[k]["s"] for k in SAMPLERS},
        transformer_on_gpu_at_decoder_start={k: "transformer" in warm[k]["on_gpu_start"] for k in DECODERS
                                             if k in warm},
        loaded_models_at_end=bridge.loaded_model_count())
    print(_table(cold, warm))
    print(f"end to end: cold {result['end_to_end_cold_s']:.2f} s, warm {result['end_to_end_warm_s']:.2f} s "
          f"(to decoded frames + audio, warm: {result['to_decoded_warm_s']:.2f} s); "
          f"new-prompt encode {new_prompt['3']['s'] if new_prompt else float('nan'):.2f} s")
    line = json.dumps(result, default=str)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
