"""Tile geometry for the conv video decoder (docs/MODEL.md §9.4): pure functions of plain numbers.

Tiles are cut in LATENT space with overlap, each is decoded on its own, and the decoded tiles are blended in pixel
space with the partition-of-unity weights of `tiling` (the request, cuts, ramps and budget search both decoders
share). The conv decoder's own parts are here: its causal first frame, its memory model and its tile stacking.

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

from ..device_memory import AMPLE_BYTES
from ..geometry import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION, pixel_frames, pixel_shape
from .tiling import Interval, TilingRequest, axis_cuts, blend_weights, search_budget

MIN_SPATIAL_TILE = 2        # latent cells (64 px): smaller tiles are mostly border


def latent_overlaps(request: TilingRequest) -> tuple[int, int]:
    """(spatial overlap in cells, temporal overlap in latent frames ≥ 1): `overlap_frames` blended frames (a
    multiple of 8) plus the one latent frame whose spurious first frame is dropped (see the module docstring)."""
    return request.overlap_pixels // SPATIAL_COMPRESSION, request.overlap_frames // TEMPORAL_COMPRESSION + 1


def latent_tiles(request: TilingRequest) -> tuple[int, int]:
    """(spatial tile in cells, temporal tile in latent frames) for `manual`: `tile_frames` rounded down to a multiple
    of 8, plus the causal first frame."""
    spatial_overlap, temporal_overlap = latent_overlaps(request)
    return (max(MIN_SPATIAL_TILE, spatial_overlap + 1, request.tile_pixels // SPATIAL_COMPRESSION),
            max(temporal_overlap + 1, request.tile_frames // TEMPORAL_COMPRESSION + 1))


def spatial_pixels(interval: Interval) -> Interval:
    return interval[0] * SPATIAL_COMPRESSION, interval[1] * SPATIAL_COMPRESSION


def temporal_pixels(interval: Interval) -> Interval:
    """Latent frames [a, b) → the global pixel frames the decoded tile covers, [8a, 8(b−1)+1); for a > 0 the first
    of them is the spurious causal frame (weight 0)."""
    a, b = interval
    return (0 if a == 0 else TEMPORAL_COMPRESSION * a), pixel_frames(b)


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
        return pixel_shape(self.latent_shape)

    def describe(self, name: str, budget_bytes: int | None = None) -> str:
        """One line for the user: untiled or the tile grid, why, and the expected peak against the budget."""
        frames, height, width = self.pixel_shape
        layout = "untiled" if not self.tiled else \
            f"{self.count} tiles ({len(self.frames)} × {len(self.rows)} × {len(self.cols)}: frames × rows × columns)"
        unbounded = budget_bytes is None or budget_bytes >= AMPLE_BYTES // 2  # derived from "no limit" (the CPU)
        budget = "" if unbounded else f" of {budget_bytes / 2**30:.2f} GiB available"
        return (f"{name}: {frames}×{height}×{width} {layout}, expected peak {self.estimate_bytes / 2**30:.2f} GiB"
                f"{budget} ({self.reason})")

    def tiles(self) -> Iterator[tuple[Interval, Interval, Interval]]:
        """(frames, rows, cols) latent intervals, every spatial tile of one temporal tile before the next."""
        return itertools.product(self.frames, self.rows, self.cols)

    def tile_pixel_sizes(self) -> list[tuple[int, int, int]]:
        """(frames, height, width) in pixels per tile, in `tiles()` order."""
        sizes = []
        for t, r, c in self.tiles():
            t0, t1 = temporal_pixels(t)
            sizes.append((t1 - t0, (r[1] - r[0]) * SPATIAL_COMPRESSION, (c[1] - c[0]) * SPATIAL_COMPRESSION))
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
    frames = axis_cuts(f, *temporal)
    rows, cols = axis_cuts(h, *spatial), axis_cuts(w, *spatial)
    pixels = [temporal_pixels(t) for t in frames]
    group_frames = max(t1 - t0 for t0, t1 in pixels)
    # while a group is blended, the previous one's overlap with it waits on the device (decode_conv's carry): the
    # steady overlap of `temporal[1]` latent frames; a last tile shifted back further reads its extra from the host
    carried = pixel_frames(temporal[1]) if len(frames) > 1 else 0
    tile = (group_frames, *(max(b - a for a, b in cuts) * SPATIAL_COMPRESSION for cuts in (rows, cols)))
    estimate = cost.tile_group_bytes(tile, (group_frames + carried, *pixel_shape(latent_shape)[1:]))
    return TilePlan(latent_shape, frames, rows, cols, reason, estimate, carried)


def tile_batch(plan: TilePlan, cost: CostModel, memory_budget: int | None) -> int:
    """How many spatial tiles of one temporal tile to decode as one batch: all of that group's tiles have one
    shape (`axis_cuts` cuts equal tiles), so they stack. As many as `memory_budget` holds beyond the plan's own
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
    frames = pixel_frames(tile) / (TEMPORAL_COMPRESSION * (tile - overlap))
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
    spatial_overlap, temporal_overlap = latent_overlaps(request)
    if request.mode == "manual":
        spatial_tile, temporal_tile = latent_tiles(request)
        return _layout(latent_shape, (temporal_tile, temporal_overlap), (spatial_tile, spatial_overlap),
                       "manual", cost)
    untiled = _layout(latent_shape, (f, 0), (max(h, w), 0), "auto: the untiled decode fits", cost)
    if memory_budget is None or untiled.estimate_bytes <= memory_budget:
        return untiled
    lowest_spatial = max(MIN_SPATIAL_TILE, spatial_overlap + 1)
    spatial_sizes = range(max(h, w), lowest_spatial - 1, -1) if max(h, w) >= lowest_spatial else (max(h, w),)
    longest = max(MAX_AUTO_TEMPORAL_TILE, temporal_overlap + 1)
    # (temporal tile, spatial tile, layout), larger tiles first; for one spatial tile the longest temporal tile that
    # fits has the least steady work (it falls with the length), so the shorter ones never win
    candidates = ((temporal_tile, spatial_tile, _layout(latent_shape, (min(temporal_tile, f), temporal_overlap),
                                                        (spatial_tile, spatial_overlap), "", cost))
                  for spatial_tile in spatial_sizes for temporal_tile in range(longest, temporal_overlap, -1))
    best, smallest = search_budget(candidates, lambda c: c[2].estimate_bytes, memory_budget,
                                   lambda c: _steady_work((c[0], temporal_overlap), c[2]))
    temporal_tile, spatial_tile, _ = best or smallest
    # as few temporal tiles as that shape needs here, each as short as that count allows: never larger than the
    # shape (so never above a long clip's peak), and a short clip does not decode long overlaps for nothing
    count = len(axis_cuts(f, temporal_tile, temporal_overlap))
    temporal_tile = next(t for t in range(temporal_overlap + 1, temporal_tile + 1)
                         if t >= f or len(axis_cuts(f, t, temporal_overlap)) <= count)
    plan = _layout(latent_shape, (temporal_tile, temporal_overlap), (spatial_tile, spatial_overlap), "", cost)
    fits = memory_budget is None or plan.estimate_bytes <= memory_budget
    reason = ("auto: the largest tiles that fit the free memory" if fits
              else "auto: the smallest tiles (even these exceed the free memory)")
    return dataclasses.replace(plan, reason=reason)
