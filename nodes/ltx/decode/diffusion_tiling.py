"""The diffusion VAE's tile schedule: where stages 4-5 cut the video, as plain numbers.

Stages 1-3 run once on the whole (floor-padded, ghost-padded) latent, or — when that does not fit — per temporal
group in latent slabs widened by their temporal reach, so each is exact (`slab_trace`); stages 4-5 run per tile.
Tiles live on the stage-4 input grid ("cells": 2 frames × 8 × 8 px for the released config) and are blended in
pixel space with the trapezoid ramps of `tiling`, which sum to one. Everything here is a function of the decoder
config and the latent shape — no tensors but the 1-D weights — so the geometry is tested without running a model;
`MemoryModel` counts the bytes a schedule keeps alive, which `plan_auto` fits to a budget.
Reference: docs/MODEL.md §10.4; the byte counts: docs/PERFORMANCE.md, "The diffusion decoder's memory".
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch

from ..errors import LTX25Error
from ..geometry import VIDEO_FACTORS  # frames, height, width per latent cell: tile sizes and overlaps sit on it
from .tiling import axis_cuts, ramp_weights, search_budget

THW = tuple[int, int, int]
WHERE = "diffusion VAE tiling"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(value: int, multiple: int) -> int:
    return _ceil_div(value, multiple) * multiple


def upsample_frames(frames: int, stride_t: int, drop_leading: bool = True) -> int:
    """Frames after one pixel-shuffle upsample: ×stride, minus the duplicate leading frame a temporal ×2 makes."""
    return frames * stride_t - (1 if stride_t == 2 and drop_leading else 0)


@dataclass(frozen=True)
class TilingGeometry:
    """The config numbers the schedule depends on (released values in comments)."""
    stage_channels: tuple[int, ...]            # (2048, 1024, 512, 512, 256)
    stage_kernels: tuple[THW, ...]             # 4 deterministic stages: (3,7,7), (3,7,7), (3,5,5), (3,5,5)
    stage_depths: tuple[int, ...]              # (4, 6, 4, 2, 8); the last is stage 5
    upsample_strides: tuple[THW, ...]          # (1,2,2), (2,1,1), (2,2,2), (2,2,2)
    stage5_kernel: THW                         # (11, 11, 11)
    patch_size: int                            # 4

    @property
    def cell_pixels(self) -> THW:
        """Output pixels per stage-4 cell: the last upsample's stride times the patch size → (2, 8, 8)."""
        st, sh, sw = self.upsample_strides[-1]
        return st, sh * self.patch_size, sw * self.patch_size

    @property
    def ghost_latent_frames(self) -> int:
        """Copies of the last latent frame appended before stage 1 so NATTEN's inward-shifted border window
        lands on ghosts, not on kept frames → 2."""
        return (self.stage_kernels[0][0] // 2) * 2

    @property
    def ghost_cells(self) -> int:
        """The ghost frames on the stage-4 grid (×4 through the first three upsamples) → 8."""
        return self.ghost_latent_frames * math.prod(s[0] for s in self.upsample_strides[:-1])

    @property
    def halo4(self) -> THW:
        """One-sided receptive field of stage 4 in cells: depth·(k//2) → (2, 4, 4)."""
        return tuple(self.stage_depths[-2] * (k // 2) for k in self.stage_kernels[-1])

    @property
    def halo5(self) -> THW:
        """One-sided receptive field of stage 5 in cells: ceil(depth·(k//2) / stride) → (20, 20, 20)."""
        return tuple(_ceil_div(self.stage_depths[-1] * (k // 2), s)
                     for k, s in zip(self.stage5_kernel, self.upsample_strides[-1]))

    @property
    def min_overlap(self) -> tuple[int, int]:
        """Smallest safe overlap (frames, pixels): the dominant halo in pixels, rounded up to the latent grid
        → (40, 160). A smaller overlap leaves seams, so it is refused."""
        halo = [max(a, b) for a, b in zip(self.halo4, self.halo5)]
        ct, ch, _ = self.cell_pixels
        return _round_up(halo[0] * ct, VIDEO_FACTORS[0]), _round_up(max(halo[1], halo[2]) * ch, VIDEO_FACTORS[1])

    @property
    def min_tile_cells(self) -> THW:
        """Tile floor: stage 4 sees ≥ its kernel and stage 5 ≥ its kernel after the upsample → (6, 6, 6)."""
        return tuple(max(k4, _ceil_div(k5, s)) for k4, k5, s in
                     zip(self.stage_kernels[-1], self.stage5_kernel, self.upsample_strides[-1]))

    @property
    def latent_floor(self) -> THW:
        """Smallest latent every stage's neighborhood fits in (smaller latents are edge-padded) → (3, 7, 7)."""
        floor = [1, 1, 1]
        scale = [1, 1, 1]
        for kernel, stride in zip((*self.stage_kernels, self.stage5_kernel), (*self.upsample_strides, None)):
            floor = [max(f, _ceil_div(k, s)) for f, k, s in zip(floor, kernel, scale)]
            if stride is not None:
                scale = [a * b for a, b in zip(scale, stride)]
        return tuple(floor)

    def stage4_grid(self, latent_thw: THW) -> THW:
        """Stage-4 input grid of a latent (T, H, W) through upsamples 1-3 → (4T−3, 4H, 4W)."""
        t, h, w = latent_thw
        for st, sh, sw in self.upsample_strides[:-1]:
            t, h, w = upsample_frames(t, st), h * sh, w * sw
        return t, h, w

    def pre_upsample_grid(self, latent_thw: THW) -> THW:
        """Grid before the third upsample, where the resident features live (1/8 of the stage-4 grid)."""
        t, h, w = latent_thw
        for st, sh, sw in self.upsample_strides[:-2]:
            t, h, w = upsample_frames(t, st), h * sh, w * sw
        return t, h, w

    def canvas(self, latent_thw: THW) -> THW:
        """Pixels (F, H, W) of a latent: 8(T−1)+1 frames, 32H × 32W."""
        t4, h4, w4 = self.stage4_grid(latent_thw)
        ct, ch, cw = self.cell_pixels
        return upsample_frames(t4, ct), h4 * ch, w4 * cw

    @functools.lru_cache(maxsize=4096)
    def slab_trace(self, start: int, stop: int,
                   total: int) -> tuple[tuple[int, int], tuple[tuple[str, int, int, int], ...]]:
        """The arithmetic of `compat.stages_1_to_3_slab` on ghosted-latent frames `[start, stop)` of `total`: the
        pre-upsample frames `(first, end)` it computes exactly, and `(kind, stage, frames in, frames out)` per
        "block" and per "upsample", what the memory model prices. A block's frames in may fall
        under its kernel: `slab_fits` says whether the slab can run at all."""
        cut_before, cut_after = start > 0, stop < total
        t, first, steps = stop - start, start, []
        for stage in range(3):
            reach = self.stage_kernels[stage][0] // 2
            for _ in range(self.stage_depths[stage]):
                trimmed = t - reach * (cut_before + cut_after)
                steps.append(("block", stage, t, t))
                t, first = trimmed, first + (reach if cut_before else 0)
            if stage < 2:
                stride = self.upsample_strides[stage][0]
                out = upsample_frames(t, stride, drop_leading=first == 0)
                steps.append(("upsample", stage, t, out))
                first = max(2 * first - 1, 0) if stride == 2 else first
                t = out
        return (first, first + t), tuple(steps)

    def slab_fits(self, start: int, stop: int, total: int) -> bool:
        """Every block of the slab sees at least its kernel's frames (NATTEN refuses less) and something is left."""
        (first, end), steps = self.slab_trace(start, stop, total)
        blocks = [(stage, t_in) for kind, stage, t_in, _ in steps if kind == "block"]
        return end > first and all(t_in >= self.stage_kernels[stage][0] for stage, t_in in blocks)

    @functools.lru_cache(maxsize=4096)
    def slab_for_pre(self, pre_frames: tuple[int, int], total: int) -> tuple[int, int]:
        """The smallest ghosted-latent slab `[start, stop)` whose exact output covers pre-upsample frames
        `pre_frames`, widened until every block sees its kernel."""
        p0, p1 = pre_frames
        start = next(a for a in range(min(p0, total - 1), -1, -1)
                     if self.slab_trace(a, total, total)[0][0] <= p0)
        stop = next(b for b in range(start + 1, total + 1) if self.slab_trace(0, b, total)[0][1] >= p1)
        while not self.slab_fits(start, stop, total) and (start > 0 or stop < total):
            start, stop = max(start - 1, 0), min(stop + 1, total)
        return start, stop


@dataclass(frozen=True)
class AxisSpan:
    """One tile along one axis: content cells on the stage-4 grid, the pixels they decode to, blend ramps."""
    cells: tuple[int, int]
    pixels: tuple[int, int]
    ramps: tuple[int, int]  # pixel lengths of the left fade-in and right fade-out

    @property
    def length(self) -> int:
        return self.pixels[1] - self.pixels[0]

    def weights(self) -> torch.Tensor:
        """Trapezoid `[length]` float32: ramps of k/(r+1), so two overlapping ramps sum to exactly one. Tiles are
        at least twice the overlap long (`build_schedule`), so a span's two ramps never meet."""
        return ramp_weights(self.length, *self.ramps).float()


@dataclass(frozen=True)
class Tile:
    index: int
    t: AxisSpan
    h: AxisSpan
    w: AxisSpan
    feature_frames: tuple[int, int]  # stage-4 input frames to slice (the trailing tile also takes the ghosts)

    @property
    def is_origin(self) -> bool:
        """Holds t=0: only this tile drops the temporal upsample's duplicate leading frame."""
        return self.t.cells[0] == 0

    @property
    def pixel_shape(self) -> THW:
        return self.t.length, self.h.length, self.w.length


@dataclass(frozen=True)
class TileSchedule:
    geometry: TilingGeometry
    latent_thw: THW                  # content latent (T, H, W)
    work_thw: THW                    # after the all-stage floor pad
    latent_pad: tuple[int, int, int]  # latent cells added: frames after, rows before, columns before
    overlap: tuple[int, int]         # frames, pixels (0 on an untiled axis)
    spans: tuple[tuple[AxisSpan, ...], tuple[AxisSpan, ...], tuple[AxisSpan, ...]]
    # Stages 1-3: None = once on the whole clip; else per temporal group, this many pre-upsample frames per slab
    pre_chunk: int | None = None

    @property
    def grid(self) -> THW:
        return tuple(len(s) for s in self.spans)

    @property
    def tile_count(self) -> int:
        return math.prod(self.grid)

    @property
    def is_tiled(self) -> bool:
        return self.tile_count > 1

    @property
    def canvas(self) -> THW:
        return self.geometry.canvas(self.work_thw)

    @property
    def content(self) -> tuple[slice, slice, slice]:
        """Where the content video sits in the padded canvas (frames pad trails; rows/columns pad both sides)."""
        frames, height, width = self.geometry.canvas(self.latent_thw)
        top, left = (p * VIDEO_FACTORS[1] for p in self.latent_pad[1:])
        return slice(0, frames), slice(top, top + height), slice(left, left + width)

    def content_part(self, tile: Tile) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """The tile's pixels inside the content (canvas coordinates): (frames, rows, columns) as [start, stop)."""
        return tuple((max(span.pixels[0], box.start), min(span.pixels[1], box.stop))
                     for span, box in zip((tile.t, tile.h, tile.w), self.content))

    @property
    def feature_frames(self) -> int:
        """Stage-4 input frames including the ghosts."""
        return self.geometry.stage4_grid(self.work_thw)[0] + self.geometry.ghost_cells

    @property
    def ghosted_frames(self) -> int:
        """Latent frames stages 1-3 see: the work latent and its trailing ghosts."""
        return self.work_thw[0] + self.geometry.ghost_latent_frames

    def group_pre_frames(self, span: AxisSpan) -> tuple[int, int]:
        """Pre-upsample frames a temporal group's stage-4 inputs are cut from (the arithmetic of `stage4_input`)."""
        last_cell = self.geometry.stage4_grid(self.work_thw)[0]
        c0, c1 = span.cells[0], self.feature_frames if span.cells[1] == last_cell else span.cells[1]
        stride = self.geometry.upsample_strides[2][0]
        lead = 1 if stride == 2 else 0
        return (c0 + lead) // stride, (c1 - 1 + lead) // stride + 1

    def pre_slabs(self, span: AxisSpan) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """(pre-upsample frames, ghosted-latent slab computing them) for a group, `pre_chunk` frames at a time."""
        p0, p1 = self.group_pre_frames(span)
        chunks = [(q, min(q + self.pre_chunk, p1)) for q in range(p0, p1, self.pre_chunk)]
        return [(chunk, self.geometry.slab_for_pre(chunk, self.ghosted_frames)) for chunk in chunks]

    def tiles(self) -> list[Tile]:
        """All tiles, time slowest (so each temporal group is contiguous)."""
        last_cell = self.geometry.stage4_grid(self.work_thw)[0]
        # The reference keeps ≥ the stage-5 kernel of frames when it crops the ghosts again; with odd kernels
        # the tile floor (≥ ceil(k5 / 2) cells → ≥ k5 frames) makes that unreachable: the crop is the tile length.
        return [Tile(i, t, h, w, (t.cells[0], self.feature_frames if t.cells[1] == last_cell else t.cells[1]))
                for i, (t, h, w) in enumerate(itertools.product(*self.spans))]

    def groups(self) -> list[tuple[AxisSpan, tuple[int, int]]]:
        """Temporal groups: (span, pixel frames this group finalizes). A group's frames up to the next group's
        start are final once it is blended; its tail waits for the next group's ramp."""
        spans = self.spans[0]
        out = []
        for i, span in enumerate(spans):
            end = spans[i + 1].pixels[0] if i + 1 < len(spans) else span.pixels[1]
            out.append((span, (span.pixels[0], end)))
        return out


def _spans(cuts: Sequence[tuple[int, int]], cell: int, causal: bool) -> tuple[AxisSpan, ...]:
    """Cells → pixels. Spatially ×cell. Temporally (causal ×2 upsample): the origin tile drops its duplicate
    leading frame and every other tile keeps it, so a non-origin tile starts one pixel frame *before* 2·start and
    the end is 2·end − 1 — the causal 1-then-2 frame mapping of the latent space."""
    spans = []
    for i, (start, end) in enumerate(cuts):
        left = (cuts[i - 1][1] - start) * cell if i > 0 else 0
        right = (end - cuts[i + 1][0]) * cell if i + 1 < len(cuts) else 0
        if causal and cell == 2:
            pixels = (start * 2 - (1 if start > 0 else 0), end * 2 - 1)
        else:
            pixels = (start * cell, end * cell)
        spans.append(AxisSpan((start, end), pixels, (left, right)))
    return tuple(spans)


def floor_pad(geometry: TilingGeometry, latent_thw: THW) -> tuple[THW, tuple[int, int, int]]:
    """Work latent after the all-stage floor pad, and the cells added (frames after, rows/columns before).
    Frames repeat the last one; rows/columns edge-replicate on both sides (the odd one after)."""
    floor = geometry.latent_floor
    work = tuple(max(n, f) for n, f in zip(latent_thw, floor))
    pads = [w - n for w, n in zip(work, latent_thw)]
    return work, (pads[0], pads[1] // 2, pads[2] // 2)


def build_schedule(geometry: TilingGeometry, latent_thw: THW, tile_frames: int | None = None,
                   tile_pixels: int | tuple[int, int] | None = None, overlap_frames: int | None = None,
                   overlap_pixels: int | None = None) -> TileSchedule:
    """The schedule for a latent `(T, H, W)`: `None` tile sizes leave an axis whole (untiled = one tile).

    Tile sizes are output frames/pixels (multiples of 8/32); overlaps default to the smallest safe ones
    (`geometry.min_overlap`) and smaller ones are refused.
    """
    min_frames, min_pixels = geometry.min_overlap
    overlap_frames = min_frames if overlap_frames is None else overlap_frames
    overlap_pixels = min_pixels if overlap_pixels is None else overlap_pixels
    if overlap_frames < min_frames or overlap_pixels < min_pixels:
        raise LTX25Error(WHERE, "the tile overlap", f"{overlap_frames} frames / {overlap_pixels} px",
                         f"at least {min_frames} frames / {min_pixels} px",
                         "The decoder's receptive field reaches that far past a tile edge; a smaller overlap "
                         "leaves visible seams.")
    if isinstance(tile_pixels, int):
        tile_pixels = (tile_pixels, tile_pixels)
    sizes = (tile_frames, *(tile_pixels or (None, None)))
    overlaps = (overlap_frames, overlap_pixels, overlap_pixels)
    work, pad = floor_pad(geometry, latent_thw)
    grid = geometry.stage4_grid(work)
    cell = geometry.cell_pixels
    spans = []
    for axis, (size, overlap, n, c, floor, factor) in enumerate(
            zip(sizes, overlaps, grid, cell, geometry.min_tile_cells, VIDEO_FACTORS)):
        name = ("tile_frames", "tile_pixels", "tile_pixels")[axis]
        if size is None or size // c >= n:
            spans.append(_spans([(0, n)], c, axis == 0))
            continue
        if size % factor or size < 2 * overlap or size // c < floor:
            low = max(2 * overlap, _round_up(floor * c, factor))
            raise LTX25Error(WHERE, name, size, f"a multiple of {factor} and at least {low}",
                             f"Each tile needs room for two {overlap}-{'frame' if axis == 0 else 'pixel'} blend "
                             "ramps and the decoder's smallest window.")
        spans.append(_spans(axis_cuts(n, size // c, overlap // c, floor), c, axis == 0))
    tiled = [len(s) > 1 for s in spans]
    used_overlap = (overlap_frames if tiled[0] else 0, overlap_pixels if tiled[1] or tiled[2] else 0)
    return TileSchedule(geometry, tuple(latent_thw), work, pad, used_overlap, tuple(spans))


# ------------------------------------------------------------------------------------------- memory and auto
EMIT_FRAMES = 8  # frames of a tile converted to float32 (and weighted) at once on their way to the output
# Tensors of a stage's width alive per token at its peak (docs/PERFORMANCE.md, "The diffusion decoder's memory").
# The lean blocks (`fused_block`, with the triton processor) update the hidden state in place, a chunk of rows at a
# time: at stage 5 the context, the hidden state and q|k|v (the attention is written over q); at stages 1-4 the
# hidden state and q|k|v. diffusers' blocks also hold the caller's previous hidden state, the attention input, the
# unrotated q, k, v, a normed copy and a float32 copy during the rotation (stage 5: 12 with the context); stages 1-4
# then 11 with the block's input, which the caller keeps.
LEAN_STAGE5_LIVE = 5.0
DIFFUSERS_STAGE5_LIVE = 12.0
LEAN_DET_LIVE = 4.0
DET_LIVE = 11.0
DIFFUSERS_SWIGLU_ROWS = 16384  # rows per tile of diffusers' SwiGLU (three hidden-width temporaries per tile)


@dataclass(frozen=True)
class MemoryModel:
    """Peak device bytes of a decode beyond its weights, counted from the tensors each phase keeps alive
    (docs/PERFORMANCE.md, "The diffusion decoder's memory"). Widths are per token of the stage they belong to.

    A decode runs stages 1-3 (once, or per temporal group in slabs), then per tile stage 4 and stage 5, and hands
    each tile's pixels straight to the output frames (host memory unless `frames_on_device`): no blend buffer.
    The peak is the largest phase plus what lives through it (the resident stage-3 features)."""
    element_bytes: int = 2             # bf16 activations
    batch: int = 1
    stage5_live: float = DIFFUSERS_STAGE5_LIVE   # stage-5-wide tensors per stage-5 token at stage 5's peak
    det_live: float = DET_LIVE         # stage-wide tensors per token at a deterministic block's peak (stages 1-4)
    chunk_elements: int = 0            # the lean blocks' chunk (`fused_block.CHUNK_ELEMENTS`; 0: diffusers' blocks)
    processor_scratch: int = 0         # bytes a processor adds per call (the sdpa gather chunk)
    frames_on_device: bool = False     # the output frames (float32) are kept on the decode's device
    constant_bytes: int = 128 << 20    # SwiGLU tile, time embedding, RoPE tables, one-hot masks, allocator slack

    def det_block(self, tokens: int, channels: int) -> int:
        """Values alive in a deterministic block: its attention's `det_live` tensors (and a chunk), or its MLP: the
        hidden state, the normed input and output of one piece, and three hidden-width temporaries per row (lean:
        chunks of `chunk_elements` values; diffusers: its fixed tile)."""
        hidden = (4 * channels + 15) // 16 * 16
        if self.chunk_elements:  # MLP pieces of `chunk_elements` hidden-width values: normed input, output, 3 wide
            rows = min(tokens, max(1, self.chunk_elements // hidden))
            return int(max(tokens * channels * self.det_live + min(self.chunk_elements, tokens * channels),
                           tokens * channels + rows * (2 * channels + 3 * hidden)))
        return int(max(tokens * channels * self.det_live,
                       3 * tokens * channels + 3 * min(tokens, DIFFUSERS_SWIGLU_ROWS) * hidden))

    def stages_1_to_3(self, g: TilingGeometry, work_thw: THW) -> int:
        """Stages 1-3 on the whole clip: the largest block working set or upsample (input + projection + shuffle)."""
        t, h, w = work_thw[0] + g.ghost_latent_frames, *work_thw[1:]
        peak = 0
        for s in range(3):
            n = t * h * w
            peak = max(peak, self.det_block(n, g.stage_channels[s]))
            if s < 2:  # the third upsample is deferred to the tiles
                st, sh, sw = g.upsample_strides[s]
                t, h, w = upsample_frames(t, st), h * sh, w * sw
                peak = max(peak, n * g.stage_channels[s] + 2 * t * h * w * g.stage_channels[s + 1])
        return int(self.batch * peak * self.element_bytes)

    @functools.lru_cache(maxsize=4096)
    def slab(self, g: TilingGeometry, work_thw: THW, slab: tuple[int, int], total: int) -> int:
        """Stages 1-3 on one slab of ghosted-latent frames: as `stages_1_to_3`, at the frames each step sees."""
        hw = [work_thw[1] * work_thw[2]]
        for _, sh, sw in g.upsample_strides[:2]:
            hw.append(hw[-1] * sh * sw)
        peak = 0
        for kind, stage, t_in, t_out in g.slab_trace(*slab, total)[1]:
            n = t_in * hw[stage]
            if kind == "block":
                peak = max(peak, self.det_block(n, g.stage_channels[stage]))
            else:
                peak = max(peak, n * g.stage_channels[stage] + 2 * t_out * hw[stage + 1] * g.stage_channels[stage + 1])
        return int(self.batch * peak * self.element_bytes)

    def pre_frames(self, g: TilingGeometry, work_thw: THW, frames: int) -> int:
        """Bytes of `frames` pre-upsample frames (the features stage 4 is cut from)."""
        _, h, w = g.pre_upsample_grid(work_thw)
        return self.batch * frames * h * w * g.stage_channels[2] * self.element_bytes

    def resident(self, g: TilingGeometry, work_thw: THW) -> int:
        t, h, w = g.pre_upsample_grid((work_thw[0] + g.ghost_latent_frames, *work_thw[1:]))
        return self.batch * t * h * w * g.stage_channels[2] * self.element_bytes

    def tile(self, g: TilingGeometry, cells: THW, ghosts: bool, pixels: THW) -> int:
        """Peak while one tile of `cells` stage-4 cells (+ the ghost cells when it is the last in time), decoding
        to `pixels` (frames, rows, columns), runs:
        - stage 4: its blocks (`det_block`), or the last upsample: the blocks' output, the projection and its
          shuffled copy (the ghost cells are cut before it);
        - stage 5 at its peak: `stage5_live` tensors of its width per token (the context among them), the start
          noise (3·p² values per token) and one chunk;
        - the hand-off: the tile's pixels and one float32 piece of `EMIT_FRAMES` frames (weighted copy + weights).
        """
        c4, c5, p = g.stage_channels[3], g.stage_channels[4], g.patch_size
        n4 = (cells[0] + (g.ghost_cells if ghosts else 0)) * cells[1] * cells[2]
        n5_full = math.prod(cells) * math.prod(g.upsample_strides[-1])  # the upsample's output before any crop
        n5 = pixels[0] * (pixels[1] // p) * (pixels[2] // p)
        stage4 = max(self.det_block(n4, c4), n4 * c4 + 2 * n5_full * c5)
        stage5 = n5 * c5 * self.stage5_live + n5 * 3 * p * p + min(self.chunk_elements, n5 * c5)
        emit = (self.batch * n5 * 3 * p * p * self.element_bytes
                + min(EMIT_FRAMES, pixels[0]) * pixels[1] * pixels[2] * (self.batch * 3 * 4 + 4))
        return int(max(self.batch * max(stage4, stage5) * self.element_bytes, emit))

    def frames(self, schedule: "TileSchedule") -> int:
        """The float32 output frames, when they are kept on the decode's device."""
        if not self.frames_on_device:
            return 0
        frames, rows, cols = schedule.content
        return self.batch * frames.stop * (rows.stop - rows.start) * (cols.stop - cols.start) * 3 * 4

    def estimate(self, schedule: "TileSchedule") -> int:
        g, work = schedule.geometry, schedule.work_thw
        last = g.stage4_grid(work)[0]
        cells = tuple(max(s.cells[1] - s.cells[0] for s in axis) for axis in schedule.spans)
        pixels = tuple(max(s.length for s in axis) for axis in schedule.spans)
        trailing = schedule.spans[0][-1]
        # the last temporal tile carries the ghost cells through stage 4: it may be the largest there
        tile = max(self.tile(g, cells, False, pixels),
                   self.tile(g, (trailing.cells[1] - trailing.cells[0], *cells[1:]), True, pixels)) \
            if trailing.cells[1] == last else self.tile(g, cells, False, pixels)
        if schedule.pre_chunk is None:
            stages = self.stages_1_to_3(g, work)
            resident = self.resident(g, work)
        else:
            resident, stages = self.slabbed(dataclasses.replace(schedule, spans=(schedule.spans[0], (), ())))
        return max(stages, resident + tile) + self.frames(schedule) + self.processor_scratch + self.constant_bytes

    @functools.lru_cache(maxsize=4096)
    def slabbed(self, temporal: "TileSchedule") -> tuple[int, int]:
        """(a group's features, the peak while its slabs run beside them) of a schedule with stages 1-3 in slabs,
        given with its temporal spans only (all the slabs depend on; the planner tries many spatial tilings of
        each)."""
        g, work = temporal.geometry, temporal.work_thw
        resident = self.pre_frames(g, work, max(b - a for a, b in map(temporal.group_pre_frames, temporal.spans[0])))
        slabs = {slab for span in temporal.spans[0] for _, slab in temporal.pre_slabs(span)}
        return resident, resident + max(self.slab(g, work, slab, temporal.ghosted_frames) for slab in slabs)


def _candidates(n_cells: int, cell: int, factor: int, low: int) -> list[int]:
    """Tile sizes (output units) on the latent grid from `low` up to the whole axis (`None` = untiled)."""
    whole = n_cells * cell
    sizes = list(range(_round_up(low, factor), whole, factor))
    return [s for s in sizes if s // cell < n_cells] + [None]


def _slabbed(schedules: Iterable[TileSchedule]) -> Iterator[TileSchedule]:
    """Each schedule with stages 1-3 in slabs of its longest group's pre-upsample frames, then halved down to one."""
    for schedule in schedules:
        chunk = max(b - a for a, b in map(schedule.group_pre_frames, schedule.spans[0]))
        while True:
            yield dataclasses.replace(schedule, pre_chunk=chunk)
            if chunk == 1:
                break
            chunk = (chunk + 1) // 2


def _search(geometry: TilingGeometry, latent_thw: THW, budget_bytes: int, memory: MemoryModel,
            overlap_frames: int | None, overlap_pixels: int | None) -> tuple[TileSchedule | None, TileSchedule]:
    """(`plan_auto`'s pick or None, the candidate of least estimate): whole-clip stages 1-3 first, slabs only when
    no whole-clip schedule fits."""
    min_frames, min_pixels = geometry.min_overlap
    overlaps = (min_frames if overlap_frames is None else overlap_frames,
                min_pixels if overlap_pixels is None else overlap_pixels)
    work, _ = floor_pad(geometry, latent_thw)
    grid = geometry.stage4_grid(work)
    cell = geometry.cell_pixels
    lows = [max(2 * o, f * c) for o, f, c in zip((*overlaps, overlaps[1]), geometry.min_tile_cells, cell)]
    options = [_candidates(n, c, f, low) for n, c, f, low in zip(grid, cell, VIDEO_FACTORS, lows)]
    unique = math.prod(grid)

    def schedules():
        for tf, th, tw in itertools.product(*options):
            if th != tw and None not in (th, tw):
                continue  # square spatial tiles (one widget, as in manual mode) keep the search small
            yield build_schedule(geometry, latent_thw, tf, (th, tw) if (th or tw) else None, *overlaps)

    def waste(schedule: TileSchedule) -> tuple:
        cells = [max(s.cells[1] - s.cells[0] for s in axis) for axis in schedule.spans]
        processed = math.prod(sum(s.cells[1] - s.cells[0] for s in axis) for axis in schedule.spans)
        return processed / unique, schedule.tile_count, -math.prod(cells)

    best, smallest = search_budget(schedules(), memory.estimate, budget_bytes, waste)
    if best is None:
        best, thinnest = search_budget(_slabbed(schedules()), memory.estimate, budget_bytes,
                                       lambda s: (*waste(s), -s.pre_chunk))
        smallest = min((smallest, thinnest), key=memory.estimate)
    return best, smallest


class BudgetTooSmall(LTX25Error):
    """`plan_auto`'s refusal: no tiles fit the budget. A caller with somewhere else to decode (after evicting a
    model) tells it from the other errors by its type."""


def plan_auto(geometry: TilingGeometry, latent_thw: THW, budget_bytes: int,
              memory: MemoryModel = MemoryModel(), overlap_frames: int | None = None,
              overlap_pixels: int | None = None) -> TileSchedule:
    """The schedule with the least recomputed overlap whose estimated peak fits `budget_bytes`, with the given
    overlaps (default: the smallest safe ones, as in `build_schedule`).

    The whole video as one tile wastes nothing, so it wins whenever it fits: `auto` tiles only when it must. Stages
    1-3 run once on the whole clip whenever some schedule fits that way (so a decode that fit before is unchanged);
    only otherwise do they run per temporal group in slabs (`pre_chunk`), whose floor does not grow with the clip.
    """
    best, smallest = _search(geometry, latent_thw, budget_bytes, memory, overlap_frames, overlap_pixels)
    if best is None:
        raise BudgetTooSmall(WHERE, "the memory budget", f"{budget_bytes / 2**30:.2f} GiB",
                         f"at least {memory.estimate(smallest) / 2**30:.2f} GiB for the smallest legal tiles",
                         "Free device memory, raise memory_budget_gb, or decode a smaller video.")
    return best


def smallest_schedule(geometry: TilingGeometry, latent_thw: THW, memory: MemoryModel = MemoryModel(),
                      overlap_frames: int | None = None, overlap_pixels: int | None = None) -> TileSchedule:
    """The candidate of least estimated peak: its estimate is the smallest budget `plan_auto` accepts (the
    decode's floor)."""
    return _search(geometry, latent_thw, -1, memory, overlap_frames, overlap_pixels)[1]
