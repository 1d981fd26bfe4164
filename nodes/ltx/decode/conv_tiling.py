"""Tile geometry for the conv video decoder (docs/MODEL.md §9.4): pure functions of plain numbers.

Tiles are cut in LATENT space with overlap, each is decoded on its own, and the decoded tiles are blended in pixel
space with trapezoid weights that are normalized to a partition of unity (they sum to exactly one at every pixel),
so an overlap fades from one tile to the next instead of showing a seam.

Time is causal. The decoder turns the FIRST latent frame it is given into one frame and every later latent frame
into eight, so a temporal tile of latent frames [a, b) with a > 0 yields 8(b−a−1)+1 frames, and its first frame
(global frame 8a) is a spurious "first frame" made from latent a alone. That frame gets weight 0 (it is dropped) and
the previous tile must cover it: temporal tiles overlap by at least ONE latent frame, and every further latent frame
of overlap adds eight blended frames. The reference tiler does the same by shifting each later tile back one latent
frame and starting its ramp at zero.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Iterator

import torch

SPATIAL_SCALE = 32          # pixels per latent cell (patch 4 × three 2× spatial upsamplers)
TEMPORAL_SCALE = 8          # pixel frames per latent frame after the first
MODES = ("auto", "off", "manual")
MIN_SPATIAL_TILE = 2        # latent cells (64 px): smaller tiles are mostly border
Interval = tuple[int, int]  # [start, stop) on one latent axis


def pixel_frames(latent_frames: int) -> int:
    """F' latent frames → F = 8(F'−1)+1 pixel frames."""
    return TEMPORAL_SCALE * (latent_frames - 1) + 1


@dataclass(frozen=True)
class TilingRequest:
    """What the user asked for. Sizes are in pixels and frames; `auto` picks sizes but keeps these overlaps.

    temporal_tile: frames per temporal tile (rounded down to a multiple of 8, plus the causal first frame);
    temporal_overlap: blended frames between temporal tiles (a multiple of 8; one more latent frame is shared
    and its spurious first frame dropped, see the module docstring). Reference defaults: 768/64 px, 80/24 frames.
    """
    mode: str = "auto"
    spatial_tile: int = 768
    spatial_overlap: int = 64
    temporal_tile: int = 80
    temporal_overlap: int = 24

    def latent_overlaps(self) -> tuple[int, int]:
        """(spatial overlap in cells, temporal overlap in latent frames ≥ 1)."""
        return self.spatial_overlap // SPATIAL_SCALE, self.temporal_overlap // TEMPORAL_SCALE + 1

    def latent_tiles(self) -> tuple[int, int]:
        """(spatial tile in cells, temporal tile in latent frames) for `manual`."""
        spatial_overlap, temporal_overlap = self.latent_overlaps()
        return (max(MIN_SPATIAL_TILE, spatial_overlap + 1, self.spatial_tile // SPATIAL_SCALE),
                max(temporal_overlap + 1, self.temporal_tile // TEMPORAL_SCALE + 1))

    def problem(self) -> tuple[str, object, str] | None:
        """(field, value, expected) of the first unusable value, or None."""
        if self.mode not in MODES:
            return "tiling", self.mode, " / ".join(MODES)
        for name in ("spatial_tile", "spatial_overlap", "temporal_tile", "temporal_overlap"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 0:
                return name, getattr(self, name), "a whole number ≥ 0"
        if self.mode == "manual" and self.spatial_overlap >= self.spatial_tile:
            return "spatial_overlap", self.spatial_overlap, f"less than spatial_tile ({self.spatial_tile})"
        if self.mode == "manual" and self.temporal_overlap >= self.temporal_tile:
            return "temporal_overlap", self.temporal_overlap, f"less than temporal_tile ({self.temporal_tile})"
        return None


def axis_tiles(length: int, tile: int, overlap: int) -> tuple[Interval, ...]:
    """Cover [0, length) with tiles of `tile` that overlap by at least `overlap`.

    Tiles advance by `tile − overlap`; the last one is moved left to end exactly at `length` (a full-size tile with
    a wider overlap instead of a short remnant, which would be mostly border). One tile when `tile ≥ length`.
    """
    if tile >= length:
        return ((0, length),)
    if not 0 <= overlap < tile:
        raise ValueError(f"overlap {overlap} must be in [0, tile={tile})")
    starts = list(range(0, length - tile, tile - overlap)) + [length - tile]
    return tuple((s, s + tile) for s in starts)


def spatial_pixels(interval: Interval) -> Interval:
    return interval[0] * SPATIAL_SCALE, interval[1] * SPATIAL_SCALE


def temporal_pixels(interval: Interval) -> Interval:
    """Latent frames [a, b) → the global pixel frames the decoded tile covers, [8a, 8(b−1)+1); for a > 0 the first
    of them is the spurious causal frame (weight 0)."""
    a, b = interval
    return (0 if a == 0 else TEMPORAL_SCALE * a), TEMPORAL_SCALE * (b - 1) + 1


def blend_weights(ranges: list[Interval], length: int, drop_first: list[bool] | None = None) -> list[torch.Tensor]:
    """Per-tile 1-D weights (float32, one per pixel of the tile) that sum to exactly one at every pixel of [0, length).

    Each tile ramps up across its overlap with the previous tile and down across its overlap with the next one —
    the same region, so a pair sums to one by construction: weights (k+1)/(R+1) and (R−k)/(R+1) over R shared
    pixels. Where three tiles meet, or a tile has no partner, dividing by the sum keeps the partition of unity.
    A tile whose first pixel is dropped (the causal frame) gives it weight 0 and starts its ramp after it.
    """
    drop_first = drop_first or [False] * len(ranges)
    valid_start = [s + int(d) for (s, _), d in zip(ranges, drop_first)]
    raw = []
    for i, (start, stop) in enumerate(ranges):
        w = torch.ones(stop - start, dtype=torch.float64)
        if drop_first[i]:
            w[0] = 0.0
        if i > 0 and ranges[i - 1][1] > valid_start[i]:        # ramp up across the overlap with the previous tile
            r = ranges[i - 1][1] - valid_start[i]
            offset = valid_start[i] - start
            w[offset:offset + r] *= torch.arange(1, r + 1, dtype=torch.float64) / (r + 1)
        if i + 1 < len(ranges) and stop > valid_start[i + 1]:  # ramp down across the overlap with the next tile
            r = stop - valid_start[i + 1]
            offset = valid_start[i + 1] - start
            w[offset:offset + r] *= torch.arange(r, 0, -1, dtype=torch.float64) / (r + 1)
        raw.append(w)
    total = torch.zeros(length, dtype=torch.float64)
    for (start, stop), w in zip(ranges, raw):
        total[start:stop] += w
    if bool((total <= 0).any()):
        gap = int(torch.nonzero(total <= 0)[0])
        raise ValueError(f"tiles leave pixel {gap} of {length} uncovered")
    return [(w / total[start:stop]).float() for (start, stop), w in zip(ranges, raw)]


@dataclass(frozen=True)
class CostModel:
    """Device bytes of a decode: `decoder_bytes` per output voxel of the tile being decoded (activations) plus
    `buffer_bytes` per voxel of the full-frame group buffer (fp32 RGB of every frame of the current temporal tile)."""
    decoder_bytes: float
    buffer_bytes: float = 12.0

    def tile_group_bytes(self, tile_fhw: tuple[int, int, int], group_fhw: tuple[int, int, int]) -> int:
        return int(self.decoder_bytes * tile_fhw[0] * tile_fhw[1] * tile_fhw[2]
                   + self.buffer_bytes * group_fhw[0] * group_fhw[1] * group_fhw[2])


@dataclass(frozen=True)
class TilePlan:
    """Latent intervals per axis for a `[B, C, F', H', W']` latent; tiles are their product, time-major."""
    latent_shape: tuple[int, int, int]            # (F', H', W')
    frames: tuple[Interval, ...]
    rows: tuple[Interval, ...]
    cols: tuple[Interval, ...]
    reason: str
    estimate_bytes: int = 0
    carried_frames: int = 0                       # overlap frames kept on the device from one group to the next
    weights: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def count(self) -> int:
        return len(self.frames) * len(self.rows) * len(self.cols)

    @property
    def tiled(self) -> bool:
        return self.count > 1

    @property
    def pixel_shape(self) -> tuple[int, int, int]:
        f, h, w = self.latent_shape
        return pixel_frames(f), h * SPATIAL_SCALE, w * SPATIAL_SCALE

    def tiles(self) -> Iterator[tuple[Interval, Interval, Interval]]:
        """(frames, rows, cols) latent intervals, every spatial tile of one temporal tile before the next."""
        return itertools.product(self.frames, self.rows, self.cols)

    def tile_pixel_sizes(self) -> list[tuple[int, int, int]]:
        """(frames, height, width) in pixels per tile, in `tiles()` order."""
        sizes = []
        for t, r, c in self.tiles():
            t0, t1 = temporal_pixels(t)
            sizes.append((t1 - t0, (r[1] - r[0]) * SPATIAL_SCALE, (c[1] - c[0]) * SPATIAL_SCALE))
        return sizes

    def axis_weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """(temporal, row, column) blend weights per interval, computed once per plan."""
        if not self.weights:
            frames, height, width = self.pixel_shape
            self.weights["t"] = blend_weights([temporal_pixels(t) for t in self.frames], frames,
                                              [t[0] > 0 for t in self.frames])
            self.weights["h"] = blend_weights([spatial_pixels(r) for r in self.rows], height)
            self.weights["w"] = blend_weights([spatial_pixels(c) for c in self.cols], width)
        return self.weights["t"], self.weights["h"], self.weights["w"]


def _layout(latent_shape: tuple[int, int, int], temporal: tuple[int, int], spatial: tuple[int, int], reason: str,
            cost: CostModel) -> TilePlan:
    """The plan for (tile, overlap) per axis, with the device-memory estimate of its largest tile."""
    f, h, w = latent_shape
    frames = axis_tiles(f, *temporal)
    rows, cols = axis_tiles(h, *spatial), axis_tiles(w, *spatial)
    pixels = [temporal_pixels(t) for t in frames]
    group_frames = max(t1 - t0 for t0, t1 in pixels)
    # while a group is blended, the previous one's overlap with it waits on the device (decode_conv's carry): the
    # steady overlap of `temporal[1]` latent frames; a last tile shifted back further reads its extra from the host
    carried = TEMPORAL_SCALE * (temporal[1] - 1) + 1 if len(frames) > 1 else 0
    tile = (group_frames, max(b - a for a, b in rows) * SPATIAL_SCALE, max(b - a for a, b in cols) * SPATIAL_SCALE)
    estimate = cost.tile_group_bytes(tile, (group_frames + carried, h * SPATIAL_SCALE, w * SPATIAL_SCALE))
    return TilePlan(latent_shape, frames, rows, cols, reason, estimate, carried)


def tile_batch(plan: TilePlan, cost: CostModel, memory_budget: int | None) -> int:
    """How many spatial tiles of one temporal tile to decode as one batch: all of that group's tiles have one
    shape (`axis_tiles` cuts equal tiles), so they stack. As many as `memory_budget` holds beyond the plan's own
    estimate (None = all), the way ComfyUI's VAE decode batches as many items as free memory allows. Small tiles
    alone leave the GPU waiting on kernel launches: 1920×1088 in 512-px tiles of 3 latent frames is 15 such
    tiles per temporal tile."""
    spatial = len(plan.rows) * len(plan.cols)
    if spatial == 1 or memory_budget is None:
        return spatial
    frames, height, width = max(plan.tile_pixel_sizes())
    per_tile = cost.decoder_bytes * frames * height * width
    return int(min(spatial, max(1, (memory_budget - plan.estimate_bytes) // per_tile + 1)))


# auto never makes temporal tiles longer than this (latent frames; 121 pixel frames): longer ones save little
# recompute (overlap / tile) while the full-frame group buffer, fp32 RGB of every frame of the tile, grows with them.
MAX_AUTO_TEMPORAL_TILE = 16


def _steady_work(temporal: tuple[int, int], plan: TilePlan) -> float:
    """Decoded voxels per output voxel of a layout with the clip taken as endless in time: a temporal tile of t
    latent frames decodes 8(t−1)+1 frames and advances 8(t−overlap) — counted so even when this clip fits one
    tile, or 121 frames would rank differently from 241; rows and columns as actually cut."""
    tile, overlap = temporal
    frames = pixel_frames(tile) / (TEMPORAL_SCALE * (tile - overlap))
    rows, cols = (sum(b - a for a, b in cuts) / cuts[-1][1] for cuts in (plan.rows, plan.cols))
    return frames * rows * cols


def plan_tiles(latent_shape: tuple[int, int, int], request: TilingRequest, memory_budget: int | None,
               cost: CostModel) -> TilePlan:
    """The tiles for a latent of (F', H', W'), a pure function of its inputs.

    off: one tile. manual: the requested sizes. auto: one tile when its estimate fits `memory_budget` (None =
    ample); otherwise the tile shape with the least recompute that fits, temporal recompute counted as if the clip
    were endless (square spatial tiles, temporal tiles of at most MAX_AUTO_TEMPORAL_TILE latent frames, the
    requested overlaps), then cut to this clip. For clips at least that long the shape — and with the temporal
    groups streamed to the host, the device peak — does not depend on the length: ranking by the clip's own tile
    count gave a 241-frame clip whole-clip temporal tiles and a higher peak than a 121-frame one.
    Fit is judged on the clip's own tiles, so shorter clips may take larger spatial tiles. The smallest layout
    when nothing fits.
    """
    f, h, w = latent_shape
    if request.mode == "off":
        return _layout(latent_shape, (f, 0), (max(h, w), 0), "off: untiled", cost)
    spatial_overlap, temporal_overlap = request.latent_overlaps()
    if request.mode == "manual":
        spatial_tile, temporal_tile = request.latent_tiles()
        return _layout(latent_shape, (temporal_tile, temporal_overlap), (spatial_tile, spatial_overlap),
                       "manual", cost)
    untiled = _layout(latent_shape, (f, 0), (max(h, w), 0), "auto: the untiled decode fits", cost)
    if memory_budget is None or untiled.estimate_bytes <= memory_budget:
        return untiled
    lowest_spatial = max(MIN_SPATIAL_TILE, spatial_overlap + 1)
    spatial_sizes = range(max(h, w), lowest_spatial - 1, -1) if max(h, w) >= lowest_spatial else (max(h, w),)
    longest = max(MAX_AUTO_TEMPORAL_TILE, temporal_overlap + 1)
    best, smallest = None, None
    for spatial_tile in spatial_sizes:
        for temporal_tile in range(longest, temporal_overlap, -1):  # the longest that fits this spatial tile
            plan = _layout(latent_shape, (min(temporal_tile, f), temporal_overlap), (spatial_tile, spatial_overlap),
                           "", cost)
            if smallest is None or plan.estimate_bytes < smallest[0]:
                smallest = (plan.estimate_bytes, (temporal_tile, spatial_tile))
            if plan.estimate_bytes <= memory_budget:
                key = _steady_work((temporal_tile, temporal_overlap), plan)
                if best is None or key < best[0]:
                    best = (key, (temporal_tile, spatial_tile))
                break
    temporal_tile, spatial_tile = (best or smallest)[1]
    # as few temporal tiles as that shape needs here, each as short as that count allows: never larger than the
    # shape (so never above a long clip's peak), and a short clip does not decode long overlaps for nothing
    count = len(axis_tiles(f, temporal_tile, temporal_overlap))
    temporal_tile = next(t for t in range(temporal_overlap + 1, temporal_tile + 1)
                         if t >= f or len(axis_tiles(f, t, temporal_overlap)) <= count)
    plan = _layout(latent_shape, (temporal_tile, temporal_overlap), (spatial_tile, spatial_overlap), "", cost)
    fits = memory_budget is None or plan.estimate_bytes <= memory_budget
    reason = ("auto: the largest tiles that fit the free memory" if fits
              else "auto: the smallest tiles (even these exceed the free memory)")
    return dataclasses.replace(plan, reason=reason)
