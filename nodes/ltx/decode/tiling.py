"""Tiling shared by both video decoders: the request, axis cuts, blend ramps and the budget search.

A decode is cut into tiles along time, rows and columns; each tile is decoded on its own and the decoded tiles
are blended in pixel space with trapezoid weights that sum to one at every pixel (a partition of unity), so an
overlap fades from one tile into the next instead of showing a seam. What only one decoder has stays with it:
the conv decoder's causal first frame (`conv_tiling`), the diffusion decoder's receptive-field halos, origin-tile
rule and ghost frames (`diffusion_tiling`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import torch

from ..errors import LTX25Error

MODES = ("auto", "off", "manual")
Interval = tuple[int, int]  # [start, stop) along one axis
Candidate = TypeVar("Candidate")


@dataclass(frozen=True)
class TilingRequest:
    """What the user asked for, the same for both decoders (the decode nodes' tiling widgets).

    mode: `auto` tiles only when the untiled decode does not fit the memory budget, then picks the tile sizes and
    keeps the overlaps below; `off` decodes in one piece; `manual` uses the sizes below. Sizes are output frames and
    pixels: tile_frames / tile_pixels per tile, overlap_frames / overlap_pixels cross-faded between neighbours.
    memory_budget_gb: device memory the decode may use, the decoder's weights included; 0 = what is free.
    """
    mode: str = "auto"
    tile_frames: int = 80
    tile_pixels: int = 768
    overlap_frames: int = 24
    overlap_pixels: int = 64
    memory_budget_gb: float = 0.0

    def problem(self) -> tuple[str, object, str] | None:
        """(field, value, expected) of the first unusable value, or None. Field names are the widget names."""
        if self.mode not in MODES:
            return "tiling", self.mode, " / ".join(MODES)
        for name in ("tile_frames", "tile_pixels", "overlap_frames", "overlap_pixels"):
            value = getattr(self, name)
            if int(value) != value or value < 0:
                return name, value, "a whole number ≥ 0"
        if not self.memory_budget_gb >= 0:
            return "memory_budget_gb", self.memory_budget_gb, "≥ 0 (0 = the free device memory)"
        if self.mode == "manual" and self.overlap_pixels >= self.tile_pixels:
            return "overlap_pixels", self.overlap_pixels, f"less than tile_pixels ({self.tile_pixels})"
        if self.mode == "manual" and self.overlap_frames >= self.tile_frames:
            return "overlap_frames", self.overlap_frames, f"less than tile_frames ({self.tile_frames})"
        return None

    def check(self, where: str, weight_bytes: int | None = None) -> None:
        """Raise the first `problem()` as an LTX25Error naming `where`.<widget>; with the model's `weight_bytes`,
        also a budget that does not cover them (checked before the model loads: a load for it may evict others)."""
        problem = self.problem()
        if problem is not None:
            raise LTX25Error(f"{where}.{problem[0]}", problem[0], problem[1], problem[2])
        if weight_bytes is not None:
            self.budget_bytes(weight_bytes, 0, where)

    def budget_bytes(self, weight_bytes: int, free_bytes: int, where: str) -> int:
        """Bytes `auto` may plan the decode's working memory with: `memory_budget_gb` less the weights it includes,
        or `free_bytes` (what the device has free with the weights loaded) when the budget is 0."""
        if self.memory_budget_gb <= 0:
            return free_bytes
        budget = int(self.memory_budget_gb * 2**30)
        if budget <= weight_bytes:
            raise LTX25Error(f"{where}.memory_budget_gb", "the budget", f"{self.memory_budget_gb} GiB",
                             f"more than the decoder's own {weight_bytes / 2**30:.2f} GiB of weights",
                             "Raise it, or set 0 to use the free device memory.")
        return budget - weight_bytes


# A tiled conv decode that recomputes at most this much of the untiled one's work is preferred to evicting another
# model to decode untiled. On a small card the evicted model is the sampler's transformer, placed again on the next run
# and its CUDA graphs captured again, which costs more than the untiled conv decode itself (docs/PERFORMANCE.md, the
# NVFP4 24 GiB row), so tiles of up to about that much extra work still pay. The diffusion decoder does not use it
# yet: its tiles planned beside the transformer ran out of memory on a 24 GiB card.
MAX_WORK_TO_KEEP_LOADED = 2.5


def working_memory_request(request: TilingRequest, untiled: int, spare: int,
                           tiled_within: Callable[[int], tuple[int, float] | None]) -> int:
    """The working memory a decode asks model management to make room for (evicting other models if needed).

    `untiled`: the untiled decode's estimate (the manual tiles' for `manual`); `spare`: what the device has for
    the decode without evicting any other model; `tiled_within(budget)`: `(estimate, work ratio)` of the auto tiles
    planned within `budget`, None when none fit. `auto` without a budget of its own asks for tiles that fit beside
    the loaded models when the untiled decode does not, unless they recompute more than `MAX_WORK_TO_KEEP_LOADED`
    times the untiled work; otherwise (and for `off`, `manual` or a set budget) the untiled estimate, as before."""
    if request.mode != "auto" or request.memory_budget_gb > 0 or untiled <= spare:
        return untiled
    beside = tiled_within(spare)
    if beside is None:
        return untiled
    estimate, work = beside
    return estimate if estimate <= spare and work <= MAX_WORK_TO_KEEP_LOADED else untiled


def work_ratio(spans_per_axis: Iterable[Iterable[int]], lengths: Iterable[int]) -> float:
    """Decoded volume of a tile grid over the clip's: per axis, the tiles' summed lengths over the axis's length
    (overlaps decoded twice), multiplied over the axes."""
    ratio = 1.0
    for spans, length in zip(spans_per_axis, lengths):
        ratio *= sum(spans) / length
    return ratio


def axis_cuts(length: int, tile: int, overlap: int, floor: int | None = None) -> tuple[Interval, ...]:
    """Cover `[0, length)` with tiles of `tile` that advance by `tile − overlap`; one tile when it all fits.

    The last tile ends exactly at `length`; when it would be shorter than `floor` (default: `tile`, a full-size
    last tile) it grows left to `floor`, overlapping its neighbour more instead of being a short remnant that is
    mostly border.
    """
    if length <= tile:
        return ((0, length),)
    if not 0 <= overlap < tile:
        raise ValueError(f"overlap {overlap} must be in [0, tile={tile})")
    floor = tile if floor is None else floor
    step = tile - overlap
    count = -(-(length - overlap) // step)
    cuts = [(i * step, min(i * step + tile, length)) for i in range(count)]
    cuts[-1] = (cuts[-1][0], length)
    if cuts[-1][1] - cuts[-1][0] < floor:
        cuts[-1] = (length - floor, length)
    return tuple(cuts)


def ramp_weights(length: int, ramp_in: int, ramp_out: int, skip_first: bool = False) -> torch.Tensor:
    """One tile's trapezoid along one axis, `[length]` float64: 1 inside, rising over the first `ramp_in` pixels as
    (k+1)/(R+1) and falling over the last `ramp_out` as (R−k)/(R+1), so two tiles that share R pixels and ramp across
    them sum to exactly one. `skip_first`: the first pixel gets weight 0 and the rise starts after it (the conv
    decoder's spurious causal frame)."""
    w = torch.ones(length, dtype=torch.float64)
    start = int(skip_first)
    if skip_first:
        w[0] = 0.0
    if ramp_in:
        w[start:start + ramp_in] *= torch.arange(1, ramp_in + 1, dtype=torch.float64) / (ramp_in + 1)
    if ramp_out:
        w[length - ramp_out:] *= torch.arange(ramp_out, 0, -1, dtype=torch.float64) / (ramp_out + 1)
    return w


def blend_weights(ranges: list[Interval], length: int, drop_first: list[bool] | None = None) -> list[torch.Tensor]:
    """Per-tile 1-D weights (float32, one per pixel of the tile) that sum to exactly one at every pixel of [0, length).

    Each tile ramps up across its overlap with the previous tile and down across its overlap with the next one —
    the same pixels, so a pair sums to one by construction (`ramp_weights`). Where three tiles meet, or a tile has no
    partner, dividing by the sum keeps the partition of unity. A tile whose first pixel is dropped gives it weight 0
    and starts its ramp after it.
    """
    drop_first = drop_first or [False] * len(ranges)
    valid_start = [s + int(d) for (s, _), d in zip(ranges, drop_first)]
    raw = []
    for i, (start, stop) in enumerate(ranges):
        ramp_in = max(0, ranges[i - 1][1] - valid_start[i]) if i > 0 else 0
        ramp_out = max(0, stop - valid_start[i + 1]) if i + 1 < len(ranges) else 0
        raw.append(ramp_weights(stop - start, ramp_in, ramp_out, drop_first[i]))
    total = torch.zeros(length, dtype=torch.float64)
    for (start, stop), w in zip(ranges, raw):
        total[start:stop] += w
    if bool((total <= 0).any()):
        gap = int(torch.nonzero(total <= 0)[0])
        raise ValueError(f"tiles leave pixel {gap} of {length} uncovered")
    return [(w / total[start:stop]).float() for (start, stop), w in zip(ranges, raw)]


def search_budget(candidates: Iterable[Candidate], estimate: Callable[[Candidate], int], budget: int,
                  rank: Callable[[Candidate], Any]) -> tuple[Candidate | None, Candidate | None]:
    """The budget search of `auto`: (the candidate of least `rank` whose `estimate` fits `budget`, the candidate of
    least estimate), None for an empty choice. Among equals the first candidate wins, so the caller's order breaks
    ties (larger tiles first)."""
    best, best_rank, smallest, smallest_bytes = None, None, None, None
    for candidate in candidates:
        need = estimate(candidate)
        if smallest is None or need < smallest_bytes:
            smallest, smallest_bytes = candidate, need
        if need <= budget:
            order = rank(candidate)
            if best is None or order < best_rank:
                best, best_rank = candidate, order
    return best, smallest
