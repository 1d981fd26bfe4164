"""Why the `cuda_graph` denoiser's x0 differs from eager's at the real shapes (bench_guides measured up to 0.096): the
same stage-1 text-to-video call, 22B config with random bf16 weights, in these variants:

- `eager_again`: eager a second time (is eager itself deterministic?);
- `eager_side_stream`: eager on a side stream, as the graph's warm-up and capture run (cuBLAS keeps a handle and
  workspace per stream, and its algorithm choice can depend on them);
- `cuda_graph`: the graph denoiser;
- `cuda_graph_replayed`: its second replay;
- `first_divergence`: every submodule of the DiT down to the blocks' children, hooked: the first ones, in call order,
  whose output in the graph's replay differs from eager's (where the difference enters).

Per variant against the first eager call: max |Δx0|, max |x0|, the share of elements that differ, and the largest
difference in units of the bf16 spacing at the velocity's magnitude (|Δv| / ulp(v); ≤ 1 means one rounding step of the
bf16 velocity, i.e. a different summation order somewhere, not a wrong input). Writes JSON to --out.

    python bench/diag_graph_vs_eager.py --out diag.json           # CUDA
    python bench/diag_graph_vs_eager.py --smoke --out diag.json   # CPU: eager variants only (checks the script)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_transformer import FPS, REAL_SHAPES, SMOKE_SHAPES, build  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit import transformer as T  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import make_denoiser, release  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block  # noqa: E402

SIGMA = 0.725


def compare(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], latents: tuple[torch.Tensor, ...]) -> dict:
    out = {}
    for name, g, w, x in zip(("video", "audio"), got, want, latents):
        diff = (g - w).abs()
        v = ((x.float() - w) / SIGMA).abs()  # the velocity eager produced (bf16 values, in float32)
        ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(v.clamp_min(1e-30))))
        out[name] = {"max_abs_diff": diff.max().item(), "max_abs": w.abs().max().item(),
                     "share_differing": (diff > 0).float().mean().item(),
                     "max_diff_in_velocity_ulps": (diff / SIGMA / ulp).max().item()}
    return out


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def record_outputs(dit: torch.nn.Module, store: dict, clone: bool) -> list:
    """Forward hooks on `dit`'s submodules (at most 3 names deep) keeping each call's outputs in `store` (name → the
    last call's tensors): cloned in eager, by reference in a capture (held, so the pool cannot reuse them, and read
    after a replay)."""
    handles = []
    for name, module in dit.named_modules():
        if name and name.count(".") <= 2:
            def hook(_m, _args, out, name=name):
                store.pop(name, None)
                store[name] = [t.detach().clone() if clone else t for t in _tensors(out)]
            handles.append(module.register_forward_hook(hook))
    return handles


def first_divergence(want: dict, got: dict, count: int = 12) -> list:
    rows = []
    for name, tensors in want.items():
        if name not in got or len(got[name]) != len(tensors):
            rows.append({"module": name, "missing_in_graph": True})
        else:
            diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(tensors, got[name])
                     if a.shape == b.shape]
            if any(d > 0 for d in diffs):
                rows.append({"module": name, "max_abs_diff": max(diffs),
                             "max_abs": max(a.float().abs().max().item() for a in tensors)})
        if len(rows) >= count:
            break
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    block = tiny_config_block() if args.smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    model = build(config, device, torch.float32 if args.smoke else torch.bfloat16)
    g = torch.Generator(device).manual_seed(3)
    cond = Conditioning(torch.randn(1, 1024, config.cross_attention_dim, generator=g, device=device),
                        torch.randn(1, 1024, config.audio_cross_attention_dim, generator=g, device=device))
    video_shape, audio_shape = (SMOKE_SHAPES if args.smoke else REAL_SHAPES)["stage1"]
    video = torch.randn(video_shape, generator=g, device=device)
    audio = torch.randn(audio_shape, generator=g, device=device)
    eager = make_denoiser(model, cond, FPS, "eager")
    want = eager(video, audio, SIGMA)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "cublas_workspace_config":
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "variants": {}}
    variants = result["variants"]
    variants["eager_again"] = compare(eager(video, audio, SIGMA), want, (video, audio))
    if device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = eager(video, audio, SIGMA)
        torch.cuda.current_stream().wait_stream(side)
        variants["eager_side_stream"] = compare(got, want, (video, audio))
        graph = make_denoiser(model, cond, FPS, "cuda_graph")
        variants["cuda_graph"] = compare(graph(video, audio, SIGMA), want, (video, audio))
        variants["cuda_graph_replayed"] = compare(graph(video, audio, SIGMA), want, (video, audio))
        release(model)
        eager_outputs, graph_outputs = {}, {}
        handles = record_outputs(model.dit, eager_outputs, clone=True)
        eager(video, audio, SIGMA)
        for h in handles:
            h.remove()
        handles = record_outputs(model.dit, graph_outputs, clone=False)
        graph = make_denoiser(model, cond, FPS, "cuda_graph")
        graph(video, audio, SIGMA)
        for h in handles:
            h.remove()
        torch.cuda.synchronize()
        result["first_divergence"] = first_divergence(eager_outputs, graph_outputs)
        result["modules_hooked"] = len(eager_outputs)
        del eager_outputs, graph_outputs
        release(model)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
