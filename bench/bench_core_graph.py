"""ComfyUI core's own LTX-2.5 text-to-video graph and the pack's A/B graph, one after the other in one process on one
GPU, at the same sizes (issue 24): first and warm seconds per graph and per node, and ours / core.

GPU, one call per size (about 4 and 7 min; the 10-minute limit does not hold both), carrying only `.comfy` (built
here by `sh bench/comfy_carry.sh /work/comfyui-033 .comfy`: ComfyUI's source and site.tar.xz with comfy-kitchen,
PyAV and diffusers, 56 MB):

    source bench/gpu_setup.sh; python3 bench/bench_core_graph.py --comfyui .comfy/ComfyUI \
      --site .comfy/site.tar.xz --sizes 1280x704x121 --out $OUT/core_graph_1280x704.json
    (the same with --sizes 1920x1088x121 --out $OUT/core_graph_1920x1088.json)

CPU, the plumbing on the tiny set at 192×128×17 (about a minute):

    /work/comfy-venv-291/bin/python bench/bench_core_graph.py --comfyui /work/comfyui-033 --smoke

What runs. ComfyUI runs in this process as bench/bench_comfyui_lowvram.py runs it (bench/comfy_inprocess.py): its own
`PromptExecutor`, model management and node classes, the pack loaded as a custom node, core's LTXV nodes from their
`comfy_extras` files. Core's graph is the one its official template `video_ltx2_5_t2v` (comfyui-workflow-templates)
builds inside its subgraph, in API form (`core_prompt`): stage 1 at half size (Empty LTXV Latent Video + LTXV Empty
Latent Audio, Concat AV Latent, Random Noise, euler_ancestral, Manual Sigmas 1.0 … 0.0 (8 steps), LTXV Dual CFG
Guider at 1 / 1, Sampler Custom Advanced), Separate AV Latent, LTXV Latent Upsampler, stage 2 (sigmas 0.85 … 0.0, 3
steps, noise seed 42 as the template fixes it), VAE Decode (Tiled) 512 / 64 / 64 / 16 as the template's, LTXV Audio
VAE Decode, Create Video and Save Video. Ours is workflows/api/ltx25_t2v_distilled_decoder_ab.json (both decoders,
the compare and three saves). Both at `--sizes` (default 1280×704×121 and 1920×1088×121: the two-stage graphs need
multiples of 64, so 704 stands for 720), one run with seed 42 then `--warm-runs` runs each with a new seed (the
executor keeps its cache, as a server does: the loaders and text nodes are not run again).

Weights. Real-shape RANDOM bf16 weights built in memory (the files are 66 GB): bench_ab_graph.build_real builds the
pack's modules from the released configs under `torch.manual_seed(--weights-seed)`; their tensors, renamed to the
released files' keys by each module's key map, are handed to core's own loaders (UNETLoader, VAELoader, Latent
Upscale Model Loader, with `comfy.utils.load_torch_file` serving them) beside the released metadata, so core builds
its models from the very values ours uses. Core's loaded models stay on the host, as its loaders leave them; the pack's
modules are freed, and built again with the same seed (the JSON's `same_weights` compares their sums) after core's
models are freed: both graphs' weights (42 + 3 GiB each side) and 1920×1088 activations would not fit one card
together. The pack's modules are then offloaded to the host, as its loaders leave them. Every loader node of both
graphs hands out these prebuilt models, so neither graph's first run reads or builds weights. With `--smoke` the
pack's models are its loader nodes' outputs on the tiny files, and core's are built from them the same way.

Text. No Gemma on either side: both graphs get the same random text features as tensors from a bench node (ours:
the Encode Prompt's LTX25_TEXT_FEATURES, 128 valid tokens of 1024; core: CLIP Text Encode's CONDITIONING for the
positive (the same 128 tokens) and the negative prompt, with `unprocessed_ltxav_embeds` as core's LTXAV encoder
sets it). Both run their embeddings connectors: ours once (its Connector node is cached in warm runs), core's in
every sampler call on the positive and the negative conditioning, as core does.

Measured per size and graph: the first run and each warm run (wall seconds of `PromptExecutor.execute`; the prompt is
validated before), their median, when the decoded frames and audio were done (`decoded_s`: the end of the last decode
node), each executed node's seconds (the device synchronized around every node; an async node's end is its last
task's), peak allocated device memory; `comparison` holds core_seconds, ours_seconds and their ratio (warm medians;
the goal is ≤ 0.5), and the same for the first run and for `decoded_s`.

Not comparable, or not like a ComfyUI server:
- the graphs differ in work: ours decodes with both decoders, compares them and saves three videos; core decodes once
  (conv VAE, tiled) and saves one. Core's template loads the diffusion VAE file (`ltx-2.5-video-vae-bf16`) into that
  decode; here it is the conv file, as the issue's goal names core's conv path (core's diffusion decode: the peer
  figures in docs/PERFORMANCE.md). Its template's transformer and Gemma files are comfy-int8-convrot; here the bf16
  transformer on both sides;
- Gemma and the prompt enhancer are skipped on both sides (above);
- main.py's start-up is not run: no dynamic VRAM (comfy-aimdo), cuDNN autotuning off as main.py leaves it (both sides;
  `--cudnn-benchmark` turns it on for both), and torch's caching allocator unless `--comfyui-allocator`, which selects
  cudaMallocAsync before torch starts, as main.py does on CUDA 13;
- the saved videos are random noise, x264's worst case: real weights make both graphs' saves shorter;
- the first runs: ours' captures its samplers' CUDA graphs (the workflow's acceleration `auto`; with `--acceleration
  compile_cuda_graph` it also compiles, with empty caches on a fresh machine), core's moves its 42 GiB transformer
  from the host; both move their models from pageable host memory. With two sizes in one call the second size's
  first run finds the process warm.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import weakref

import comfy_inprocess as ci

WORKFLOW = os.path.join(ci.ROOT, "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json")
CORE_EXTRAS = ("nodes_lt.py", "nodes_lt_audio.py", "nodes_audio.py", "nodes_lt_upsampler.py", "nodes_hunyuan.py",
               "nodes_custom_sampler.py", "nodes_video.py")
STAGE1_SIGMAS = "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0"  # the template's
STAGE2_SIGMAS = "0.85, 0.7250, 0.4219, 0.0"
DEFAULT_SIZES, SMOKE_SIZE = "1280x704x121,1920x1088x121", "192x128x17"
FPS = 24
SEED = 42
PROMPT_TOKENS, NEGATIVE_TOKENS, TEXT_LENGTH = 128, 16, 1024
CORE_DECODES, OURS_DECODES = ("374", "358"), ("13", "14", "15")
COMPONENTS = {"transformer": "1", "conv_vae": "7", "audio_vae": "9", "upsampler": "6"}  # core's files: our node ids


# ------------------------------------------------------------------------------------------------ the two graphs
def core_prompt(width: int, height: int, frames: int, seed: int, files: dict[str, str]) -> dict:
    """Core's template `video_ltx2_5_t2v` as its subgraph wires it (its node ids), in API form; `files`: component →
    file name. The prompt text nodes are node "900" (the bench's conditioning), the size and rate primitives and
    math nodes are inlined."""
    def node(class_type, **inputs):
        return {"class_type": class_type, "inputs": inputs}
    return {
        "384": node("UNETLoader", unet_name=files["transformer"], weight_dtype="default"),
        "385": node("VAELoader", vae_name=files["conv_vae"]),
        "386": node("VAELoader", vae_name=files["audio_vae"]),
        "371": node("LatentUpscaleModelLoader", model_name=files["upsampler"]),
        "900": node("BenchCoreConditioning"),
        "365": node("LTXVConditioning", positive=["900", 0], negative=["900", 1], frame_rate=float(FPS)),
        "356": node("EmptyLTXVLatentVideo", width=width // 2, height=height // 2, length=frames, batch_size=1),
        "366": node("LTXVEmptyLatentAudio", frames_number=frames, frame_rate=FPS, batch_size=1, audio_vae=["386", 0]),
        "377": node("LTXVConcatAVLatent", video_latent=["356", 0], audio_latent=["366", 0]),
        "339": node("RandomNoise", noise_seed=seed),
        "352": node("KSamplerSelect", sampler_name="euler_ancestral"),
        "404": node("ManualSigmas", sigmas=STAGE1_SIGMAS),
        "388": node("LTXVDualCFGGuider", model=["384", 0], positive=["365", 0], negative=["365", 1], video_cfg=1.0,
                    audio_cfg=1.0),
        "344": node("SamplerCustomAdvanced", noise=["339", 0], guider=["388", 0], sampler=["352", 0],
                    sigmas=["404", 0], latent_image=["377", 0]),
        "367": node("LTXVSeparateAVLatent", av_latent=["344", 0]),
        "348": node("LTXVLatentUpsampler", samples=["367", 0], upscale_model=["371", 0], vae=["385", 0]),
        "340": node("LTXVConcatAVLatent", video_latent=["348", 0], audio_latent=["367", 1]),
        "338": node("RandomNoise", noise_seed=42),
        "341": node("KSamplerSelect", sampler_name="euler_ancestral"),
        "395": node("ManualSigmas", sigmas=STAGE2_SIGMAS),
        "391": node("LTXVDualCFGGuider", model=["384", 0], positive=["365", 0], negative=["365", 1], video_cfg=1.0,
                    audio_cfg=1.0),
        "368": node("SamplerCustomAdvanced", noise=["338", 0], guider=["391", 0], sampler=["341", 0],
                    sigmas=["395", 0], latent_image=["340", 0]),
        "369": node("LTXVSeparateAVLatent", av_latent=["368", 0]),
        "374": node("VAEDecodeTiled", samples=["369", 0], vae=["385", 0], tile_size=512, overlap=64,
                    temporal_size=64, temporal_overlap=16),
        "358": node("LTXVAudioVAEDecode", samples=["369", 1], audio_vae=["386", 0]),
        "370": node("CreateVideo", images=["374", 0], audio=["358", 0], fps=float(FPS)),
        "75": node("SaveVideo", video=["370", 0], filename_prefix="video/LTX_2.5_t2v", format="auto",
                   **{"format.codec": "auto"}),
    }


def ours_prompt(width: int, height: int, frames: int, seed: int, acceleration: str | None) -> dict:
    """The A/B workflow at this size and seed, its text encoder loader and Encode Prompt replaced by the bench's
    text-features node."""
    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    del prompt["2"]
    prompt["3"] = {"class_type": "BenchTextFeatures", "inputs": {}}
    prompt["5"]["inputs"].update(width=width, height=height, frames=frames)
    for node_id in ("10", "12"):
        prompt[node_id]["inputs"]["seed"] = seed
        if acceleration:
            prompt[node_id]["inputs"]["acceleration"] = acceleration
    return prompt


class BenchCoreConditioning:
    """Stands in for core's two CLIP Text Encode nodes: the positive and negative CONDITIONING, given as tensors."""
    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "give"
    CATEGORY = "bench"
    value: tuple = ()

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def give(self):
        return self.value


class BenchTextFeatures(BenchCoreConditioning):
    """Stands in for the pack's Encode Prompt: its LTX25_TEXT_FEATURES, given as tensors."""
    RETURN_TYPES = ("LTX25_TEXT_FEATURES",)


def text_inputs(torch, video_dim: int, audio_dim: int, source) -> tuple[tuple, tuple]:
    """(core's (positive, negative) conditioning, ours' (TextFeatures,)) from one seeded draw: core's encoder returns
    only the valid tokens, [1, n, video + audio] float32; ours' features are [1, 1024, dim], left-padded with zeros,
    with their mask."""
    from nodes.ltx.conditioning import TextFeatures
    g = torch.Generator().manual_seed(SEED)
    positive = torch.randn(1, PROMPT_TOKENS, video_dim + audio_dim, generator=g)
    negative = torch.randn(1, NEGATIVE_TOKENS, video_dim + audio_dim, generator=g)
    extra = {"pooled_output": None, "unprocessed_ltxav_embeds": True}
    core = ([[positive, dict(extra)]], [[negative, dict(extra)]])
    padded = torch.zeros(1, TEXT_LENGTH, video_dim + audio_dim, dtype=torch.bfloat16)
    padded[:, -PROMPT_TOKENS:] = positive.to(torch.bfloat16)
    mask = torch.zeros(1, TEXT_LENGTH, dtype=torch.int64)
    mask[:, -PROMPT_TOKENS:] = 1
    ours = (TextFeatures(padded[..., :video_dim].contiguous(), padded[..., video_dim:].contiguous(), mask, source),)
    return core, ours


# ------------------------------------------------------------------------------------------------ weights
def build_ours(torch, device, models: str, pack_classes: dict, seed: int) -> tuple[dict, dict]:
    """({loader node id: output tuple}, {component: build seconds}): the released shapes on CUDA, the loader nodes'
    own outputs on the tiny files with `--smoke` (device cpu)."""
    import bench_ab_graph
    torch.manual_seed(seed)
    if device.type == "cuda":
        preset, seconds, _ = bench_ab_graph.build_real(device, None, text_encoder=False)
        return preset, seconds
    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    preset, seconds = {}, {}
    for node_id, component in bench_ab_graph.LOADERS.items():
        if node_id == "2":
            continue
        start = time.perf_counter()
        node = pack_classes[prompt[node_id]["class_type"]]()
        preset[node_id] = tuple(node.load(**prompt[node_id]["inputs"]))
        seconds[component] = round(time.perf_counter() - start, 2)
    return preset, seconds


def fingerprint(torch, preset: dict) -> dict[str, float]:
    """Each module's sum of all parameters and buffers (float64): equal sums for equal seeds."""
    return {node_id: float(sum(t.detach().double().sum().item() for t in outputs[0].module.state_dict().values()
                               if t.is_floating_point()))
            for node_id, outputs in sorted(preset.items())}


def released_metadata(component: str) -> dict:
    """The released header of a component's file, as bench_ab_graph builds it (docs/MODEL.md)."""
    import bench_ab_graph
    from nodes.ltx.dit.transformer import SHIPPED_CONFIG
    from nodes.ltx.release import MODEL_VERSION, SHIPPED_CONV_VAE_CONFIG
    from nodes.tools.tiny.transformer import tiny_metadata
    return {"transformer": lambda: tiny_metadata(SHIPPED_CONFIG),
            "conv_vae": lambda: {"config": {"vae": dict(SHIPPED_CONV_VAE_CONFIG)}, "model_version": MODEL_VERSION},
            "audio_vae": bench_ab_graph._audio_metadata,
            "upsampler": lambda: {"config": bench_ab_graph.UPSAMPLER_CONFIG}}[component]()


def native_files(preset: dict, models: str, smoke: bool) -> dict[str, tuple[dict, dict]]:
    """{file path: (state dict under the file's own keys, header metadata as strings)} for core's loaders: each of
    ours' modules renamed back by its key map (the tensors shared, not copied). The encoders, which a decode-only
    module lacks and a text-to-video graph never runs, are absent: core's VAE loader reports them missing."""
    from safetensors import safe_open
    from nodes.ltx import audio_vae, upsampler
    from nodes.ltx.decode import conv_vae
    from nodes.ltx.dit import transformer
    from nodes.ltx.release import OFFICIAL_FILES
    key_maps = {"transformer": transformer.KEY_MAP, "conv_vae": conv_vae.KEY_MAP, "audio_vae": audio_vae.KEY_MAP,
                "upsampler": upsampler.KEY_MAP}
    files = {}
    for component, node_id in COMPONENTS.items():
        path = os.path.realpath(os.path.join(models, *OFFICIAL_FILES[component]))
        if smoke:  # the tiny file's own header
            with safe_open(path, "pt") as f:
                metadata = dict(f.metadata())
        else:
            metadata = {k: v if isinstance(v, str) else json.dumps(v)
                        for k, v in released_metadata(component).items()}
        files[path] = (key_maps[component].to_native(preset[node_id][0].module.state_dict()), metadata)
    return files


def build_core(comfy, files: dict, names: dict[str, str]) -> tuple[dict, dict]:
    """({file name: core loader's output tuple}, {loader: seconds}): core's own loader nodes on the in-memory files."""
    import comfy.utils as comfy_utils
    real_load = comfy_utils.load_torch_file

    def load_torch_file(ckpt, safe_load=False, device=None, return_metadata=False):
        entry = files.get(os.path.realpath(ckpt))
        if entry is None:
            return real_load(ckpt, safe_load=safe_load, device=device, return_metadata=return_metadata)
        sd, metadata = dict(entry[0]), dict(entry[1])
        return (sd, metadata) if return_metadata else sd

    nodes = comfy.nodes
    loaders = {"transformer": lambda name: nodes.UNETLoader().load_unet(name, "default"),
               "conv_vae": lambda name: nodes.VAELoader().load_vae(name),
               "audio_vae": lambda name: nodes.VAELoader().load_vae(name),
               "upsampler": lambda name: tuple(nodes.NODE_CLASS_MAPPINGS["LatentUpscaleModelLoader"].execute(
                   model_name=name).result)}
    built, seconds = {}, {}
    comfy_utils.load_torch_file = load_torch_file
    try:
        for component, load in loaders.items():
            start = time.perf_counter()
            built[names[component]] = tuple(load(names[component]))
            seconds[component] = round(time.perf_counter() - start, 2)
    finally:
        comfy_utils.load_torch_file = real_load
    return built, seconds


def core_modules_of(built: dict) -> list:
    """The torch modules inside core's loaded models (a MODEL's or an upscale model's `model`, a VAE's
    `first_stage_model`)."""
    modules = []
    for outputs in built.values():
        for value in outputs:
            module = getattr(value, "first_stage_model", None)
            module = getattr(value, "model", None) if module is None else module
            if module is not None:
                modules.append(module)
    return modules


def kitchen_backends() -> dict[str, bool] | None:
    """comfy-kitchen's backends as ComfyUI configured them ({name: available}), None without the package: core's LTX
    transformer runs its RoPE through `comfy.quant_ops.ck` (the CUDA kernels on the GPU)."""
    import comfy.quant_ops as quant_ops
    if not quant_ops._CK_AVAILABLE:
        return None
    return {name: bool(info.get("available")) and not info.get("disabled")
            for name, info in quant_ops.ck.list_backends().items()}


def freed(refs: list, device, torch, mm=None) -> dict:
    """After a garbage collection (and ComfyUI's own clean-up): whether every referenced module is gone, and the
    device memory still allocated."""
    gc.collect()
    if mm is not None:
        mm.cleanup_models()
        mm.soft_empty_cache()
    elif device.type == "cuda":
        torch.cuda.empty_cache()
    out = {"all": all(ref() is None for ref in refs), "alive": sum(ref() is not None for ref in refs)}
    if device.type == "cuda":
        out["allocated_gib"] = round(torch.cuda.memory_allocated(device) / ci.GiB, 2)
    return out


def hand_out_core_loaders(comfy, built: dict) -> None:
    """Core's loader nodes in the graph return the prebuilt models (by file name)."""
    nodes = comfy.nodes
    nodes.UNETLoader.load_unet = lambda self, unet_name, weight_dtype: built[unet_name]
    nodes.VAELoader.load_vae = lambda self, vae_name: built[vae_name]
    nodes.NODE_CLASS_MAPPINGS["LatentUpscaleModelLoader"].execute = classmethod(
        lambda cls, model_name: built[model_name])


# ------------------------------------------------------------------------------------------------ timing
def parse_size(text: str) -> tuple[int, int, int]:
    width, height, frames = (int(v) for v in text.lower().split("x"))
    if width % 64 or height % 64 or (frames - 1) % 8:
        raise ValueError(f"{text}: width and height must be multiples of 64 and frames 8k + 1")
    return width, height, frames


def run_graph(comfy, torch, device, clock, make_prompt, side: str, sizes: list[str], warm_runs: int,
              decode_nodes: tuple[str, ...], save, deadline: float) -> dict:
    """Per size: the first run and `warm_runs` runs with new seeds through one executor (its cache kept); a run
    that would end after `deadline` (a perf_counter time, the previous run's seconds as its estimate) is skipped."""
    executor, out, last = ci.boot().new_executor(), {}, 0.0
    for label in sizes:
        width, height, frames = parse_size(label)
        runs = out.setdefault(label, {"runs": []})["runs"]
        for i in range(1 + warm_runs):
            if time.perf_counter() + last > deadline:
                out[label]["skipped_runs"] = 1 + warm_runs - i
                print(f"[bench] {side} {label}: {1 + warm_runs - i} runs skipped (--deadline-s)", file=sys.stderr)
                break
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            prompt = make_prompt(width, height, frames, SEED + i)
            row = ci.run_prompt(comfy, executor, prompt, f"{side}-{label}-{i}", clock)
            row["seed"] = SEED + i
            ends = [row["nodes"][k]["end"] for k in decode_nodes if k in row["nodes"]]
            row["decoded_s"] = max(ends) if len(ends) == len(decode_nodes) else None
            if device.type == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / ci.GiB, 2)
            runs.append(row)
            last = row["wall_s"] or 0.0
            print(f"[bench] {side} {label} run {i}: {'ok' if row['success'] else 'FAILED'} {row['wall_s']} s "
                  f"(decoded at {row['decoded_s']} s)", file=sys.stderr, flush=True)
            out[label].update(summarize(runs))
            save()
            if not row["success"]:
                break
    del executor
    return out


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["success"]]
    warm = ok[1:]
    def median(values):
        return round(statistics.median(values), 3) if values else None
    return {"first_s": ok[0]["wall_s"] if ok else None, "warm_s": [r["wall_s"] for r in warm],
            "warm_median_s": median([r["wall_s"] for r in warm]), "decoded_first_s": ok[0]["decoded_s"] if ok else None,
            "decoded_warm_median_s": median([r["decoded_s"] for r in warm if r["decoded_s"] is not None])}


def compare(core: dict, ours: dict) -> dict:
    """Per size: core_seconds, ours_seconds and ours / core for the warm median, the first run and the decoded time."""
    def pair(a, b):
        return {"core_seconds": a, "ours_seconds": b, "ratio": round(b / a, 3) if a and b else None}
    out = {}
    for label in core.keys() & ours.keys():
        c, o = core[label], ours[label]
        warm = pair(c.get("warm_median_s"), o.get("warm_median_s"))
        out[label] = {**warm, "goal": "ratio <= 0.5", "met": warm["ratio"] is not None and warm["ratio"] <= 0.5,
                      "first": pair(c.get("first_s"), o.get("first_s")),
                      "decoded": pair(c.get("decoded_warm_median_s"), o.get("decoded_warm_median_s"))}
    return out


# ------------------------------------------------------------------------------------------------ the run
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", default=os.path.join(ci.ROOT, ".comfy", "ComfyUI"), help="ComfyUI 0.33's source")
    parser.add_argument("--site", default=None, help="a folder of packages installed from .comfy/wheels")
    parser.add_argument("--sizes", default=None, help="comma-separated WIDTHxHEIGHTxFRAMES, multiples of 64 (default "
                        f"{DEFAULT_SIZES}; {SMOKE_SIZE} with --smoke)")
    parser.add_argument("--warm-runs", type=int, default=2, help="runs after the first, each with a new seed")
    parser.add_argument("--sides", default="core,ours", help="which graphs: core, ours or both")
    parser.add_argument("--acceleration", default=None, help="our samplers' acceleration (default: the workflow's)")
    parser.add_argument("--weights-seed", type=int, default=0, help="torch.manual_seed before each weight build")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN autotuning on for both graphs")
    parser.add_argument("--comfyui-allocator", action="store_true",
                        help="CUDA's cudaMallocAsync allocator, as ComfyUI's main.py selects it on CUDA 13")
    parser.add_argument("--deadline-s", type=float, default=540.0,
                        help="skip the runs that would end later than this many seconds after the start")
    parser.add_argument("--smoke", action="store_true", help="CPU (--cpu), the tiny set at 192x128x17")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_core_graph.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sizes = [s for s in (args.sizes or (SMOKE_SIZE if args.smoke else DEFAULT_SIZES)).split(",") if s]
    sides = [s for s in args.sides.split(",") if s]
    try:
        for label in sizes:
            parse_size(label)
    except ValueError as error:
        parser.error(f"--sizes: {error}")
    if not sides or set(sides) - {"core", "ours"}:
        parser.error(f"--sides: core, ours or core,ours (got {args.sides})")
    if args.comfyui_allocator and not args.smoke:  # before torch starts, as ComfyUI's cuda_malloc.py does
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = f"{conf},backend:cudaMallocAsync" if conf else "backend:cudaMallocAsync"
    comfy_root = os.path.abspath(args.comfyui)
    stubs = ci.prepare_imports(comfy_root, args.site)
    result: dict = {"bench": "core_graph", "commit": ci.git_commit(), "smoke": args.smoke, "sizes": sizes,
                    "warm_runs": args.warm_runs, "seeds": [SEED + i for i in range(1 + args.warm_runs)],
                    "stubbed": sorted(stubs.names) if stubs else [], "text": "given as tensors on both sides (no "
                    "Gemma)", "errors": {}}

    def save(code: int | None = None) -> int:
        result["total_s"] = round(time.perf_counter() - started, 1)
        if code is None:  # progress: the file only, so a run cut short still leaves what it measured
            if args.out:
                with open(args.out, "w", encoding="utf-8") as f:
                    json.dump(result, f, default=str)
            return 0
        return ci.write_result(result, args.out, code)

    try:
        comfy = ci.import_comfyui(cpu=args.smoke)
    except ImportError as error:  # a requirement neither the machine nor .comfy/wheels has
        traceback.print_exc()
        result["errors"]["import"] = f"{type(error).__name__}: {error}"
        return save(1)
    import torch
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    if stubs is not None:
        stubs.forget()
    mm = comfy.mm
    device = torch.device("cpu") if args.smoke else mm.get_torch_device()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    result.update(comfyui=comfy.version, torch=torch.__version__, cudnn_benchmark=torch.backends.cudnn.benchmark,
                  allocator=torch.cuda.get_allocator_backend() if device.type == "cuda" else None,
                  device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  gpu_total_gib=round(torch.cuda.mem_get_info(device)[1] / ci.GiB, 1) if device.type == "cuda"
                  else None)

    work = tempfile.mkdtemp(prefix="bench_core_graph_")
    try:
        code = measure(args, comfy, torch, device, work, sizes, sides, started + args.deadline_s, result, save)
    except Exception as error:  # recorded with what was measured; the traceback goes to stderr
        traceback.print_exc()
        result["errors"]["run"] = f"{type(error).__name__}: {error}"
        code = 1
    finally:
        link = os.path.join(work, "custom_nodes", ci.PACK_FOLDER)
        if os.path.islink(link):
            os.unlink(link)  # the link to this checkout, before the rest
        shutil.rmtree(work, ignore_errors=True)  # the tiny files and the saved videos
    if "core" in result and "ours" in result:
        result["comparison"] = compare(result["core"], result["ours"])
    result["host_peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
    for label, row in result.get("comparison", {}).items():
        print(f"[bench] {label}: core {row['core_seconds']} s, ours {row['ours_seconds']} s, ours / core "
              f"{row['ratio']} (first runs {row['first']['ratio']}, decoded {row['decoded']['ratio']})",
              file=sys.stderr)
    ok = code == 0 and all(r["success"] for side in ("core", "ours") for size in result.get(side, {}).values()
                           for r in size["runs"])
    return save(0 if ok else 1)


def measure(args, comfy, torch, device, work: str, sizes: list[str], sides: list[str], deadline: float,
            result: dict, save) -> int:
    """Core's nodes and the pack loaded into ComfyUI; the weights built; core's graph, then ours. Fills `result`;
    1 when something could not be loaded."""
    models, _ = ci.set_up_folders(comfy, work)
    loaded = ci.load_pack(comfy, work)
    failed = ci.load_core_extras(comfy, os.path.abspath(args.comfyui), CORE_EXTRAS)
    if loaded is None or failed:
        result["errors"]["load"] = (["the pack"] if loaded is None else []) + failed
        print(f"not loaded: {result['errors']['load']} (ComfyUI's log above says why)", file=sys.stderr)
        return 1
    package, pack_classes = loaded
    result["comfy_kitchen"] = kitchen_backends()
    if "core" in sides and result["comfy_kitchen"] is None:
        result["errors"]["load"] = ("comfy-kitchen is missing: core's LTX transformer calls its RoPE kernels "
                                    "(carry .comfy/site.tar.xz from bench/comfy_carry.sh and pass it as --site)")
        return 1
    comfy.nodes.NODE_CLASS_MAPPINGS.update(BenchCoreConditioning=BenchCoreConditioning,
                                           BenchTextFeatures=BenchTextFeatures)
    pack = lambda name: importlib.import_module(f"{package}.nodes.{name}")  # noqa: E731
    pack("tools.tiny").write_tiny_set(models)  # the loaders' widgets list these names (the official ones)
    names = {c: pack("ltx.release").OFFICIAL_FILES[c][1] for c in COMPONENTS}
    result["core_files"] = dict(names)
    mm = comfy.mm

    # 1. Weights: ours built, core's loaders fed the same tensors, ours freed.
    with ci.pack_as_nodes(package):
        import bench_ab_graph
        from nodes.ltx.files.assets import Kind
        preset, result["ours_build_s"] = build_ours(torch, device, models, pack_classes, args.weights_seed)
        weights = fingerprint(torch, preset)
        config = preset["1"][0].module.config
        core_text, ours_text = text_inputs(torch, config.cross_attention_dim, config.audio_cross_attention_dim,
                                           bench_ab_graph._info("text_encoder", Kind.TEXT_ENCODER))
        files = native_files(preset, models, args.smoke) if "core" in sides else {}
    BenchCoreConditioning.value, BenchTextFeatures.value = core_text, ours_text
    if "core" in sides:
        core_built, result["core_load_s"] = build_core(comfy, files, names)
        hand_out_core_loaders(comfy, core_built)
        core_modules = [weakref.ref(m) for m in core_modules_of(core_built)]
    first_build = [weakref.ref(outputs[0].module) for outputs in preset.values()]
    files = preset = None
    result["first_build_freed"] = freed(first_build, device, torch)

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock = ci.NodeClock(comfy.execution, sync)
    try:
        # 2. Core's graph, then its models freed.
        if "core" in sides:
            result["core"] = run_graph(comfy, torch, device, clock, lambda w, h, f, s: core_prompt(w, h, f, s, names),
                                       "core", sizes, args.warm_runs, CORE_DECODES, save, deadline)
            core_built.clear()
            BenchCoreConditioning.value = ()
            result["core_freed"] = freed(core_modules, device, torch, mm)
            if not result["core_freed"]["all"]:  # held somewhere: at least move it off the card
                mm.unload_all_models()
                result["core_unloaded"] = freed(core_modules, device, torch, mm)

        # 3. Ours, built again from the same seed, offloaded as the loaders leave it.
        if "ours" in sides:
            with ci.pack_as_nodes(package):
                preset, _ = build_ours(torch, device, models, pack_classes, args.weights_seed)
                result["same_weights"] = fingerprint(torch, preset) == weights
            if device.type == "cuda":
                for outputs in preset.values():
                    outputs[0].module.to("cpu")
                torch.cuda.empty_cache()
            ci.hand_out_pack_loaders(pack_classes, preset)
            result["ours_acceleration"] = args.acceleration or "the workflow's (auto)"
            result["ours"] = run_graph(comfy, torch, device, clock,
                                       lambda w, h, f, s: ours_prompt(w, h, f, s, args.acceleration),
                                       "ours", sizes, args.warm_runs, OURS_DECODES, save, deadline)
    finally:
        clock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
