"""Every place the pack reaches below diffusers' and torch's public API, in one module, checked against what is
installed.

diffusers has the LTX-2.5 decoders but not every seam the pack drives them through: the diffusion decoder's stages
1-3 without their last upsample (so it can run per tile), its RoPE frequencies (so a kernel can rotate q/k in the
same pass as the norm) and a per-instance forward for its stage-5 blocks (the fused block). Each touch is one
function here, and before touching an object it checks that the installed diffusers still has every attribute the
touch uses: a version without them is an LTX25Error naming the version, the attribute and the range the pack was
written against (pyproject.toml), never an AttributeError deep in a decode. That the touches still compute what
diffusers computes is pinned by tests against diffusers' own forward (tests/test_diffusion_vae.py,
tests/test_fused_block.py, tests/test_na_attention.py). torch's compiled-forward slot, which the sampler switches
to run the DiT's blocks compiled or eager, and Inductor's fallback cache folder (compile_cache.py) are here too.
"""
from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Callable, Iterator

import diffusers
import torch

from .errors import LTX25Error

WRITTEN_FOR = "diffusers>=0.42.1,<0.43"  # the range in pyproject.toml these touches were written and tested against
_checked: set[tuple[type, tuple[str, ...]]] = set()


def require(obj: object, attributes: tuple[str, ...], use: str) -> None:
    """Refuse, naming the installed diffusers, an `obj` without every one of `attributes` (what `use` touches);
    checked once per class."""
    key = (type(obj), attributes)
    if key in _checked:
        return
    missing = [name for name in attributes if not hasattr(obj, name)]
    if missing:
        raise LTX25Error(f"diffusers {diffusers.__version__}", f"{type(obj).__name__}.{missing[0]}", "missing",
                         f"present: {use} uses it ({WRITTEN_FOR})",
                         "Install the diffusers version pyproject.toml names; this one changed what the pack uses.")
    _checked.add(key)


def _diffusion_decoder_class(name: str) -> type:
    from diffusers.models.autoencoders import ltx2_diffusion_decoder
    cls = getattr(ltx2_diffusion_decoder, name, None)
    if cls is None:
        raise LTX25Error(f"diffusers {diffusers.__version__}", f"ltx2_diffusion_decoder.{name}", "missing",
                         f"present ({WRITTEN_FOR})", "Install the diffusers version pyproject.toml names.")
    return cls


# ------------------------------------------------------------------------------------ the diffusion decoder's stages
def stages_1_to_3_before_last_upsample(decoder: torch.nn.Module, latent: torch.Tensor) -> torch.Tensor:
    """diffusers' `LTX2VideoDiffusionDecoder3d.forward_stages_1_to_3` without its last upsample: latent
    `[B, C, T, H, W]` (un-normalized) → channels-last features `[B, T', H', W', C]` with the trailing ghost frames.
    The skipped upsample is pointwise, so the decode runs it per tile (`deferred_upsample`) and keeps 1/8 of the
    volume resident. No block mask is built: the pack's attention processors take the window from the kernel size."""
    require(decoder, ("trailing_pad_latent_frames", "conv_in", "det_stages", "upsamples"),
            "the diffusion decode's stages 1-3")
    ghost = decoder.trailing_pad_latent_frames
    latent = torch.cat([latent, latent[:, :, -1:].expand(-1, -1, ghost, -1, -1)], dim=2)
    x = decoder.conv_in(latent.permute(0, 2, 3, 4, 1))
    for i, blocks in enumerate(decoder.det_stages[:-1]):
        for block in blocks:
            x = block(x)
        if i < len(decoder.det_stages) - 2:
            x = decoder.upsamples[i](x)
    return x


def deferred_upsample(decoder: torch.nn.Module) -> torch.nn.Module:
    """The upsample `stages_1_to_3_before_last_upsample` leaves out (diffusers' `upsamples[-2]`): a pixel shuffle
    with `.stride` (t, h, w) taking `drop_leading_frame`."""
    require(decoder, ("upsamples",), "the per-tile third upsample")
    upsample = decoder.upsamples[-2]
    require(upsample, ("stride",), "the per-tile third upsample")
    return upsample


def stage_4(decoder: torch.nn.Module, features: torch.Tensor, drop_leading_frame: bool, cells: int) -> torch.Tensor:
    """diffusers' `forward_stage_4(features, drop_leading_frame, crop_trailing_ghost=False)` cropped to what its
    first `cells` frames decode to (a tile's content: the ghost cells a last tile carries are not kept): the blocks
    on all of `features` `[B, T, H, W, C]`, then the last upsample, which is pointwise, on the kept cells only, so
    neither its work nor the context it makes carries the ghosts. Pass `features` without keeping a reference:
    with diffusers' blocks they are released after the first block (the lean blocks work in place on them)."""
    require(decoder, ("det_stages", "upsamples"), "the per-tile stage 4")
    x = features
    del features
    for block in decoder.det_stages[-1]:
        x = block(x)
    return decoder.upsamples[-1](x[:, :cells], drop_leading_frame=drop_leading_frame)


def stages_1_to_3_slab(decoder: torch.nn.Module, latent: torch.Tensor, start: int,
                       total: int) -> tuple[torch.Tensor, int]:
    """Stages 1-3 (as `stages_1_to_3_before_last_upsample`) on frames `[start, start + t)` of the ghosted latent of
    `total` frames (ghosts already appended) → (features, first): the features equal the whole clip's at pre-upsample
    frames `[first, first + features.shape[1])`.

    Every op of these stages is per frame except neighborhood attention, whose window reaches `kernel_t // 2` frames
    each way (shifted inward only at the clip's own ends). So after each block the frames within that reach of a cut
    edge (an edge that is not the clip's) are wrong and are cut off; what stays is exact up to float rounding.
    `diffusion_tiling.TilingGeometry.slab_trace` does the same arithmetic for the planner."""
    require(decoder, ("conv_in", "det_stages", "upsamples"), "the diffusion decode's slabbed stages 1-3")
    cut_before, cut_after = start > 0, start + latent.shape[2] < total
    x = decoder.conv_in(latent.permute(0, 2, 3, 4, 1))
    first = start
    for i, blocks in enumerate(decoder.det_stages[:-1]):
        for block in blocks:
            x = block(x)
            reach = block.attn.kernel_size[0] // 2
            before, after = (reach if cut_before else 0), (reach if cut_after else 0)
            if before or after:
                x = x[:, before:x.shape[1] - after].contiguous()
                first += before
        if i < len(decoder.det_stages) - 2:
            upsample = decoder.upsamples[i]
            x = upsample(x, drop_leading_frame=first == 0)
            if upsample.stride[0] == 2:  # causal 1-then-2 mapping: frame j > 0 → frames 2j-1, 2j
                first = max(2 * first - 1, 0)
    return x, first


# ------------------------------------------------------------------------------------ RoPE and block forwards
def rope_inv_freqs(rope: torch.nn.Module, dim: int, device: torch.device) -> torch.Tensor:
    """`[dim // 2]` float32 inverse frequencies of one axis chunk of diffusers' `LTX2VideoVaeRotaryPosEmbed3D`: the
    module's own (private `_inv_freqs`), so a fused rotation uses exactly the angles diffusers' forward would."""
    require(rope, ("_inv_freqs", "rope_dim_split"), "the fused RoPE rotation")
    return rope._inv_freqs(dim, device)


def stage5_blocks(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The diffusion decoder's stage-5 blocks (`LTX2VideoVaeDiffusionNABlock`) in `model`."""
    block_class = _diffusion_decoder_class("LTX2VideoVaeDiffusionNABlock")
    return (module for module in model.modules() if isinstance(module, block_class))


def det_blocks(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The diffusion decoder's deterministic-stage blocks (`LTX2VideoVaeNABlock`, stages 1-4) in `model`."""
    block_class = _diffusion_decoder_class("LTX2VideoVaeNABlock")
    return (module for module in model.modules() if isinstance(module, block_class))


def override_forward(module: torch.nn.Module, forward: Callable[..., torch.Tensor] | None) -> None:
    """Give one module instance its own `forward(module, ...)` (Module.__call__ looks `forward` up on the instance
    first), or with None its class's back."""
    if forward is not None:
        module.forward = types.MethodType(forward, module)
    else:
        module.__dict__.pop("forward", None)


# ---------------------------------------------------------------------------------------------------- the DiT's AdaLN
AV_SCALE_SHIFT = ("av_cross_attn_video_scale_shift", "av_cross_attn_audio_scale_shift")


@contextmanager
def av_scale_shift_from_own_timesteps(dit: torch.nn.Module, video: torch.Tensor,
                                      audio: torch.Tensor) -> Iterator[None]:
    """Within the block, diffusers' `LTX2VideoTransformer3DModel` (called with `use_cross_timestep=True`) computes
    each stream's audio↔video cross-attention scale/shift from that stream's OWN per-token timesteps — `video`
    `[B, N]` or `[B, 1]`, `audio` `[B, T]` or `[B, 1]`, already × the timestep multiplier — as ltx-core does.

    diffusers feeds one timestep to both AdaLNs of a stream's cross-attention: the other stream's σ with
    `use_cross_timestep=True`, its own timesteps without. ltx-core feeds the gate the other stream's σ and the
    scale/shift the stream's own per-token timesteps; the two agree only while every token has the same σ
    (text-to-video). So the gate keeps diffusers' input and a forward pre-hook (public torch API, but it relies on
    diffusers calling these modules with the timestep as first argument) swaps the scale/shift input. Hooks are
    Python: a CUDA graph captured inside keeps reading `video`/`audio` (static buffers) at replay."""
    require(dit, AV_SCALE_SHIFT, "the per-token audio-video cross-attention modulation")
    handles = []
    try:
        for name, own in zip(AV_SCALE_SHIFT, (video, audio)):
            def swap(_module, args, kwargs, own=own):
                return (own.flatten(), *args[1:]), kwargs
            handles.append(getattr(dit, name).register_forward_pre_hook(swap, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------------- torch.compile
def inductor_default_cache_dir() -> str | None:
    """The folder Inductor falls back to without `TORCHINDUCTOR_CACHE_DIR` (its private `default_cache_dir`), or None
    where this torch has none. Importing `torch._dynamo` writes that folder into the environment variable, so
    compile_cache.py compares against it to tell torch's fallback from a folder the user chose."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())


def compiled_calls(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Callable]]:
    """The compiled forwards `Module.compile` left on `model`'s submodules: torch keeps each in the private
    `_compiled_call_impl`, which `Module.__call__` prefers when it is set."""
    return [(m, m._compiled_call_impl) for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]


def set_compiled_call(module: torch.nn.Module, impl: Callable | None) -> None:
    """Run `module` through `impl` (a compiled forward from `compiled_calls`) or, with None, eagerly again, without
    discarding the compiled code."""
    require(module, ("_compiled_call_impl",), "switching between compiled and eager blocks")
    module._compiled_call_impl = impl
