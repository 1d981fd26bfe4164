"""The sampler's denoiser, eager or accelerated: the x0 of `transformer.denoise`, with the DiT forward replayed from a
CUDA graph per latent shape and/or its transformer blocks compiled (diffusers' regional compilation).

The modes (`bench/bench_transformer.py` runs these same denoisers; their speeds are in docs/PERFORMANCE.md):
- eager: kernel by kernel; at the half-size stage 1 the step is bound by kernel launches, not by the math;
- cuda_graph: the forward replayed from a graph; equal to eager up to rounding: with torch 2.11 + CUDA 13 cuBLAS
  picks another algorithm under capture (the first Linear's output already differs by one bf16 step on identical
  inputs: bench/diag_graph_vs_eager.py), which 48 blocks amplify to about 1.5 % of x0's range;
- compile_cuda_graph: the repeated blocks compiled, cuDNN attention, then graphed; the fastest, after a compilation
  on first use; x0 moves by bf16 rounding (about as much as diffusers' forward differs from ours).

Compilation (`COMPILE_OPTIONS`): the blocks are compiled once per model, with only the video's and the audio's token
counts symbolic from the first call on (`TOKEN_INPUTS`, marked on each block's inputs): stage 2 and every later
resolution or frame count reuse that code and only capture a CUDA graph. Left to Dynamo's automatic dynamic shapes,
stage 1 compiled static, stage 2 compiled again with the video's token count symbolic, and a new frame count a third
time (stage 2 keeps the audio's length, so it stayed static). `dynamic=True` (every dim symbolic, hidden sizes too)
was measured on the H200 and rejected: stage 1 0.114 and stage 2 0.417 s/step against 0.095 / 0.350 static, and its
first compilation took 52 s against 17 + 12 s (docs/PERFORMANCE.md, cold start). What AOTAutograd, Inductor and
Triton make is kept on disk (compile_cache.py), so a new process re-traces the blocks with Dynamo but takes the rest
from there. That is why compile_cuda_graph puts cuDNN first in SDPA's kernel order around each call
(`Mode.attention`) rather than using diffusers' `_native_cudnn` backend: that one limits SDPA to cuDNN inside every
attention call, Dynamo records the private torch calls doing it in the block's graph, and AOTAutograd bypasses its
cache for such a graph, re-running at every start (measured on the CPU: a restart's compilations 22.6 s → 10.4 s;
not yet on a GPU). The kernel is picked when the blocks are traced, and the cache entries do not record the order:
the pack's blocks compile under it whenever they compile on CUDA (the sampler offers no other compiled mode). The
denoiser says on the node (`notify`) when a call is about to compile or capture, since those calls take seconds
instead of a fraction of one.

Attention kernel in the other modes (`preferred_attention`): PyTorch decides its SDPA kernel order lazily, on a
process's first attention call, putting cuDNN's fused attention first on Hopper and Blackwell data-centre GPUs. An
`sdpa_kernel(..., set_priority=True)` context entered before that decision restores, on exit, the undecided
FlashAttention-first order for the rest of the process. ComfyUI core's attention (`comfy/ops.py`) enters one, with
FlashAttention first, for every query of 131 072 elements or more; when such a call is the process's first attention
(core's Gemma encode, or its DiT), the pack's stage 2 at 1280×704 then took 1.435 s a step instead of 1.219 on an
H200 (FlashAttention-2 runs that self-attention at 350 TFLOP/s, cuDNN at 690: bench/diag_stage_kernels.py). So every
mode enters the order torch would have chosen itself around the DiT call, after one tiny attention call outside any
context has made torch decide (`_decide_order`), so that the pack's own context cannot cause the same loss.

Graphs: one per (latent shapes, fps, context shapes, timestep shapes, weights' dtype/device, mode) and view of the
weights, cached on the model object (so they go when it is garbage-collected). Inputs are copied into static buffers
every call — latent tokens, the timesteps (per token when the stage is guided: guides.py), the positions and keyframe
marks, AND the text context — so a new prompt, new guides or a guide at another frame replay the same graph. A graph
replays fixed addresses: each is filed under the signature of what it reads — every DiT weight's address, shape and
dtype, the token of the LoRA set applied on the fly and its factors' addresses — and a lookup only ever finds graphs
of the signature the model has now. So when model management offloads and reloads the model the graphs are not
found (and, the weights having moved, dropped), while a model switching between two views (the dev pipeline's plain
stage 1 and its stage 2 with the distilled LoRA on the fly, whose factors stay parked beside the model meanwhile:
kernels/lora_linear.py) keeps both views' graphs and replays them on every later run. Graphs of a LoRA set whose
factors the model no longer holds are dropped; LoRAs merged into the weights keep the addresses: a replay reads the
merged values. All graphs of a model share one memory pool: they never run concurrently and each output is consumed
before the next replay; `MAX_GRAPHS` bounds them over all views.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import torch

from .. import compat, compile_cache
from ..errors import LTX25Error
from ..geometry import pixel_shape
from ..kernels.lora_linear import DOWN, UP, drop_parked, hook_layers, live_tokens, token_of as low_rank_token
from ..streaming import is_streaming
from .guides import GuidedStage
from .positions import patchify_audio, patchify_video

log = logging.getLogger("ltx25")

DenoiseFn = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
Notify = Callable[[str], None]  # a line for the user (the node's progress text in ComfyUI)


@dataclass(frozen=True)
class Mode:
    graph: bool             # replay the DiT forward from a CUDA graph (CUDA only)
    compile: bool           # torch.compile each transformer block (once per model)
    # The SDPA kernel attention prefers (a `torch.nn.attention.SDPBackend` name), entered around each call,
    # outside the compiled blocks: diffusers' own cuDNN backend enters the same limit inside each attention call,
    # which puts private torch calls in Dynamo's graph and makes AOTAutograd skip its on-disk cache at every start.
    # None: the kernel torch itself prefers on the device (`preferred_attention`).
    attention: str | None


MODES = {
    "eager": Mode(graph=False, compile=False, attention=None),
    "compile": Mode(graph=False, compile=True, attention=None),
    "cuda_graph": Mode(graph=True, compile=False, attention=None),
    "compile_cuda_graph": Mode(graph=True, compile=True, attention="CUDNN_ATTENTION"),  # the fastest setting
}
SDPA_FALLBACKS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")  # after a mode's own kernel, in this order
ACCELERATIONS = ("auto", "eager", "cuda_graph", "compile_cuda_graph")  # the sampler node's choices
# Forwards before a capture: allocator, cuBLAS handles, lazy inits and (compile) the compilation itself. A second
# one replayed bit-identical graphs and cost a whole forward per capture (bench/diag_warmup_calls.py).
WARMUP_CALLS = 1
MAX_GRAPHS = 8     # per model, all views; beyond it the cache starts over (the dev two-stage workflow keeps 4)
# `compile_repeated_blocks` → `torch.compile` options. No `dynamic`: the token counts are marked instead (module
# docstring); fullgraph=False: diffusers' attention dispatch may break the graph, which is allowed.
COMPILE_OPTIONS = {"fullgraph": False}
# The compiled blocks' inputs whose second-to-last dim is a stream's token count (diffusers' LTX-2 transformer block,
# which the DiT calls with keywords): the latents, the per-token AdaLN inputs (1 where a stream's tokens share one
# timestep) and the rotary tables. The only dims that differ between resolutions and frame counts (batch aside).
TOKEN_INPUTS = frozenset({
    "hidden_states", "temb", "temb_ca_scale_shift", "temb_ca_gate", "video_rotary_emb", "ca_video_rotary_emb",
    "audio_hidden_states", "temb_audio", "temb_ca_audio_scale_shift", "temb_ca_audio_gate", "audio_rotary_emb",
    "ca_audio_rotary_emb"})


@dataclass
class CaptureCounts:
    """CUDA graphs captured in this process and the warm-up forwards run before them (`record_graph`); the benches
    read them per node: a warm run of a workflow should capture nothing."""
    captures: int = 0
    warmup_calls: int = 0


COUNTS = CaptureCounts()


def resolve_mode(mode: str, device: torch.device, where: str = "acceleration") -> str:
    """'auto' → 'cuda_graph' on a CUDA device, 'eager' elsewhere; an explicit graph mode off CUDA is refused
    (`where`: the node input named in the error; nodes call it before loading anything)."""
    if mode == "auto":
        return "cuda_graph" if device.type == "cuda" else "eager"
    if mode not in MODES:
        raise LTX25Error(where, "the mode", repr(mode), " / ".join(("auto", *MODES)))
    if MODES[mode].graph and device.type != "cuda":
        raise LTX25Error(where, "the mode", f"'{mode}' with the model on the {device.type}",
                         "a CUDA device for it",
                         "CUDA graphs need a CUDA GPU. Choose 'auto' (eager off CUDA) or 'eager'.")
    return mode


def make_denoiser(model: torch.nn.Module, cond, fps: float, mode: str = "auto",
                  guided: GuidedStage | None = None, notify: Notify | None = None) -> DenoiseFn:
    """`(video [B,128,F',H',W'], audio [B,8,T,16], σ) → (x0 video, x0 audio)` float32 on the inputs' devices, for
    `model` (`LTX25Transformer`) with `cond` (`Conditioning`) at `fps`; `mode` is 'auto' or a key of `MODES`.
    `guided` (on the model's device): the stage's guides — per-token timesteps and positions (the video then carries
    the appended guide frames); the x0 is unblended (the sampler holds the conditioned tokens).
    `notify(line)` hears, before a call compiles the blocks or captures a graph of a compiled mode, what is about
    to happen and, after it, how long it took (default: the log).

    A denoiser sets the model's compiled state and attention backend for its own calls (graph modes: for their
    captures), so denoisers of different modes on one model do not disturb each other."""
    notify = notify or log.info
    device = next(model.parameters()).device
    resolved = resolve_mode(mode, device)
    if streamed(model) and resolved != "eager":
        # A graph replays fixed addresses and a compiled block would trace the streamer's hooks: a model whose
        # blocks stream runs eagerly (the copies, not the launches, bound its step time then).
        log.info("LTX-2.5 sampler: %s → eager, the transformer's weights are streamed", resolved)
        resolved = "eager"
    if MODES[resolved].compile and guided is not None and guided.attention is not None:
        # The bias reaches the video self-attention through a processor installed for each forward
        # (reference_attention.py); compiled blocks would be traced with it and re-guarded at every call, so the
        # blocks of such a stage run eagerly, in a CUDA graph where the mode has one.
        fallback = "cuda_graph" if MODES[resolved].graph else "eager"
        notify(f"LTX-2.5 sampler: {resolved} → {fallback} for this stage (a reference video's attention strength "
               "or mask biases the attention; the compiled blocks do not take it)")
        resolved = fallback
    spec = MODES[resolved]
    # Imported on use, like sampling.py: tests stand a fake in for `nodes.ltx.dit.transformer`.
    from .transformer import denoise as eager_denoise
    extra = {} if guided is None else {"guided": guided}
    if spec.graph:
        accelerated = _graph_denoiser(model, cond, fps, spec, guided, notify)
    else:
        def accelerated(video: torch.Tensor, audio: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
            if not spec.compile or _compiled_before(model):
                _set_compiled(model, spec.compile)
                return eager_denoise(model, video, audio, sigma, cond, fps, **extra)
            with _compiling(model, resolved, notify, _compile_message(video.shape, guided is not None and guided.flat)):
                _set_compiled(model, True)
                return eager_denoise(model, video, audio, sigma, cond, fps, **extra)

    def denoise(video: torch.Tensor, audio: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
        # Checked every call: model management may move blocks out mid-run (ComfyUI loads the model again after a
        # preview's model evicted part of it), and streamed blocks must not be captured or traced.
        if resolved != "eager" and streamed(model):
            _set_compiled(model, False)
            return eager_denoise(model, video, audio, sigma, cond, fps, **extra)
        return accelerated(video, audio, sigma)

    attention = spec.attention or preferred_attention(device)
    if attention is None:
        return denoise
    _decide_order(device)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # First choice, then the others: diffusers' cuDNN backend made q/k/v contiguous, the plain one passes them
    # strided, and a layout cuDNN refused must fall back to another kernel, not fail with "no available kernel".
    kernels = [getattr(SDPBackend, attention)] + [getattr(SDPBackend, name) for name in SDPA_FALLBACKS
                                                  if name != attention]

    def with_backend(video: torch.Tensor, audio: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
        with sdpa_kernel(kernels, set_priority=True):
            return denoise(video, audio, sigma)
    return with_backend


def preferred_attention(device: torch.device) -> str | None:
    """The SDPA kernel PyTorch itself puts first on `device` (module docstring): 'CUDNN_ATTENTION' on compute
    capability 9.0 / 10.0 / 10.3 with cuDNN newer than 9.15.0 (older ones mishandle sequence lengths that are not
    multiples of 128), unless `TORCH_CUDNN_SDPA_DEPRIORITIZED=1` or cuDNN attention is switched off
    (`torch.backends.cuda.enable_cudnn_sdp(False)`); None (the process's order) elsewhere."""
    if device.type != "cuda" or os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1":
        return None
    if not torch.backends.cuda.cudnn_sdp_enabled() or not torch.backends.cudnn.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    cudnn = torch.backends.cudnn.version()
    if major in (9, 10) and minor in (0, 3) and cudnn is not None and cudnn > 91500:
        return "CUDNN_ATTENTION"
    return None


_DECIDED: set[torch.device] = set()


def _decide_order(device: torch.device) -> None:
    """One tiny attention call on `device` outside any `sdpa_kernel` context, once per process: torch then settles
    its own kernel order, which a context entered before that would leave undecided on exit (module docstring)."""
    if device.type == "cuda" and device not in _DECIDED:
        q = torch.zeros(1, 1, 8, 64, device=device, dtype=torch.bfloat16)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        _DECIDED.add(device)


def _name(spec: Mode) -> str:
    return next(name for name, mode in MODES.items() if mode == spec)


def streamed(model: torch.nn.Module) -> bool:
    """Whether the model's blocks stream now; if so its graphs (captured while it was resident, and never replayed
    while it streams) are dropped: their pool would hold memory beside the streamed weights."""
    if not is_streaming(model):
        return False
    drop_graphs(model)
    return True


def drop_graphs(model: torch.nn.Module) -> bool:
    """Drop the model's CUDA graphs (any module: a no-op without them) → whether there were any. For a model whose
    weights model management moved: graphs read fixed addresses, so they could never replay, and their pool's idle
    memory would count as taken while the next load plans."""
    return vars(model).pop("_ltx25_graphs", None) is not None


def release(model: torch.nn.Module) -> None:
    """Drop the model's CUDA graphs and their memory pool now (they otherwise live as long as the model), the LoRA
    set parked beside it (kernels/lora_linear.py), and the per-shape positions and device copy of the last
    conditioning that `transformer.denoise` caches: the model is leaving the device, or its memory is needed."""
    drop_graphs(model)
    drop_parked(model)
    model.release_caches()


# ---------------------------------------------------------------------------------------------------- compilation
def _set_compiled(model: torch.nn.Module, on: bool) -> None:
    """Compile the DiT's repeated blocks once per model (`compile_repeated_blocks` with `COMPILE_OPTIONS`, kept as
    diffusers makes it), after pointing the compile caches at the pack's folder; `on=False` runs them eagerly again
    without discarding the compiled code (compat.set_compiled_call)."""
    compiled = vars(model).get("_ltx25_compiled")
    if compiled is None:
        if not on:
            return
        compile_cache.ensure_applied()  # torch reads the cache folders when it first compiles: set them before
        hook_layers(model.dit)  # LoRAs applied on the fly later must be traced (kernels/lora_linear.py)
        model.dit.compile_repeated_blocks(**COMPILE_OPTIONS)
        compiled = model._ltx25_compiled = [(module, _token_counts_dynamic(impl))
                                            for module, impl in compat.compiled_calls(model.dit)]
    for module, impl in compiled:
        compat.set_compiled_call(module, impl if on else None)


def _token_counts_dynamic(impl: Callable) -> Callable:
    """`impl` (a block's compiled forward) with the token-count dim of each of `TOKEN_INPUTS` marked dynamic before
    Dynamo sees the call: the first compilation then covers every resolution and frame count (module docstring)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        for name in TOKEN_INPUTS.intersection(kwargs):
            value = kwargs[name]
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor):
                    # "maybe": a dim of 1 (tokens sharing one timestep) stays static rather than raising
                    torch._dynamo.maybe_mark_dynamic(t, t.ndim - 2)
        return impl(*args, **kwargs)
    return call


def _compiled_before(model: torch.nn.Module) -> bool:
    return vars(model).get("_ltx25_compiled") is not None


def describe_shape(video_shape: tuple[int, ...], tokens: bool = False) -> str:
    """'768×512×121' (pixels wide × high × frames) for a video latent `[B, 128, F', H', W']`; ', 2 clips' added for
    B > 1; with `tokens` (a stage holding an IC-LoRA reference lays its latent out as one row of tokens
    `[B, 128, 1, 1, N]`, guides.py `GuidedStage.flat`), which has no pixel size: 'N latent tokens'."""
    batch = f", {video_shape[0]} clips" if video_shape[0] > 1 else ""
    if tokens:
        return f"{video_shape[4]} latent tokens{batch}"
    frames, height, width = pixel_shape(tuple(video_shape[2:5]))
    return f"{width}×{height}×{frames}{batch}"


def _compile_message(video_shape: tuple[int, ...], tokens: bool = False) -> tuple[str, str]:
    """(before, after) lines for the first compiled call of a model."""
    root = compile_cache.ensure_applied().root
    kept = f"kept in {root}" if root else "kept in torch's own cache folder"
    size = describe_shape(video_shape, tokens)
    return (f"LTX-2.5 sampler: compiling the transformer blocks for {size} (first use in this process; later shapes "
            f"reuse it, and later starts read the compiled code {kept})…",
            f"LTX-2.5 sampler: transformer blocks compiled for {size}")


def _capture_message(video_shape: tuple[int, ...], tokens: bool = False) -> tuple[str, str]:
    """(before, after) lines for a compiled model's first call at a new shape."""
    size = describe_shape(video_shape, tokens)
    return (f"LTX-2.5 sampler: capturing a CUDA graph of the compiled transformer for {size} (first use of this "
            "shape)…", f"LTX-2.5 sampler: CUDA graph captured for {size}")


@contextlib.contextmanager
def _announced(notify: Notify, lines: tuple[str, str]) -> Iterator[None]:
    """`notify(before)`, the work, then `notify(after + seconds)`: the user sees why this call is slow."""
    notify(lines[0])
    start = time.perf_counter()
    yield
    notify(f"{lines[1]} in {time.perf_counter() - start:.1f} s")


@contextlib.contextmanager
def _compiling(model: torch.nn.Module, mode: str, notify: Notify, lines: tuple[str, str]) -> Iterator[None]:
    """`_announced` for work that compiles the blocks. A compile that fails (no working Triton or C compiler, as on
    many Windows installs) leaves the blocks plain and forgotten, so a retry announces a compile again, and names the
    acceleration as the cause rather than surfacing Inductor's traceback alone."""
    try:
        with _announced(notify, lines):
            yield
    except torch._dynamo.exc.TorchDynamoException as error:
        _set_compiled(model, False)
        vars(model).pop("_ltx25_compiled", None)
        inner = getattr(error, "inner_exception", None) or error  # Dynamo wraps the backend's own error
        cause = f"{type(inner).__name__}: {str(inner).strip().splitlines()[0] if str(inner).strip() else ''}"
        raise LTX25Error("acceleration", "the mode", repr(mode), "a torch.compile that works on this install",
                         f"Compiling the transformer blocks failed ({cause}). Choose 'cuda_graph' (CUDA graphs "
                         "without compiling) or 'eager'; the compiled modes need Triton and a C compiler.") from error


# ---------------------------------------------------------------------------------------------------- CUDA graphs
@dataclass
class _Graph:
    replay: Callable[[], tuple[torch.Tensor, torch.Tensor]]  # → the static velocity outputs
    video_tokens: torch.Tensor      # [B, N, 128] static inputs, weights' dtype
    audio_tokens: torch.Tensor      # [B, T, 128]
    steps: Any                      # guides.Timesteps of static float32 buffers
    context: tuple[torch.Tensor, ...]
    grid: Any                       # guides.Grid of static buffers: positions and keyframe marks
    attention: torch.Tensor | None  # the video self-attention's bias [N, N] (a reference's attention strength)


class _Signature(NamedTuple):
    """What a captured graph reads, by address: the DiT's weights and the LoRA set applied on the fly."""
    weights: tuple   # (address, shape, dtype) of every parameter and buffer except the LoRA factors
    token: object    # the installed LoRA set's token (kernels/lora_linear.py)
    factors: tuple   # (address, shape, dtype) of its factors


@dataclass
class _GraphStore:
    """A model's graphs: per signature (one per view that ran), per key; one memory pool for all."""
    views: dict[_Signature, dict[tuple, Any]] = field(default_factory=dict)
    pool: Any = None  # made by the first capture

    def forget_pool(self) -> None:
        """With no graph left the pool is dropped: the next capture starts a fresh one, and the old one's memory
        goes back once its last graph is gone."""
        if not any(self.views.values()):
            self.pool = None


@dataclass
class _GraphCache:
    """The graphs of the model's current view: `graphs` (key → graph) is its entry in the store."""
    signature: _Signature
    graphs: dict[tuple, Any]
    store: _GraphStore

    def make_room(self) -> None:
        """Before a capture: at `MAX_GRAPHS` over all views, every view starts over (their entries emptied in
        place, so a denoiser holding this cache files its next graph in the store)."""
        if sum(map(len, self.store.views.values())) >= MAX_GRAPHS:
            for graphs in self.store.views.values():
                graphs.clear()
            self.store.forget_pool()


def _weights_signature(model: torch.nn.Module) -> _Signature:
    """The DiT's tensors by address, shape and dtype — the weights apart from the factors of the LoRAs applied on
    the fly — and the installed LoRA set's token: a set landing at the old addresses with other ranks, or a new
    set with every buffer in place, changes it."""
    weights, factors = [], []
    for module in model.dit.modules():
        for name, t in (*module._parameters.items(), *module._buffers.items()):
            if t is not None:
                (factors if name in (DOWN, UP) else weights).append((t.data_ptr(), tuple(t.shape), t.dtype))
    return _Signature(tuple(weights), low_rank_token(model), tuple(factors))


def _graph_cache(model: torch.nn.Module) -> _GraphCache:
    """The graph cache of the view the model has now. Graphs filed under other weights (moved since) or under a LoRA
    set whose factors the model no longer holds (neither installed nor parked) are dropped: they could never be
    replayed, and they hold memory of the pool. A view without factors (the plain model) reads only the weights:
    its graphs stay whichever set is installed."""
    signature = _weights_signature(model)
    store = vars(model).get("_ltx25_graphs")
    if store is None:
        store = model._ltx25_graphs = _GraphStore()
    live = live_tokens(model)
    for stale in [s for s in store.views if s != signature and
                  (s.weights != signature.weights or (s.factors and s.token not in live))]:
        store.views.pop(stale).clear()
    store.forget_pool()
    return _GraphCache(signature, store.views.setdefault(signature, {}), store)


def _record(forward: Callable[[], Any], cache: _GraphCache, device: torch.device) -> Callable[[], Any]:
    """Capture `forward()` in a CUDA graph on `device`, in the cache's pool → `replay()` returning its (static)
    outputs."""
    with torch.cuda.device(device):  # streams and capture on the model's GPU, whichever is current
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capturing stream, as torch's CUDA-graph notes prescribe
            for _ in range(WARMUP_CALLS):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        cache.store.pool = cache.store.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of another thread (ComfyUI's server, previews) must not invalidate this capture.
        with torch.cuda.graph(graph, pool=cache.store.pool, capture_error_mode="thread_local"):
            outputs = forward()

    def replay() -> Any:
        graph.replay()
        return outputs
    return replay


def graph_cache(model: torch.nn.Module) -> _GraphCache:
    """The graph cache of the model's current view (shared with the guided denoiser's graphs: one pool, one
    signature per view)."""
    return _graph_cache(model)


def record_graph(forward: Callable[[], Any], cache: _GraphCache, device: torch.device) -> Callable[[], Any]:
    """Capture `forward()` in the cache's pool on `device` → `replay()` (see `_record`); counted in `COUNTS`."""
    COUNTS.captures += 1
    COUNTS.warmup_calls += WARMUP_CALLS
    return _record(forward, cache, device)


def _static(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().contiguous()


def static_like(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy keeping `t`'s strides (the attention bias's rows stay aligned: reference_attention.ROW_ALIGNMENT)."""
    if t is None:
        return None
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _capture(model: torch.nn.Module, video: torch.Tensor, audio: torch.Tensor, cond, fps: float,
             cache: _GraphCache, steps, grid, attention: torch.Tensor | None = None) -> _Graph:
    from .guides import Grid, Timesteps
    from .transformer import velocity
    weight = model.dit.proj_in.weight
    context = tuple(_static(t) for t in model.context(cond, weight.device, weight.dtype, video.shape[0]))
    video_tokens = _static(patchify_video(video).to(weight.device, weight.dtype))
    audio_tokens = _static(patchify_audio(audio).to(weight.device, weight.dtype))
    steps, grid, attention = Timesteps(*map(_static, steps)), Grid(*map(_static, grid)), static_like(attention)
    replay = record_graph(lambda: velocity(model, video_tokens, audio_tokens, steps, context, grid, attention), cache,
                          weight.device)
    return _Graph(replay, video_tokens, audio_tokens, steps, context, grid, attention)


def _graph_denoiser(model: torch.nn.Module, cond, fps: float, spec: Mode,
                    guided: GuidedStage | None = None, notify: Notify = log.info) -> DenoiseFn:
    from .transformer import check_denoise_inputs, forward_inputs, x0_from_velocity

    def denoise(video: torch.Tensor, audio: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
        check_denoise_inputs(model.config, video, audio, cond)
        with torch.inference_mode():
            # Looked up every call, as the guided passes do: model management may move the weights mid-run.
            cache, weight = _graph_cache(model), model.dit.proj_in.weight
            steps, grid = forward_inputs(model, video, audio, sigma, fps, guided, weight.device)
            attention = None if guided is None else guided.attention_bias(weight.dtype, weight.device)
            key = (tuple(video.shape), tuple(audio.shape), float(fps), tuple(cond.video.shape),
                   tuple(cond.audio.shape), tuple(tuple(t.shape) for t in steps), weight.dtype, str(weight.device),
                   spec, attention is not None)
            if key not in cache.graphs:
                cache.make_room()
                if not spec.compile:  # a plain capture takes a few forwards: nothing to announce
                    _set_compiled(model, False)
                    cache.graphs[key] = _capture(model, video, audio, cond, fps, cache, steps, grid, attention)
                else:
                    first = not _compiled_before(model)
                    lines = (_compile_message if first else _capture_message)(video.shape,
                                                                              guided is not None and guided.flat)
                    with _compiling(model, _name(spec), notify, lines):
                        _set_compiled(model, True)
                        cache.graphs[key] = _capture(model, video, audio, cond, fps, cache, steps, grid, attention)
            graph = cache.graphs[key]
            graph.video_tokens.copy_(patchify_video(video))
            graph.audio_tokens.copy_(patchify_audio(audio))
            for static, value in zip((*graph.steps, *graph.grid), (*steps, *grid)):
                static.copy_(value)
            if attention is not None:
                graph.attention.copy_(attention)
            for static, value in zip(graph.context, model.context(cond, weight.device, weight.dtype,
                                                                     video.shape[0])):
                static.copy_(value)
            v, a = graph.replay()
            return x0_from_velocity(video, audio, v, a, sigma, weight.device, guided)
    return denoise
