"""The LTX-2.5 diffusion video VAE ("NADiffusionDecoder", docs/MODEL.md §10): config, key map, loading, tiled decode.

The network is diffusers' `LTX2VideoDiffusionDecoderModel`, configured from `config.vae` of the file. We write
only what diffusers lacks: the native key map, the neighborhood-attention processors (`na_attention`), the tile
schedule (`diffusion_tiling`) and the driver below, which runs the decoder's own stage functions:
stages 1-3 once on the whole latent (or, when that does not fit, per temporal group in exact slabs) → stage 4
per tile → stage 5 (denoise pixels) per tile on a `FlowMatchEulerDiscreteScheduler` → each tile's pixels straight
into the output frames (host memory): the one tile of an untiled decode final, tiles of a tiled one weighted by
their trapezoid ramps and added there, frames mapped to [0, 1] once every tile reaching them is in. No device
buffer spans the canvas; what a decode holds is counted in `diffusion_tiling.MemoryModel`.
"""
from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoDiffusionDecoderModel

from . import diffusion_tiling as tiling
from .diffusion_tiling import EMIT_FRAMES
from .. import compat
from ..kernels import fused_block
from ..kernels import na_attention
from ..files.assets import Kind, expect_kind, read_state_dict
from ..files.config import config_field
from .stats import DecodeStats
from .tiling import TilingRequest, work_ratio
from ..device_memory import free_bytes, start_meter, weight_bytes
from ..errors import LTX25Error
from ..geometry import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION
from .host_frames import DeviceToHost, DirectCopy, HostFrames, host_copier
from ..files.keymap import Drop, KeyMap, Rename, Split, load_strict
from ..files.vae_layout import statistics_renames
from ..latents import denormalize_video
from ..stop_points import checked_before

CLASS_NAME = "CausalDiffusionVAE"
READ_PREFIXES = ("decoder.", "per_channel_statistics.")


@dataclass(frozen=True)
class DiffusionVAEConfig:
    """`config.vae.decoder` (+ `config.vae.model_output_type`) of the file. Every value is read from the file:
    the reference code's defaults differ from the release (2 steps, timestep ×1, `v` output, other widths)."""
    in_channels: int                           # 128
    out_channels: int                          # 3
    patch_size: int                            # 4
    head_dim: int                              # 64
    stage_channels: tuple[int, ...]            # (2048, 1024, 512, 512, 256)
    stage_depths: tuple[int, ...]              # (4, 6, 4, 2, 8)
    stage_kernels: tuple[tuple[int, int, int], ...]   # 4 deterministic stages (the file's 5th entry is unused)
    upsample_strides: tuple[tuple[int, int, int], ...]
    upsample_reductions: tuple[int, ...]       # (2, 2, 1, 2)
    stage5_kernel: tuple[int, int, int]        # (11, 11, 11)
    t_emb_dim: int                             # absent in the file ⇒ 384
    timestep_scale_multiplier: float           # 1000.0
    default_num_inference_steps: int           # 1
    model_output_type: str                     # "x0"

    @classmethod
    def from_metadata(cls, where: object, metadata: Mapping[str, Any]) -> "DiffusionVAEConfig":
        # absent: a diffusion VAE by its tensors (that is how it got here) whose metadata a repack stripped
        class_name = config_field(where, metadata, "vae._class_name")
        if class_name != CLASS_NAME:
            raise LTX25Error(where, "config.vae._class_name", class_name, CLASS_NAME,
                             "This is not a diffusion VAE file.")
        config_field(where, metadata, "vae.decoder", kind=Mapping, hint="The nested decoder config block is missing.")

        def get(key: str) -> Any:
            return config_field(where, metadata, f"vae.decoder.{key}",
                                hint="The reference code's default differs from the release; refusing to guess.")

        def unsupported(key: str, found: Any, expected: Any) -> LTX25Error:
            return LTX25Error(where, f"config.vae.decoder.{key}", found, expected, "Not an LTX-2.5 diffusion VAE.")

        for key, allowed in (("resampler_kind", "linear"), ("spatial_padding_mode", "zeros")):
            config_field(where, metadata, f"vae.decoder.{key}", allowed, allowed=(allowed,),
                         hint="Not an LTX-2.5 diffusion VAE.")
        channels, depths = tuple(get("stage_channels")), tuple(get("stage_depths"))
        kernels, upsamples = tuple(tuple(k) for k in get("stage_kernels")), get("upsamples")
        if len(channels) != 5 or len(depths) != 5 or len(kernels) < 4 or len(upsamples) != 4:
            raise unsupported("stage lists", (len(channels), len(depths), len(kernels), len(upsamples)),
                              "5 channels, 5 depths, ≥4 kernels, 4 upsamples")
        config_field(where, metadata, "vae.decoder.stage5_channels", channels[-1], allowed=(channels[-1],),
                     hint="Stage 5 runs at the width of stage_channels[-1]; not an LTX-2.5 diffusion VAE.")
        output_type = config_field(where, metadata, "vae.model_output_type", allowed=("x0", "v"))
        config = cls(get("in_channels"), get("out_channels"), get("patch_size"), get("head_dim"), channels, depths,
                     kernels[:4], tuple(tuple(s) for s, _ in upsamples), tuple(r for _, r in upsamples),
                     tuple(get("stage5_kernel")), config_field(where, metadata, "vae.decoder.t_emb_dim", 384),
                     float(get("timestep_scale_multiplier")), int(get("default_num_inference_steps")), output_type)
        if config.compression != (TEMPORAL_COMPRESSION, SPATIAL_COMPRESSION):
            raise unsupported("upsamples × patch_size", config.compression,
                              f"({TEMPORAL_COMPRESSION}, {SPATIAL_COMPRESSION}): the LTX-2.5 latent format")
        return config

    @property
    def compression(self) -> tuple[int, int]:
        t = h = 1
        for st, sh, _ in self.upsample_strides:
            t, h = t * st, h * sh
        return t, h * self.patch_size

    def diffusers_kwargs(self) -> dict:
        return dict(out_channels=self.out_channels, latent_channels=self.in_channels, patch_size=self.patch_size,
                    decoder_head_dim=self.head_dim, decoder_stage_channels=self.stage_channels,
                    decoder_stage_depths=self.stage_depths, decoder_stage_kernels=self.stage_kernels,
                    decoder_upsample_strides=self.upsample_strides,
                    decoder_upsample_channel_reductions=self.upsample_reductions,
                    decoder_stage5_kernel=self.stage5_kernel, decoder_t_emb_dim=self.t_emb_dim,
                    decoder_timestep_scale_multiplier=self.timestep_scale_multiplier,
                    decoder_model_output_type=self.model_output_type,
                    decoder_num_inference_steps=self.default_num_inference_steps,
                    spatial_compression_ratio=self.compression[1], temporal_compression_ratio=self.compression[0])

    def geometry(self) -> tiling.TilingGeometry:
        return tiling.TilingGeometry(self.stage_channels, self.stage_kernels, self.stage_depths,
                                     self.upsample_strides, self.stage5_kernel, self.patch_size)


# ---------------------------------------------------------------------------------------------- keys and loading
KEY_MAP = KeyMap(
    "diffusion video VAE",
    renames=(
        Rename("decoder.t_embedder.mlp.0", "decoder.t_embedder.timestep_embedder.linear_1"),
        Rename("decoder.t_embedder.mlp.2", "decoder.t_embedder.timestep_embedder.linear_2"),
        Rename("attn.proj", "attn.to_out.0", anywhere=True),
        Rename("attn.q_norm", "attn.norm_q", anywhere=True),
        Rename("attn.k_norm", "attn.norm_k", anywhere=True),
        *statistics_renames(),
    ),
    splits=(Split("qkv", ("to_q", "to_k", "to_v")),),  # fused [3C, C] stored q, k, v in thirds
    drops=(
        Drop(r"encoder\..*", "the conv encoder the file bundles: LTX-2.5 Load Video Encoder builds it (encode/)"),
        Drop(r"decoder\.type_emb", "unused by every implementation (reference, diffusers, ComfyUI)"),
        Drop(r"decoder\.coarse_.*", "a bundled preview head (monolith files), not part of the decoder"),
    ),
)
# Legacy files carried static per-block gates; the decoder's residuals are ungated, so each gate is folded
# (in fp32) into the Linear whose output it scaled. The released 2.5 file has none.
LEGACY_GATES = {"gate_msa": ("attn.proj",), "gate_mlp": ("mlp.w_down",), "gate_ctx": ("context_proj",)}


def fold_legacy_gates(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Value op: `W ← g[:, None]·W`, `b ← g·b` for every `decoder.diff_blocks.N.gate_*`, then drop the gate."""
    out = dict(native)
    for key in [k for k in native if k.rsplit(".", 1)[-1] in LEGACY_GATES]:
        block, gate_name = key.rsplit(".", 1)
        gate = out.pop(key).float()
        for target in LEGACY_GATES[gate_name]:
            for leaf, shape in ((".weight", (-1, 1)), (".bias", (-1,))):
                name = f"{block}.{target}{leaf}"
                if name in out:
                    out[name] = (gate.view(shape) * out[name].float()).to(out[name].dtype)
    return out


class DiffusionVAE(torch.nn.Module):
    """LTX25_VIDEO_VAE for the diffusion decoder: diffusers' model plus the file's config."""
    kind = "diffusion"

    def __init__(self, model: LTX2VideoDiffusionDecoderModel, config: DiffusionVAEConfig) -> None:
        super().__init__()
        self.model, self.config = model, config

    @property
    def latents_mean(self) -> torch.Tensor:
        return self.model.latents_mean  # [128] per-channel mean-of-means (the upsampler reads it too)

    @property
    def latents_std(self) -> torch.Tensor:
        return self.model.latents_std


def load_diffusion_vae(path: str, dtype: torch.dtype = torch.bfloat16) -> DiffusionVAE:
    """Build the decoder from `ltx-2.5-video-vae-bf16.safetensors` strictly (every decoder key used or dropped)."""
    info = expect_kind(path, Kind.DIFFUSION_VAE)
    config = DiffusionVAEConfig.from_metadata(info.path, info.header.metadata)
    skipped = [k for k in info.header.tensors if not k.startswith(READ_PREFIXES)]
    unaccounted = [k for k in skipped if KEY_MAP.drop_reason(k) is None]
    if unaccounted:
        raise LTX25Error(info.path, "tensors outside decoder.*", ", ".join(sorted(unaccounted)[:5]),
                         "only the bundled encoder.*", "The file is from another model or damaged.")
    native = fold_legacy_gates(read_state_dict(info.path, prefixes=READ_PREFIXES))
    model = load_strict(info.path, lambda: LTX2VideoDiffusionDecoderModel(**config.diffusers_kwargs()),
                        native, KEY_MAP, dtype)
    # diffusers installs its flex processor by default; without torch.compile it builds a dense mask.
    na_attention.install_processor(model, na_attention.SdpaNAProcessor())
    return DiffusionVAE(model, config)


# ---------------------------------------------------------------------------------------------- stage-5 loop
REFUSED_SCHEDULER_KEYS = {"use_dynamic_shifting": False, "shift": 1.0, "shift_terminal": None,
                          "use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False,
                          "invert_sigmas": False, "stochastic_sampling": False}


def make_stage5_scheduler(config: Mapping[str, Any] | None = None) -> FlowMatchEulerDiscreteScheduler:
    """A `FlowMatchEulerDiscreteScheduler` that keeps the decoder's sigmas `linspace(1, 1/N, N)` as given.
    A config that would reshape them (dynamic/static shift, karras…, stochastic) is refused."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(dict(config or {}))
    for key, wanted in REFUSED_SCHEDULER_KEYS.items():
        if scheduler.config.get(key) != wanted:
            raise LTX25Error("stage-5 scheduler", f"config {key}", scheduler.config[key], wanted,
                             "The decoder was trained on sigmas linspace(1, 1/N, N); use "
                             "FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False) as is.")
    return scheduler


def run_stage5(predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x_t: torch.Tensor, steps: int,
               output_type: str, scheduler: FlowMatchEulerDiscreteScheduler,
               on_step: Callable[[], None] | None = None) -> torch.Tensor:
    """Denoise `x_t` `[B, 3, F, H, W]` from sigma 1 in `steps` Euler steps; `predict(x, sigma)` is the model.

    x0 outputs become velocity `(x − x0)/σ` for the scheduler; the last x0 prediction is returned directly.
    """
    scheduler.set_timesteps(sigmas=torch.linspace(1.0, 1.0 / steps, steps).tolist(), device=x_t.device)
    for i in range(steps):
        sigma = scheduler.sigmas[i]
        out = predict(x_t, sigma)
        if on_step is not None:
            on_step()
        if output_type == "x0" and i == steps - 1:
            return out
        velocity = out.float() if output_type == "v" else (x_t.float() - out.float()) / sigma
        x_t = scheduler.step(velocity, scheduler.timesteps[i], x_t.float(), return_dict=False)[0].to(x_t.dtype)
    return x_t


# ---------------------------------------------------------------------------------------------- decode driver
def stage4_input(decoder, pre: torch.Tensor, frames: tuple[int, int], rows: tuple[int, int],
                 cols: tuple[int, int], pre_first: int = 0) -> torch.Tensor:
    """`forward_stages_1_to_3(...)[:, t0:t1, h0:h1, w0:w1]`, computed from the slice of the features before the
    third upsample (`compat.stages_1_to_3_before_last_upsample`) that it needs; `pre` holds those features from
    frame `pre_first` on."""
    up = compat.deferred_upsample(decoder)
    st, sh, sw = up.stride
    lead = 1 if st == 2 else 0  # stage-4 frame j is frame j+1 of the upsample before its leading frame is dropped
    spans = [(frames[0] + lead, frames[1] + lead, st), (*rows, sh), (*cols, sw)]
    src = [(a // s, (b - 1) // s + 1) for a, b, s in spans]
    x = up(pre[:, src[0][0] - pre_first:src[0][1] - pre_first, src[1][0]:src[1][1], src[2][0]:src[2][1]],
           drop_leading_frame=False)
    crop = [slice(a - lo * s, b - lo * s) for (a, b, s), (lo, _) in zip(spans, src)]
    return x[:, crop[0], crop[1], crop[2]].contiguous()


def tile_noise(seed: int, tile: tiling.Tile, batch: int, canvas_hw: tuple[int, int], device: torch.device,
               dtype: torch.dtype) -> torch.Tensor:
    """Stage-5 start noise `[B, 3, F, h, w]` for a tile: each canvas frame is drawn whole from a generator
    seeded by (seed, frame), then cropped — so the noise field never depends on how the video is tiled."""
    gen = torch.Generator(device)
    out = torch.empty(batch, 3, *tile.pixel_shape, device=device, dtype=dtype)
    for i in range(tile.t.length):
        gen.manual_seed((seed + (tile.t.pixels[0] + i) * 0x9E3779B97F4A7C15) % 2**64)
        frame = torch.randn(batch, 3, *canvas_hw, generator=gen, device=device, dtype=dtype)
        out[:, :, i] = frame[:, :, tile.h.pixels[0]:tile.h.pixels[1], tile.w.pixels[0]:tile.w.pixels[1]]
    return out


def memory_model(vae: DiffusionVAE, batch: int = 1,
                 processor: na_attention.NeighborhoodAttnProcessor | None = None,
                 frames_on_device: bool = False) -> tiling.MemoryModel:
    """The planner's byte counts for this decoder's dtype, `processor` (None: the larger working sets of
    diffusers' blocks) and where the frames go (`frames_on_device`: the output is kept on the decode's device)."""
    param = next(vae.parameters())
    element = param.element_size()
    scratch = processor.scratch_bytes(element, param.is_cuda) if processor is not None else 0
    lean = processor is not None and processor.fused_projection and processor.fused_block and \
        na_attention.folds_scale(vae.config.head_dim)
    return tiling.MemoryModel(element_bytes=element, batch=batch,
                              stage5_live=tiling.LEAN_STAGE5_LIVE if lean else tiling.DIFFUSERS_STAGE5_LIVE,
                              det_live=tiling.LEAN_DET_LIVE if lean else tiling.DET_LIVE,
                              chunk_elements=fused_block.CHUNK_ELEMENTS if lean else 0, processor_scratch=scratch,
                              frames_on_device=frames_on_device)


def default_request(vae: DiffusionVAE, mode: str = "auto") -> TilingRequest:
    """This decoder's tiling defaults: 80-frame, 512-px manual tiles and the smallest safe overlaps of its
    receptive field (40 frames / 160 px for the released config, less for smaller test models)."""
    frames, pixels = vae.config.geometry().min_overlap
    return TilingRequest(mode, tile_frames=80, tile_pixels=512, overlap_frames=frames, overlap_pixels=pixels)


def working_memory(vae: DiffusionVAE, latent_shape: tuple[int, ...], request: TilingRequest | None = None,
                   processor: na_attention.NeighborhoodAttnProcessor | None = None,
                   frames_on_device: bool = False) -> int:
    """Bytes a decode of `[B, 128, T, H, W]` needs beyond the weights: the manual tiles' for a `manual` request,
    else the untiled decode's — what model management is asked to free before the decode (auto tiling then plans
    within whatever is actually free). Counted for `processor`; None assumes diffusers' blocks' larger working
    set, so model management frees more than a lean decode uses, never less. `frames_on_device`: the output frames
    stay on the decode's device (counted as `tiles_within` and `decode` count them)."""
    request = request if request is not None and request.mode == "manual" else default_request(vae, "off")
    return memory_model(vae, latent_shape[0], processor, frames_on_device).estimate(
        plan(vae, tuple(latent_shape[2:]), request, None))


def tiles_within(vae: DiffusionVAE, latent_shape: tuple[int, ...], request: TilingRequest, budget: int,
                 processor: na_attention.NeighborhoodAttnProcessor | None = None,
                 frames_on_device: bool = False) -> tuple[int, float] | None:
    """(estimated bytes, work ratio) of the `auto` tiles `decode` plans within `budget` bytes of working memory (the
    request's overlaps, counted for `processor`), None when even its smallest tiles do not fit."""
    batch, auto = latent_shape[0], replace(request, mode="auto")
    try:
        schedule = plan(vae, tuple(latent_shape[2:]), auto, budget, batch, processor, frames_on_device)
    except tiling.BudgetTooSmall:  # other errors (a bad overlap) are the user's input to fix, not a reason to evict
        return None
    spans = [[span.length for span in axis] for axis in schedule.spans]
    lengths = [axis[-1].pixels[1] - axis[0].pixels[0] for axis in schedule.spans]
    return memory_model(vae, batch, processor, frames_on_device).estimate(schedule), work_ratio(spans, lengths)


def plan(vae: DiffusionVAE, latent_thw: tuple[int, int, int], request: TilingRequest, budget_bytes: int | None,
         batch: int = 1, processor: na_attention.NeighborhoodAttnProcessor | None = None,
         frames_on_device: bool = False) -> tiling.TileSchedule:
    """The tile schedule a decode of `latent_thw` will use: `off` one tile, `manual` the requested sizes, `auto`
    the least overlap that fits `budget_bytes` (None = the free device memory), with the requested overlaps."""
    geometry, overlaps = vae.config.geometry(), (request.overlap_frames, request.overlap_pixels)
    if request.mode == "off":
        return tiling.build_schedule(geometry, latent_thw)
    if request.mode == "manual":
        return tiling.build_schedule(geometry, latent_thw, request.tile_frames, request.tile_pixels, *overlaps)
    budget = free_bytes(next(vae.parameters()).device) if budget_bytes is None else budget_bytes
    return tiling.plan_auto(geometry, latent_thw, budget, memory_model(vae, batch, processor, frames_on_device),
                            *overlaps)


def decode(vae: DiffusionVAE, latent: torch.Tensor, *,
           processor: str | na_attention.NeighborhoodAttnProcessor = "auto", steps: int = 0, seed: int = 0,
           request: TilingRequest | None = None, free_memory: int | None = None,
           scheduler_config: Mapping[str, Any] | None = None, on_step: Callable[[int, int], None] | None = None,
           out_device: torch.device | str = "cpu", where: str = "diffusion VAE decode",
           check: Callable[[], None] | None = None) -> tuple[torch.Tensor, DecodeStats]:
    """Normalized latent `[B, 128, T, H, W]` → frames `[B·F, H·32, W·32, 3]` float in [0, 1] on `out_device`.

    `processor`: a name from `na_attention.PROCESSORS` or a processor instance. `steps` 0 = the file's default
    (1). `request`: the tiling (None = `default_request`); `auto` plans within its memory budget, or within
    `free_memory` (bytes free on the device with the weights loaded; None = ask the device) when that is 0.
    `on_step(done, total)` runs after every tile×step (progress; raising stops the decode). `check()` runs before
    each block of every stage (it raises to interrupt inside a tile: an untiled decode is one tile, and stages 1-3
    run once before any tile). `where` names the node in errors.
    """
    request = default_request(vae) if request is None else request
    request.check(where)
    config = vae.config
    if latent.ndim != 5 or latent.shape[1] != config.in_channels:
        raise LTX25Error("latent", "the shape", tuple(latent.shape), f"[B, {config.in_channels}, T, H, W]")
    steps = steps or config.default_num_inference_steps
    if steps < 1:
        raise LTX25Error("steps", "the value", steps, "≥ 1 (0 = the file's default)")
    device = next(vae.parameters()).device
    proc = processor if isinstance(processor, na_attention.NeighborhoodAttnProcessor) else \
        na_attention.make_processor(processor, device, f"{where}.processor")
    na_attention.install_processor(vae.model, proc)
    fused_block.use_fused_blocks(vae.model, proc.fused_block)
    budget = request.budget_bytes(weight_bytes(vae), free_bytes(device) if free_memory is None else free_memory,
                                  where)
    frames_on_device = torch.device(out_device).type == device.type
    schedule = plan(vae, tuple(latent.shape[2:]), request, budget, latent.shape[0], proc, frames_on_device)
    run = _Decode(vae, schedule, schedule.tiles(), make_stage5_scheduler(scheduler_config), steps, seed, on_step)
    meter = start_meter(device)
    work: dict[str, torch.Tensor] = {}  # every tensor of the decode lives here or in a callee's frame
    try:
        blocks = [*compat.det_blocks(vae.model), *compat.stage5_blocks(vae.model)] if check is not None else []
        with torch.inference_mode(), checked_before(blocks, check):
            run.decode_into(work, latent, out_device)
    except BaseException as error:
        work.clear()
        # A traceback keeps every frame's locals (tile context, noise, predictions) alive as long as the exception
        # lives (in ComfyUI: until the next prompt); an interrupt or OOM must hand the memory back now.
        traceback.clear_frames(error.__traceback__)
        raise
    frames = work.pop("out")
    seconds, peak = meter()
    stats = DecodeStats(
        decoder="diffusion", seconds=seconds, peak_memory_bytes=peak,
        tile_count=len(run.tiles), tile_sizes=tuple(t.pixel_shape for t in run.tiles),
        processor=proc.name + (f" ({proc.backend})" if getattr(proc, "backend", "") else ""), steps=steps,
        extra={"tiling": request.mode, "grid": schedule.grid, "overlap": schedule.overlap,
               "requested_processor": str(processor), "budget_bytes": budget})
    return frames.reshape(-1, *frames.shape[2:]), stats


@dataclass
class _Decode:
    """One decode: the schedule and loop state; `decode_into` keeps its tensors in `work` or its own frames."""
    vae: DiffusionVAE
    schedule: tiling.TileSchedule
    tiles: list[tiling.Tile]
    scheduler: FlowMatchEulerDiscreteScheduler
    steps: int
    seed: int
    on_step: Callable[[int, int], None] | None
    done: int = 0

    def tick(self) -> None:
        self.done += 1
        if self.on_step is not None:
            self.on_step(self.done, len(self.tiles) * self.steps)

    def decode_into(self, work: dict[str, torch.Tensor], latent: torch.Tensor, out_device) -> None:
        """The decode's frames into `work["out"]` `[B, F, H, W, 3]` on `out_device` (see `_decode_groups`)."""
        device, batch = next(self.vae.parameters()).device, latent.shape[0]
        frames, rows, cols = self.schedule.content
        shape = (batch, frames.stop, rows.stop - rows.start, cols.stop - cols.start, 3)
        on_host = torch.device(out_device).type == "cpu"
        blended = self.schedule.is_tiled  # tiles are added into the frames, which must start at zero
        host = HostFrames(shape, prefault=device.type != "cpu" or blended) if on_host else None
        if on_host:
            work["out"] = torch.empty(0)
        else:
            work["out"] = torch.zeros(shape, device=out_device) if blended else torch.empty(shape, device=out_device)
        # frames leave through pinned staging on a side stream: a plain copy into pageable memory is slow and
        # leaves the device idle meanwhile
        copier = host_copier(device, staged=on_host)
        try:
            self._decode_groups(work, latent, host, copier)
        finally:
            copier.finish()

    def _decode_groups(self, work: dict[str, torch.Tensor], latent: torch.Tensor, host: HostFrames | None,
                       copier: DeviceToHost | DirectCopy) -> None:
        """Stages 1-3 once (or per group, `group_features`); per temporal group: stage 4-5 per tile, each tile's
        pixels handed to `work["out"]` as it finishes (`emit`). Tiled, they are added there weighted, and a group's
        frames up to the next group's start, final once it is done, are then mapped to [0, 1]."""
        vae, schedule = self.vae, self.schedule
        decoder, param = vae.model.decoder, next(vae.parameters())
        device, dtype = param.device, param.dtype
        frames = schedule.content[0]
        _, height, width = schedule.canvas
        z = denormalize_video(latent, vae.latents_mean, vae.latents_std, device)
        t_pad, top, left = schedule.latent_pad
        bottom, right = schedule.work_thw[1] - latent.shape[3] - top, schedule.work_thw[2] - latent.shape[4] - left
        if t_pad or top or bottom or left or right:  # frames repeat the last; rows/columns edge-replicate
            z = F.pad(z, (left, right, top, bottom, 0, t_pad), mode="replicate")
        pre_first = 0
        if schedule.pre_chunk is None:
            work["pre"] = compat.stages_1_to_3_before_last_upsample(decoder, z.to(dtype))
        else:
            ghosts = schedule.geometry.ghost_latent_frames
            work["z"] = torch.cat([z, z[:, :, -1:].expand(-1, -1, ghosts, -1, -1)], dim=2).to(dtype)
        del z
        for span, (emit0, emit1) in schedule.groups():
            if schedule.pre_chunk is not None:
                work.pop("pre", None)  # the previous group's features go before this group's are built
                work["pre"], pre_first = self.group_features(decoder, work["z"], span)
            if host is not None:
                work["out"] = host.ready()
            for tile in (t for t in self.tiles if t.t == span):
                work["x0"] = self.tile(decoder, work["pre"], tile, (height, width), pre_first)
                self.emit(work["out"], work.pop("x0"), tile, copier)
            final = work["out"][:, emit0:min(emit1, frames.stop)]
            if schedule.is_tiled and final.shape[1]:  # no later tile reaches these frames
                copier.then(lambda final=final: final.add_(1).div_(2).clamp_(0, 1))
        del work["pre"]
        work.pop("z", None)

    def emit(self, out: torch.Tensor, x0: torch.Tensor, tile: tiling.Tile, copier: DeviceToHost | DirectCopy) -> None:
        """A tile's pixels `x0` `[B, 3, f, h, w]` (the part inside the content) into `out` `[B, F, H, W, 3]`, in
        float32 pieces of `EMIT_FRAMES` frames. The one tile of an untiled decode is final: mapped to [0, 1] and
        copied. A tile among others is weighted by its blend ramps and added; the weights sum to one, so the frames
        hold the blend once every tile reaching them has been added (`_decode_groups` then maps them)."""
        (f_lo, f_hi), (r_lo, r_hi), (c_lo, c_hi) = self.schedule.content_part(tile)
        if f_hi <= f_lo or r_hi <= r_lo or c_hi <= c_lo:
            return
        t0, h0, w0 = tile.t.pixels[0], tile.h.pixels[0], tile.w.pixels[0]
        top, left = self.schedule.content[1].start, self.schedule.content[2].start
        blended = self.schedule.is_tiled
        if blended:  # [f], [h], [w] weights of the part; their product is made per piece (a tile-sized float32
            # product would be a large temporary), in the order (t·h)·w
            ramps = [span.weights()[lo - first:hi - first].to(x0.device) for span, first, lo, hi in
                     ((tile.t, t0, f_lo, f_hi), (tile.h, h0, r_lo, r_hi), (tile.w, w0, c_lo, c_hi))]
        for f0 in range(f_lo, f_hi, EMIT_FRAMES):
            f1 = min(f0 + EMIT_FRAMES, f_hi)
            piece = x0[:, :, f0 - t0:f1 - t0, r_lo - h0:r_hi - h0, c_lo - w0:c_hi - w0].permute(0, 2, 3, 4, 1)
            if blended:
                weight = ramps[0][f0 - f_lo:f1 - f_lo, None, None] * ramps[1][None, :, None] * ramps[2][None, None]
                rgb = torch.mul(piece, weight[None, :, :, :, None],
                                out=torch.empty(piece.shape, dtype=torch.float32, device=x0.device))
            else:
                rgb = piece.to(torch.float32, memory_format=torch.contiguous_format).add_(1).div_(2).clamp_(0, 1)
            for item in range(x0.shape[0]):
                copier.copy(out[item, f0:f1, r_lo - top:r_hi - top, c_lo - left:c_hi - left], rgb[item], blended)
            del piece, rgb

    def group_features(self, decoder, z_ghosted: torch.Tensor, span: tiling.AxisSpan) -> tuple[torch.Tensor, int]:
        """(the pre-upsample features a temporal group's tiles are cut from, the first frame they hold), built
        `pre_chunk` frames at a time from latent slabs wide enough to be exact (`compat.stages_1_to_3_slab`)."""
        schedule = self.schedule
        p0, p1 = schedule.group_pre_frames(span)
        features = None
        for (q0, q1), (start, stop) in schedule.pre_slabs(span):
            x, first = compat.stages_1_to_3_slab(decoder, z_ghosted[:, :, start:stop], start, schedule.ghosted_frames)
            if features is None:
                features = x.new_empty(x.shape[0], p1 - p0, *x.shape[2:])
            features[:, q0 - p0:q1 - p0] = x[:, q0 - first:q1 - first]
            del x
        return features, p0

    def tile(self, decoder, pre: torch.Tensor, tile: tiling.Tile, canvas_hw: tuple[int, int],
             pre_first: int = 0) -> torch.Tensor:
        """Stage 4 + stage 5 on one tile → pixels `[B, 3, F, h, w]`."""
        # the features are stage 4's to release after its first block: no reference is kept here
        context = compat.stage_4(decoder, stage4_input(decoder, pre, tile.feature_frames, tile.h.cells, tile.w.cells,
                                                       pre_first),
                                 tile.is_origin, tile.t.cells[1] - tile.t.cells[0])
        batch = context.shape[0]
        x_t = tile_noise(self.seed, tile, batch, canvas_hw, context.device, context.dtype)
        # a partial, not a lambda: a lambda's frame left in a traceback (a stop or an out-of-memory inside a step)
        # keeps its closure, the tile's context, alive past `traceback.clear_frames`
        return run_stage5(functools.partial(_stage5_step, decoder, context, batch), x_t, self.steps,
                          self.vae.config.model_output_type, self.scheduler, self.tick)


def _stage5_step(decoder, context: torch.Tensor, batch: int, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return decoder.forward_diffusion_step(context, x_t, sigma.expand(batch))
