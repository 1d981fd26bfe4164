"""Cold start (issue 24): the first run after a process start, with and without the compile caches on disk, and the
first run at a never-seen shape in a warm process, each against the warm run; every case in a fresh Python process,
all from one invocation, real shapes with random weights.

    python bench/bench_cold_start.py --out $OUT/bench_cold_start.json   # CUDA (about 5 minutes on an H200)
    python bench/bench_cold_start.py --smoke --out /tmp/cold_start.json  # CPU, tiny configs (checks the script)
    python bench/bench_cold_start.py --scenarios cold,restart,in_graph_cold,in_graph_restart --parts dit \
        --out $OUT/bench_cold_start_dit.json   # the DiT only, where cuDNN is chosen: now against before (~4 min)
    python bench/bench_cold_start.py --scenarios cold,restart,auto_dynamic_cold --parts dit \
        --out $OUT/cold_start_token_dims.json  # the DiT only, token counts marked: now against before (~4 min)

Scenarios, each a child process of this script (`--child NAME`), in this order:
- `cold`: an empty cache folder (`LTX25_CACHE_DIR` set to a new folder, the variables of torch's and Triton's own
  folders removed from the environment): the truly cold first run, then two warm runs, then a never-seen shape
  (first run, then warm);
- `restart`: the same folder in a new process, the same runs: the first run with the caches on disk;
- `audio_benchmark`: the audio decode with cuDNN's benchmarking left on inside the vocoder (the decode before #24);
- `in_graph_cold`, `in_graph_restart`: the DiT only, with cuDNN attention chosen as before: diffusers' `_native_cudnn`
  backend, whose per-call `sdpa_kernel` lands in Dynamo's graph and makes AOTAutograd bypass its cache (the pack now
  limits SDPA to cuDNN around the call instead, accelerated_denoise.Mode), in a second folder of their own;
- `auto_dynamic_cold`: the DiT only, truly cold, with no token count marked (`TOKEN_INPUTS` empty): Dynamo's
  automatic dynamic shapes alone, as before (static stage 1, stage 2 and a new frame count compiled again).
Parts: `dit` (the 8 + 3 step distilled sampling with `compile_cuda_graph`, one denoiser per stage as the sampler
node makes them: stage 1 at 384×256×121, stage 2 at 768×512×121; the new shape is 1024×576×97, stage 1 at half
size), `diffusion` (the untiled diffusion decode, auto processor: the Triton kernels), `conv` (the conv decode),
`audio` (decoder + vocoder). Each child first runs a tiny matmul and convolution so that loading the CUDA libraries is
charged to no part. cudnn.benchmark is on in every child, as in bench_ab_graph.py, where the issue's cold figures come
from. Per run: seconds (CUDA-synchronized) per stage, Dynamo's and Inductor's counters (graphs compiled, FX-graph and
AOTAutograd cache hits, misses and bypasses), so a recompile shows, and the seconds of each compile step (`compile_s`:
Dynamo's trace, AOTAutograd, Inductor, autotuning); after the runs, the accelerated x0 against the eager one (stage 1,
main shape); the lines the sampler would show on its node, with their times. The JSON (`--out`, rewritten after every
child) holds each child's record and a summary against the goals of #24.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = 2**30
FPS = 24.0
SCENARIOS = {  # name: (compile variant, parts), run in this order; the variant names the cache folder too
    "cold": ("default", "dit,diffusion,conv,audio"),
    "restart": ("default", "dit,diffusion,conv,audio"),
    "audio_benchmark": ("default", "audio"),
    "in_graph_cold": ("in_graph", "dit"),
    "in_graph_restart": ("in_graph", "dit"),
    "auto_dynamic_cold": ("auto_dynamic", "dit"),
}
# (stage 1 video, stage 2 video, audio) latent shapes; "new" is never seen before it runs
DIT_SHAPES = {"main": ((1, 128, 16, 8, 12), (1, 128, 16, 16, 24), (1, 8, 126, 16)),   # 768×512×121
              "new": ((1, 128, 13, 9, 16), (1, 128, 13, 18, 32), (1, 8, 101, 16))}    # 1024×576×97
SMOKE_DIT_SHAPES = {"main": ((1, 128, 3, 2, 2), (1, 128, 3, 4, 4), (1, 8, 5, 16)),
                    "new": ((1, 128, 2, 3, 3), (1, 128, 2, 6, 6), (1, 8, 4, 16))}
VIDEO_LATENTS = {"main": (16, 16, 24), "new": (13, 18, 32)}     # decoders: (F', H', W')
SMOKE_VIDEO_LATENTS = {"main": (3, 3, 3), "new": (2, 3, 4)}
RUNS = (("first", "main"), ("warm", "main"), ("warm", "main"), ("new_first", "new"), ("new_warm", "new"))


# ------------------------------------------------------------------------------------------------ the child
def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _counters() -> dict:
    """Dynamo's and Inductor's running counters (private, bench-only): compiled graphs and cache hits/misses."""
    from torch._dynamo.utils import counters
    wanted = {"stats": ("unique_graphs", "calls_captured"),
              "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
              "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass")}
    return {f"{group}.{key}": counters[group][key] for group, keys in wanted.items() for key in keys
            if counters[group][key]}


def _compile_seconds() -> dict:
    """Seconds per step of torch.compile so far in the process (Dynamo's private `compilation_time_metrics`, the
    numbers `torch._dynamo.utils.compile_times()` prints): Dynamo's trace (`bytecode_tracing`), AOTAutograd
    (`create_aot_dispatcher_function`), Inductor's codegen or cache load, Triton autotuning at first launch."""
    from torch._dynamo import utils
    return {k: sum(v) for k, v in getattr(utils, "compilation_time_metrics", {}).items()}


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _timed_runs(run_one, device) -> list[dict]:
    """`run_one(shape key) → {extra fields}` for every (label, shape) of RUNS, each timed and with its counters."""
    rows = []
    for label, key in RUNS:
        before, seconds = _counters(), _compile_seconds()
        _sync(device)
        start = time.perf_counter()
        extra = run_one(key) or {}
        _sync(device)
        compile_s = {k: round(v, 2) for k, v in _delta(seconds, _compile_seconds()).items() if v >= 0.05}
        rows.append({"label": label, "shape": key, "s": round(time.perf_counter() - start, 3), **extra,
                     "counters": _delta(before, _counters()), **({"compile_s": compile_s} if compile_s else {})})
        print(f"[cold-start] {label:<9} {key:<4} {rows[-1]['s']:8.3f} s  {extra}", file=sys.stderr, flush=True)
    return rows


def dit_part(device, dtype, smoke: bool, t0: float) -> dict:
    import torch
    import bench_transformer as bt
    from nodes.ltx.conditioning import Conditioning
    from nodes.ltx.dit import transformer as T
    from nodes.ltx.dit.accelerated_denoise import make_denoiser
    from nodes.tools.tiny.transformer import tiny_config_block

    block = tiny_config_block() if smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    start = time.perf_counter()
    model = bt.build(config, device, dtype)
    _sync(device)
    build_s = time.perf_counter() - start
    g = torch.Generator(device).manual_seed(0)
    cond = Conditioning(torch.randn(1, 1024, config.cross_attention_dim, generator=g, device=device).to(dtype),
                        torch.randn(1, 1024, config.audio_cross_attention_dim, generator=g, device=device).to(dtype))
    shapes = SMOKE_DIT_SHAPES if smoke else DIT_SHAPES
    mode = "compile" if device.type != "cuda" else "compile_cuda_graph"
    notes: list = []

    def note(line: str) -> None:
        notes.append([round(time.perf_counter() - t0, 2), line])
        print(f"[node text] {line}", file=sys.stderr, flush=True)

    def sample(key: str) -> dict:
        video1, video2, audio_shape = shapes[key]
        seconds = {}
        for stage, sigmas, video_shape in (("stage1", bt.STAGE1_SIGMAS, video1), ("stage2", bt.STAGE2_SIGMAS, video2)):
            denoise = make_denoiser(model, cond, FPS, mode, notify=note)  # one per stage, as the sampler node
            video = torch.randn(video_shape, generator=g, device=device) * sigmas[0]
            audio = torch.randn(audio_shape, generator=g, device=device) * sigmas[0]
            _sync(device)
            start = time.perf_counter()
            with torch.inference_mode():
                for sigma, sigma_next in zip(sigmas, sigmas[1:]):
                    x0_video, x0_audio = denoise(video, audio, sigma)
                    video = video + (video - x0_video) / sigma * (sigma_next - sigma)
                    audio = audio + (audio - x0_audio) / sigma * (sigma_next - sigma)
            _sync(device)
            seconds[f"{stage}_s"] = round(time.perf_counter() - start, 3)
        return seconds

    def x0_against_eager() -> float:
        """Max |Δx0| of the accelerated denoiser (warm by now) against the eager one, stage 1 of the main shape."""
        video = torch.randn(shapes["main"][0], generator=g, device=device)
        audio = torch.randn(shapes["main"][2], generator=g, device=device)
        got = make_denoiser(model, cond, FPS, mode, notify=note)(video, audio, bt.STAGE1_SIGMAS[0])
        want = make_denoiser(model, cond, FPS, "eager")(video, audio, bt.STAGE1_SIGMAS[0])
        return round(max((a - b).abs().max().item() for a, b in zip(got, want)), 4)

    try:
        runs = _timed_runs(sample, device)
        x0_max_abs = x0_against_eager()
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"build_s": round(build_s, 2), "mode": mode, "runs": runs, "node_text": notes,
            "x0_vs_eager_max_abs": x0_max_abs}


def diffusion_part(device, dtype, smoke: bool) -> dict:
    import torch
    import bench_diffusion_vae as bd
    from nodes.ltx.decode import diffusion_vae as dv

    vae = bd.build(bd.TINY_METADATA if smoke else bd.RELEASED_METADATA, device, dtype)
    latents = SMOKE_VIDEO_LATENTS if smoke else VIDEO_LATENTS
    processor = []

    def decode(key: str) -> dict:
        latent = torch.randn(1, 128, *latents[key], device=device, dtype=dtype)
        _frames, stats = dv.decode(vae, latent, processor="auto", request=bd.OFF, out_device="cpu")
        processor.append(stats.processor)
        return {}
    try:
        return {"runs": _timed_runs(decode, device), "processor": processor[-1] if processor else None}
    finally:
        del vae
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None


def conv_part(device, dtype, smoke: bool) -> dict:
    import torch
    import bench_conv_vae as bc
    from nodes.ltx.decode import conv_vae as cv
    from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG

    ref, vae = bc.build(bc.TINY_VAE_CONFIG if smoke else SHIPPED_CONV_VAE_CONFIG, device, dtype)
    del ref  # its encoder is not part of a decode
    latents = SMOKE_VIDEO_LATENTS if smoke else VIDEO_LATENTS

    def decode(key: str) -> dict:
        cv.decode_conv(vae, torch.randn(1, 128, *latents[key], device=device, dtype=dtype))
        return {}
    try:
        return {"runs": _timed_runs(decode, device)}
    finally:
        del vae
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None


def audio_part(device, dtype, smoke: bool, heuristics: bool) -> dict:
    import torch
    from nodes.ltx import audio_vae as av

    if smoke:
        from nodes.tools.tiny.audio_vae import TINY_AUDIO_VAE_CONFIG, TINY_VOCODER_CONFIG
        metadata = {"config": {"audio_vae": TINY_AUDIO_VAE_CONFIG, "vocoder": TINY_VOCODER_CONFIG}}
    else:
        import bench_ab_graph
        metadata = bench_ab_graph._audio_metadata()  # the released widths
    config, vocoder = av.AudioVAEConfig.from_metadata("bench", metadata), av.vocoder_kwargs("bench", metadata)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            vae = av.AudioVAE(config, vocoder)
            av._finish_vocoder(vae)  # the loader's init hook: sinc resampler + fp32 vocoder
    finally:
        torch.set_default_dtype(previous)
    vae.vocoder.float()
    vae.eval().requires_grad_(False)
    if not heuristics:  # the decode before #24: whatever cudnn.benchmark says outside holds inside
        av.cudnn_heuristics = contextlib.nullcontext
    frames = {"main": 121, "new": 97} if not smoke else {"main": 17, "new": 9}

    def decode(key: str) -> dict:
        latent = torch.randn(1, 8, round(frames[key] / FPS * 25), 16, device=device)
        av.decode_audio(vae, latent, fps=FPS, frames=frames[key])
        return {}
    return {"runs": _timed_runs(decode, device), "vocoder_cudnn_heuristics": heuristics,
            "cudnn_benchmark_outside": bool(torch.backends.cudnn.benchmark)}


def child(args) -> int:
    t0 = time.perf_counter()
    import torch
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from nodes.ltx import compile_cache
    from nodes.ltx.dit import accelerated_denoise as A

    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    in_graph = contextlib.nullcontext()
    if args.variant == "in_graph" and not args.smoke:  # cuDNN chosen inside each attention call, as before
        from diffusers.models.attention_dispatch import attention_backend
        A.MODES["compile_cuda_graph"] = A.Mode(graph=True, compile=True, attention=None)
        in_graph = attention_backend("_native_cudnn")
    if args.variant == "auto_dynamic":  # nothing marked: Dynamo finds the dynamic dims by recompiling, as before
        A.TOKEN_INPUTS = frozenset()
    if args.smoke:  # Dynamo only: the CPU check of the script, not of Inductor
        A.COMPILE_OPTIONS = {**A.COMPILE_OPTIONS, "backend": "eager"}
    result: dict = {"scenario": args.child, "variant": args.variant, "compile_options": dict(A.COMPILE_OPTIONS),
                    "import_s": round(time.perf_counter() - t0, 2), "errors": {}}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        start = time.perf_counter()
        x = torch.randn(64, 64, device=device, dtype=torch.bfloat16)
        (x @ x).sum().item()
        torch.nn.functional.conv1d(torch.randn(1, 8, 64, device=device), torch.randn(8, 8, 3, device=device)).sum()
        _sync(device)
        result["cuda_libraries_s"] = round(time.perf_counter() - start, 2)
    for part in args.parts.split(","):
        print(f"[cold-start] {args.child}: {part}", file=sys.stderr, flush=True)
        try:
            if part == "dit":
                with in_graph:
                    result[part] = dit_part(device, dtype, args.smoke, t0)
            elif part == "diffusion":
                result[part] = diffusion_part(device, dtype, args.smoke)
            elif part == "conv":
                result[part] = conv_part(device, dtype, args.smoke)
            elif part == "audio":
                result[part] = audio_part(device, dtype, args.smoke, heuristics=args.child != "audio_benchmark")
        except Exception as error:  # a failing part is recorded; the others still run
            traceback.print_exc()
            result["errors"][part] = f"{type(error).__name__}: {error}"
    dirs = compile_cache.applied()
    result["cache_dirs"] = vars(dirs) if dirs is not None else None
    result["process_s"] = round(time.perf_counter() - t0, 2)
    with open(args.child_out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


# ------------------------------------------------------------------------------------------------ the parent
def _folder_mib(path: str) -> dict:
    sizes = {}
    for sub in ("inductor", "triton"):
        total = 0
        for dirpath, _dirs, files in os.walk(os.path.join(path, sub)):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files
                         if os.path.isfile(os.path.join(dirpath, f)))
        sizes[sub] = round(total / 2**20, 1)
    return sizes


def _part_summary(part: dict) -> dict:
    runs = part.get("runs") or []
    by = {label: [r for r in runs if r["label"] == label] for label in ("first", "warm", "new_first", "new_warm")}
    if not (by["first"] and by["warm"]):
        return {}
    warm = statistics.median(r["s"] for r in by["warm"])
    out = {"first_s": by["first"][0]["s"], "warm_s": round(warm, 3),
           "first_extra_s": round(by["first"][0]["s"] - warm, 3)}
    if by["new_first"] and by["new_warm"]:
        out.update(new_shape_first_s=by["new_first"][0]["s"], new_shape_warm_s=by["new_warm"][0]["s"],
                   new_shape_extra_s=round(by["new_first"][0]["s"] - by["new_warm"][0]["s"], 3))
    for stage, steps in (("stage1", 8), ("stage2", 3)):
        if f"{stage}_s" in by["first"][0]:
            out[f"{stage}_first_s"] = by["first"][0][f"{stage}_s"]
            out[f"{stage}_warm_s_per_step"] = round(statistics.median(r[f"{stage}_s"] for r in by["warm"]) / steps, 4)
    steps = ("_compile.compile_inner", "bytecode_tracing", "create_aot_dispatcher_function", "compile_fx_inner",
             "async_compile.wait", "CachingAutotuner.benchmark_all_configs")
    first_compile = by["first"][0].get("compile_s", {})
    if first_compile:
        out["first_compile_s"] = {k: first_compile[k] for k in steps if k in first_compile}
    out["recompiled_on_warm_runs"] = any(r["counters"].get("stats.unique_graphs") for r in by["warm"] + by["new_warm"])
    out["graphs_compiled_first_run"] = by["first"][0]["counters"].get("stats.unique_graphs", 0)
    out["graphs_compiled_at_new_shape"] = sum(r["counters"].get("stats.unique_graphs", 0) for r in by["new_first"])
    return out


def summarize(children: dict) -> dict:
    summary = {name: {part: _part_summary(record[part]) for part in ("dit", "diffusion", "conv", "audio")
                      if isinstance(record.get(part), dict)} for name, record in children.items() if record}
    goals = {}

    def total(name: str, key: str) -> float | None:
        values = [p.get(key) for p in summary.get(name, {}).values() if p.get(key) is not None]
        return round(sum(values), 3) if values else None
    goals["truly_cold_first_s (<= 35; dit + decoders + audio, first runs)"] = total("cold", "first_s")
    goals["truly_cold_extra_s (first - warm)"] = total("cold", "first_extra_s")
    goals["restart_extra_s (<= 10; caches on disk, first - warm)"] = total("restart", "first_extra_s")
    goals["new_shape_extra_s (<= 3; warm process)"] = total("cold", "new_shape_extra_s")
    goals["new_shape_extra_s after restart"] = total("restart", "new_shape_extra_s")
    goals["dit new_shape_extra_s, automatic dynamic shapes alone (before)"] = (
        summary.get("auto_dynamic_cold", {}).get("dit", {}).get("new_shape_extra_s"))
    goals["dit restart_extra_s, cuDNN chosen in the graph (before)"] = total("in_graph_restart", "first_extra_s")
    goals["dit restart_extra_s, cuDNN chosen around the call (now)"] = (
        summary.get("restart", {}).get("dit", {}).get("first_extra_s"))
    return {"per_scenario": summary, "goals": goals}


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def parent(args) -> int:
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench_cold_start_")
    result: dict = {"bench": "cold_start", "commit": _git_commit(), "smoke": args.smoke, "scenarios": names,
                    "python": sys.version.split()[0], "children": {}, "wall_s": {}, "cache_mib": {}, "errors": {}}
    origin = time.perf_counter()

    def write() -> None:
        result["summary"] = summarize(result["children"])
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)

    try:
        for name in names:
            variant, parts = SCENARIOS[name]
            left = args.budget_s - (time.perf_counter() - origin)
            if left < 30:
                result["errors"][name] = f"skipped: {args.budget_s} s budget spent"
                continue
            cache = os.path.join(work, f"cache_{variant}")
            env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
            env["LTX25_CACHE_DIR"] = cache
            child_out = os.path.join(work, f"{name}.json")
            command = [sys.executable, os.path.abspath(__file__), "--child", name, "--variant", variant,
                       "--parts", args.parts or parts, "--child-out", child_out] + (["--smoke"] if args.smoke else [])
            print(f"[cold-start] === {name} ({variant}, {args.parts or parts}) ===", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                code = subprocess.run(command, env=env, timeout=min(args.child_timeout_s, left)).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            result["wall_s"][name] = round(time.perf_counter() - start, 1)
            if os.path.exists(child_out):
                with open(child_out, encoding="utf-8") as f:
                    result["children"][name] = json.load(f)
            if code != 0:
                result["errors"][name] = f"child exited with {code}"
            result["cache_mib"][name] = _folder_mib(cache)
            write()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write()
    print(json.dumps(result["summary"], indent=1))
    return 0 if not result["errors"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny configs (Dynamo's eager backend)")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_cold_start.json")
                        if os.environ.get("OUT") else None)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset, in order")
    parser.add_argument("--parts", default="", help="override every scenario's parts (dit,diffusion,conv,audio)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="skip the scenarios left after this")
    parser.add_argument("--child-timeout-s", type=float, default=240.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
