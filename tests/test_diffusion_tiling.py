"""The diffusion VAE's tile schedule as pure geometry: released-config constants, cuts, causal frame offsets, ghost
frames, floors, partition of unity, refusals and the auto gate — no model runs here."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from nodes.ltx.decode import diffusion_tiling as dt
from nodes.ltx.decode.tiling import axis_cuts
from nodes.ltx.errors import LTX25Error

# docs/MODEL.md §10.1, as plain numbers
RELEASED = dt.TilingGeometry(
    stage_channels=(2048, 1024, 512, 512, 256), stage_kernels=((3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5)),
    stage_depths=(4, 6, 4, 2, 8), upsample_strides=((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2)),
    stage5_kernel=(11, 11, 11), patch_size=4)
TINY = dt.TilingGeometry((256, 128, 64, 64, 32), ((3, 3, 3),) * 4, (1, 1, 1, 1, 1),
                         RELEASED.upsample_strides, (3, 3, 3), 4)
GiB = 2**30


def test_released_constants_match_the_reference():
    """Halos, overlaps, floors and ghosts derived from the released config equal the reference numbers
    (docs/MODEL.md §10.4, §13 item 12); a wrong derivation would tile with seams or below NATTEN's kernel."""
    g = RELEASED
    assert g.cell_pixels == (2, 8, 8)
    assert g.halo4 == (2, 4, 4) and g.halo5 == (20, 20, 20)
    assert g.min_overlap == (40, 160)
    assert g.min_tile_cells == (6, 6, 6)
    assert g.latent_floor == (3, 7, 7)
    assert (g.ghost_latent_frames, g.ghost_cells) == (2, 8)
    assert g.stage4_grid((16, 16, 24)) == (61, 64, 96)
    assert g.canvas((16, 16, 24)) == (121, 512, 768)
    assert g.pre_upsample_grid((18, 16, 24)) == (35, 32, 48)


def test_tiny_config_scales_the_same_rules_down():
    """The tiny test model (kernels 3, depth 1) gets the same formulas at a few cells, so tiled tests on tiny
    videos exercise the reference rules rather than a test-only escape hatch."""
    assert TINY.halo4 == (1, 1, 1) and TINY.halo5 == (1, 1, 1)
    assert TINY.min_overlap == (8, 32)
    assert TINY.min_tile_cells == (3, 3, 3) and TINY.latent_floor == (3, 3, 3)


@pytest.mark.parametrize("length,size,overlap,floor", [
    (17, 8, 4, 3), (16, 8, 4, 3), (9, 8, 4, 3), (61, 40, 20, 6), (69, 40, 20, 6), (240, 64, 20, 6),
    (100, 50, 20, 6), (41, 40, 20, 6), (7, 8, 4, 3), (125, 41, 20, 30)])
def test_axis_cuts_cover_with_the_overlap_and_respect_the_floor(length, size, overlap, floor):
    """Cuts cover [0, length) in order, neighbours share ≥ overlap cells, no tile is below the floor or above the
    size, and only the last tile may be shorter (grown left when it would fall under the floor)."""
    cuts = axis_cuts(length, size, overlap, floor)
    assert cuts[0][0] == 0 and cuts[-1][1] == length
    for (a0, a1), (b0, b1) in zip(cuts, cuts[1:]):
        assert a0 < b0 and a1 - b0 >= overlap, cuts
    assert all(min(floor, length) <= e - s <= max(size, floor) for s, e in cuts), cuts


def test_temporal_pixels_follow_the_causal_offset():
    """Pins the causal 1-then-2 frame mapping: the origin tile decodes cells [0, e) to frames [0, 2e−1) and every
    other tile [s, e) to [2s−1, 2e−1). An inverted or missing −1 still gives a well-shaped video, a frame off."""
    spans = dt.build_schedule(RELEASED, (16, 16, 24), tile_frames=80).spans[0]
    assert [s.cells for s in spans] == [(0, 40), (20, 60), (40, 61)]
    assert [s.pixels for s in spans] == [(0, 79), (39, 119), (79, 121)]
    for a, b in zip(spans, spans[1:]):
        overlap = a.pixels[1] - b.pixels[0]
        assert overlap == 2 * (a.cells[1] - b.cells[0]) == a.ramps[1] == b.ramps[0]


def test_only_the_origin_tile_drops_the_leading_frame_and_only_the_last_carries_ghosts():
    """The origin rule and the ghost rule per tile: feature frames of the trailing tile run into the 8 ghost cells,
    the others stop at their content; every tile keeps ≥ the stage-5 kernel of frames."""
    schedule = dt.build_schedule(RELEASED, (31, 34, 60), tile_frames=80, tile_pixels=640)
    t_cells = schedule.geometry.stage4_grid(schedule.work_thw)[0]
    for tile in schedule.tiles():
        assert tile.is_origin == (tile.t.cells[0] == 0)
        trailing = tile.t.cells[1] == t_cells
        assert tile.feature_frames == (tile.t.cells[0], t_cells + 8 if trailing else tile.t.cells[1])
        assert tile.t.length >= 11  # ≥ the stage-5 kernel after the ghosts are cropped again
        assert tile.t.length == 2 * (tile.t.cells[1] - tile.t.cells[0]) - (1 if tile.is_origin else 0)


SHAPES = [(1, 1, 1), (2, 5, 9), (3, 7, 7), (5, 16, 24), (16, 16, 24), (16, 34, 60), (31, 34, 60), (9, 12, 20)]


@pytest.mark.parametrize("geometry,latent,sizes", [
    (g, shape, sizes) for g, size_list in ((RELEASED, [(80, 320), (96, 512), (120, 352), (None, 384), (88, None)]),
                                           (TINY, [(16, 64), (24, 96), (16, None)]))
    for shape in SHAPES for sizes in size_list])
def test_weights_partition_unity_and_tiles_cover_the_canvas(geometry, latent, sizes):
    """On many shapes: per axis the tiles cover the padded canvas, neighbours overlap by exactly their ramps and
    the trapezoid weights sum to one everywhere (so the blend needs no normalization buffer)."""
    schedule = dt.build_schedule(geometry, latent, *sizes)
    for axis, spans in enumerate(schedule.spans):
        length = schedule.canvas[axis]
        total = torch.zeros(length, dtype=torch.float64)
        for span in spans:
            w = span.weights().double()
            assert w.shape[0] == span.length and bool((w > 0).all())
            total[span.pixels[0]:span.pixels[1]] += w
        assert spans[0].pixels[0] == 0 and spans[-1].pixels[1] == length
        assert torch.allclose(total, torch.ones(length, dtype=torch.float64), atol=1e-6), \
            f"axis {axis}: weights sum to {total.min():.6f}..{total.max():.6f}"
        for a, b in zip(spans, spans[1:]):
            assert a.pixels[1] - b.pixels[0] == a.ramps[1] == b.ramps[0] > 0


@pytest.mark.parametrize("latent", SHAPES)
def test_floor_pad_and_content_box(latent):
    """Latents below the all-stage floor (3, 7, 7) are padded (frames after, rows/columns on both sides) and the
    content box points back at the real video inside the padded canvas."""
    schedule = dt.build_schedule(RELEASED, latent)
    assert all(w >= max(n, f) for w, n, f in zip(schedule.work_thw, latent, (3, 7, 7)))
    frames, rows, cols = schedule.content
    assert frames == slice(0, 8 * (latent[0] - 1) + 1)
    assert rows.stop - rows.start == 32 * latent[1] and cols.stop - cols.start == 32 * latent[2]
    assert rows.start == 32 * ((schedule.work_thw[1] - latent[1]) // 2)
    assert rows.stop <= schedule.canvas[1] and cols.stop <= schedule.canvas[2]


def test_groups_finalize_consecutive_frame_ranges():
    """Temporal groups emit [start, next start) each, together exactly the canvas frames once."""
    schedule = dt.build_schedule(RELEASED, (31, 8, 8), tile_frames=96)
    ranges = [r for _, r in schedule.groups()]
    assert ranges[0][0] == 0 and ranges[-1][1] == schedule.canvas[0]
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])) and len(ranges) > 2


@pytest.mark.parametrize("kwargs", [dict(overlap_frames=32), dict(overlap_pixels=128),
                                    dict(overlap_frames=8, overlap_pixels=32)])
def test_overlap_below_the_receptive_field_is_refused(kwargs):
    """An overlap smaller than the decoder's reach (40 frames / 160 px) is refused, never silently used."""
    with pytest.raises(LTX25Error, match="overlap"):
        dt.build_schedule(RELEASED, (16, 16, 24), tile_frames=80, tile_pixels=320, **kwargs)


@pytest.mark.parametrize("frames,pixels", [(72, 320), (80, 288), (84, 320), (80, 330)])
def test_tiles_too_small_or_off_grid_are_refused(frames, pixels):
    """Manual tiles must hold both blend ramps (≥ 2 × overlap) and sit on the latent grid (8 frames / 32 px)."""
    with pytest.raises(LTX25Error, match="tile_"):
        dt.build_schedule(RELEASED, (31, 34, 60), tile_frames=frames, tile_pixels=pixels)


def test_untiled_schedule_is_one_tile_covering_everything():
    """`off` (no sizes) and sizes at least the video both give the single-tile schedule: one code path."""
    for sizes in [(None, None), (4096, 4096)]:
        schedule = dt.build_schedule(RELEASED, (16, 16, 24), *sizes)
        assert schedule.grid == (1, 1, 1) and not schedule.is_tiled and schedule.overlap == (0, 0)
        (tile,) = schedule.tiles()
        assert tile.pixel_shape == (121, 512, 768) and tile.feature_frames == (0, 69) and tile.is_origin


def test_auto_gate_tiles_only_when_the_video_does_not_fit():
    """The auto decision itself: a generous budget gives the single tile (a video that fits one tile decodes to
    the same pixels either way, so only the decision can be checked); a tight one tiles and its estimate fits."""
    memory = dt.MemoryModel()
    latent = (16, 16, 24)
    untiled = memory.estimate(dt.build_schedule(RELEASED, latent))
    assert not dt.plan_auto(RELEASED, latent, untiled, memory).is_tiled
    tight = dt.plan_auto(RELEASED, latent, untiled // 3, memory)
    assert tight.is_tiled and memory.estimate(tight) <= untiled // 3
    with pytest.raises(LTX25Error, match="memory budget"):
        dt.plan_auto(RELEASED, latent, 64 * 2**20, memory)


def test_auto_keeps_the_requested_overlaps():
    """auto chooses tile sizes, not overlaps: overlaps wider than the decoder's reach (the node's widgets) are what
    its tiles share, and one below the reach is refused as in manual tiling."""
    memory, latent = dt.MemoryModel(), (16, 16, 24)
    budget = memory.estimate(dt.build_schedule(RELEASED, latent)) // 3
    wide = dt.plan_auto(RELEASED, latent, budget, memory, 48, 192)
    assert wide.is_tiled and wide.overlap != (0, 0) and memory.estimate(wide) <= budget
    assert all(used in (0, wanted) for used, wanted in zip(wide.overlap, (48, 192))), wide.overlap
    with pytest.raises(LTX25Error, match="overlap"):
        dt.plan_auto(RELEASED, latent, budget, memory, 32, 160)


def test_auto_plans_full_hd_under_ten_gib_and_241_frames_like_121():
    """1920×1088 fits a 10 GiB budget (minus ~1 GiB of weights) once tiled, and 241 frames plan to within 1.1× the
    estimated peak of 121: only the resident 1/8-size pre-upsample features grow with the length."""
    memory, budget = dt.MemoryModel(), 9 * GiB
    plans = {f: dt.plan_auto(RELEASED, ((f - 1) // 8 + 1, 34, 60), budget, memory) for f in (121, 241)}
    estimates = {f: memory.estimate(p) for f, p in plans.items()}
    assert all(p.is_tiled for p in plans.values()) and max(estimates.values()) <= budget, estimates
    assert estimates[241] <= 1.1 * estimates[121], estimates


def test_tiles_go_straight_to_the_frames_so_only_frames_kept_on_the_device_count():
    """No blend buffer: a tiled schedule's estimate does not hold any whole-canvas frames (the tiles are added into
    the output frames), and only when the frames themselves stay on the device (ComfyUI with GPU-only
    intermediates) do their float32 bytes join the peak. The old decode kept a whole-canvas fp16 group buffer
    plus the overlap carried to the next group (1.4 GiB at 1920×1088 with 80-frame tiles)."""
    schedule = dt.build_schedule(RELEASED, (31, 34, 60), 96, 512)
    assert schedule.grid[0] > 1 and schedule.overlap[0] > 0
    on_host, on_device = (dt.MemoryModel(frames_on_device=d).estimate(schedule) for d in (False, True))
    assert on_device - on_host == 241 * 1088 * 1920 * 3 * 4
    # the same tiles, stages 1-3 in slabs, over twice the frames: nothing in the estimate grows with the clip
    short, long = (dt.MemoryModel().estimate(dataclasses.replace(dt.build_schedule(RELEASED, (t, 34, 60), 96, 512),
                                                                 pre_chunk=4)) for t in (16, 31))
    assert long <= 1.02 * short, (long / GiB, short / GiB)


def test_lean_blocks_plan_with_their_smaller_working_set():
    """The triton processor runs the lean block forwards (`fused_block`: residuals in place, q|k|v the only
    full-size temporary, attention written over q): stage 5 is planned with 5 live tensors of its width per
    token and stages 1-4 with 4; every other processor with diffusers' blocks (12 and 11). A wrong pick
    over-fills the card or wastes tiles."""
    from types import SimpleNamespace

    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.kernels import fused_block
    from nodes.ltx.kernels import na_attention as na

    class Lean(na.SdpaNAProcessor):
        fused_block = fused_projection = True

    class FusedBlockOnly(na.SdpaNAProcessor):
        fused_block = True

    vae = SimpleNamespace(parameters=lambda: iter([torch.zeros(1, dtype=torch.bfloat16)]),
                          config=SimpleNamespace(head_dim=64))
    lean = dv.memory_model(vae, 1, Lean())
    assert (lean.stage5_live, lean.det_live, lean.chunk_elements) == (dt.LEAN_STAGE5_LIVE, dt.LEAN_DET_LIVE,
                                                                      fused_block.CHUNK_ELEMENTS) == (5, 4, 1 << 25)
    for processor in (None, na.SdpaNAProcessor(), FusedBlockOnly()):
        model = dv.memory_model(vae, 1, processor)
        assert (model.stage5_live, model.det_live, model.chunk_elements) == (12, 11, 0), processor
    vae.config.head_dim = 32  # 1/√32 is no power of two: the blocks fall back to the processor's own call
    assert dv.memory_model(vae, 1, Lean()).stage5_live == dt.DIFFUSERS_STAGE5_LIVE


def test_spans_are_value_objects_without_tensors():
    """The schedule is plain numbers (hashable, comparable) so the driver can group tiles by temporal span."""
    schedule = dt.build_schedule(TINY, (5, 4, 4), 16, 64)
    tiles = schedule.tiles()
    assert len({t.t for t in tiles}) == schedule.grid[0]
    assert len(tiles) == schedule.tile_count == len(set(itertools.product(*schedule.spans)))


# ------------------------------------------------------------------------------- the planner's decisions
# the released decoder with the triton processor's lean blocks, as `diffusion_vae.memory_model` builds it
LEAN = dt.MemoryModel(stage5_live=dt.LEAN_STAGE5_LIVE, det_live=dt.LEAN_DET_LIVE, chunk_elements=1 << 25)
FULL_HD = {121: (16, 34, 60), 241: (31, 34, 60)}  # 1920×1088 latents
WEIGHTS_GIB = 0.78  # the released decoder in bf16 (417 M parameters): what a memory_budget_gb also pays for


@pytest.mark.parametrize("latent,budget_gib,grid,tile,pre_chunk", [
    ((16, 16, 24), 8.0, (1, 1, 1), (121, 512, 768), None),    # 768×512×121 fits untiled (7.6 GiB)
    ((16, 16, 24), 4.0, (1, 1, 3), (121, 512, 384), None),    # least overlap: columns only
    ((16, 16, 24), 2.0, (2, 2, 4), (87, 352, 352), None),
    (FULL_HD[121], 4.0, (1, 4, 7), (121, 416, 416), None),
    (FULL_HD[121], 2.0, (2, 6, 11), (95, 320, 320), None),
    (FULL_HD[121], 1.7, (3, 6, 11), (80, 320, 320), 21),      # the smallest tiles, stages 1-3 in slabs
    (FULL_HD[241], 8.0, (3, 2, 4), (112, 640, 640), None),
    (FULL_HD[241], 4.0, (3, 4, 7), (120, 416, 416), None),    # stages 1-3 on all 241 frames still fit
    (FULL_HD[241], 2.0, (4, 6, 11), (96, 320, 320), 7),
    (FULL_HD[241], 1.7, (6, 6, 11), (80, 320, 320), 1),
])
def test_planner_decisions_for_budgets_and_shapes(latent, budget_gib, grid, tile, pre_chunk):
    """The planner's pick (lean blocks, bf16) for a table of clips and working budgets: the least recomputed
    overlap whose estimate fits, stages 1-3 on the whole clip whenever that fits, the thinnest slabs only at the
    floor. A changed byte count moves these decisions; if it is meant to, re-derive the table from the counts
    (docs/PERFORMANCE.md)."""
    schedule = dt.plan_auto(RELEASED, latent, int(budget_gib * GiB), LEAN)
    sizes = tuple(max(s.length for s in axis) for axis in schedule.spans)
    assert (schedule.grid, sizes, schedule.pre_chunk) == (grid, tile, pre_chunk), \
        (schedule.grid, sizes, schedule.pre_chunk, LEAN.estimate(schedule) / GiB)
    assert LEAN.estimate(schedule) <= budget_gib * GiB
    if pre_chunk is not None:  # the slabs cover each group's features exactly as the driver will cut them
        for span in schedule.spans[0]:
            p0, p1 = schedule.group_pre_frames(span)
            chunks = [chunk for chunk, _ in schedule.pre_slabs(span)]
            assert chunks[0][0] == p0 and chunks[-1][1] == p1
            assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
            for chunk, slab in schedule.pre_slabs(span):
                (first, end), _ = RELEASED.slab_trace(*slab, schedule.ghosted_frames)
                assert first <= chunk[0] and chunk[1] <= end and RELEASED.slab_fits(*slab, schedule.ghosted_frames)


def test_full_hd_241_frames_decode_within_four_gib_like_121():
    """Issue #19's goal in the planner: with a 4 GiB budget (the weights included) 1920×1088 plans at 121 and
    241 frames, and the 241-frame peak (weights included) is within 1.1× the 121-frame one."""
    budget = int((4.0 - WEIGHTS_GIB) * GiB)
    peaks = {f: LEAN.estimate(dt.plan_auto(RELEASED, latent, budget, LEAN)) + WEIGHTS_GIB * GiB
             for f, latent in FULL_HD.items()}
    assert max(peaks.values()) <= 4 * GiB and peaks[241] <= 1.1 * peaks[121], {f: p / GiB for f, p in peaks.items()}


def test_the_floor_does_not_grow_with_the_clip():
    """The smallest budget the planner accepts at 1920×1088 is about the same at 241 frames as at 121 (it was
    5.39 vs 4.41 GiB with stages 1-3 on the whole clip, then 4.31 GiB at both with a full-canvas blend buffer), and
    that budget is what the smallest tiles and the thinnest slabs need, so one just under it is refused."""
    floors = {f: LEAN.estimate(dt.smallest_schedule(RELEASED, latent, LEAN)) for f, latent in FULL_HD.items()}
    assert floors[241] <= 1.1 * floors[121] and max(floors.values()) < 2 * GiB, {f: b / GiB for f, b in floors.items()}
    assert dt.plan_auto(RELEASED, FULL_HD[241], floors[241], LEAN)
    with pytest.raises(LTX25Error, match="smallest legal tiles"):
        dt.plan_auto(RELEASED, FULL_HD[241], floors[241] - 1, LEAN)


def test_untiled_estimates_stay_under_comfyui_cores_peaks():
    """Issue #24's memory goal in the counts: the untiled decode (lean blocks) with its weights stays under
    ComfyUI core's measured peaks, 10.4 GiB at 768×512×121 and 49 GiB at 1920×1088×121. Stage 5 dominates:
    context, hidden state and q|k|v (5 × 512 B per token), its noise and the stage-3 features."""
    for latent, core_gib in (((16, 16, 24), 10.4), (FULL_HD[121], 49.0)):
        schedule = dt.build_schedule(RELEASED, latent)
        tokens = 121 * (latent[1] * 8) * (latent[2] * 8)
        stage5 = tokens * (5 * 256 + 48) * 2
        assert stage5 < LEAN.estimate(schedule) <= stage5 + (400 << 20) + LEAN.resident(RELEASED, latent)
        assert LEAN.estimate(schedule) + WEIGHTS_GIB * GiB <= core_gib * GiB, LEAN.estimate(schedule) / GiB


def test_slab_arithmetic_widens_by_the_temporal_reach_of_stages_1_to_3():
    """Released config: each of the 4 + 6 stage-1/2 blocks and 4 stage-3 blocks (temporal kernel 3) costs one
    frame per cut edge, stage 3 at twice the latent rate: an interior slab loses 10 latent frames and then 4 frames
    after the ×2 upsample on each side; a slab at the clip's start or end loses nothing on that side."""
    (first, end), _ = RELEASED.slab_trace(12, 36, 40)
    assert (first, end) == (2 * (12 + 10) - 1 + 4, 2 * (36 - 10) - 1 - 4)
    assert RELEASED.slab_trace(0, 40, 40)[0] == (0, 2 * 40 - 1)
    assert RELEASED.slab_trace(0, 20, 40)[0] == (0, 2 * (20 - 10) - 1 - 4)
    start, stop = RELEASED.slab_for_pre((30, 31), 40)
    assert RELEASED.slab_trace(start, stop, 40)[0][0] <= 30 and RELEASED.slab_fits(start, stop, 40)
    assert RELEASED.slab_trace(start + 1, stop, 40)[0][0] > 30  # the smallest: one frame less no longer covers
