"""The conv video VAE (docs/MODEL.md §9, §12): native config → diffusers decoder, strict key map, statistics, the tile
geometry and blend, auto tiling, and the decode node's refusals."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nodes.comfy.decode_conv import LTX25ConvVAEDecode
from nodes.comfy.handles import Loaded
from nodes.ltx.decode import conv_vae as cv
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.decode.conv_tiling import CostModel, latent_overlaps, plan_tiles, spatial_pixels, temporal_pixels
from nodes.ltx.decode.tiling import TilingRequest, axis_cuts, blend_weights
from nodes.ltx.geometry import pixel_frames
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import KeyMap, check_coverage
from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG
from nodes.tools.tiny.common import latent_statistics
from nodes.tools.tiny.conv_vae import TINY_VAE_CONFIG


@pytest.fixture(scope="module")
def vae(tiny_file):
    return cv.load_conv_vae(tiny_file("conv_vae"), torch.float32)


@pytest.fixture(scope="module")
def pointwise(vae):
    """The tiny VAE with every off-centre conv tap zeroed: each output pixel depends on its own latent cell only,
    so ANY tiling must reproduce the untiled decode exactly — a test of placement and weights alone."""
    local = copy.deepcopy(vae)
    with torch.no_grad():
        for m in local.modules():
            if isinstance(m, torch.nn.Conv3d):
                centre = m.weight[:, :, 1:2, 1:2, 1:2].clone()
                m.weight.zero_()[:, :, 1:2, 1:2, 1:2] = centre
    return local


def _latent(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tiling(frames: int, pixels: int, overlap_frames: int, overlap_pixels: int, mode: str = "manual") -> TilingRequest:
    """A tiling request as the decode node's widgets give it: frames and pixels per tile, then the overlaps."""
    return TilingRequest(mode, frames, pixels, overlap_frames, overlap_pixels)


# ------------------------------------------------------------------------------------------------- file and config
def test_tiny_file_is_native_format(tiny_file):
    """Native names (`decoder.up_blocks.{0..8}` with `res_blocks`/`conv`, `encoder.*`, hyphenated statistics) and
    the flat `config.vae` with native block lists — what the released file has, not diffusers' names."""
    with safe_open(tiny_file("conv_vae"), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    config = json.loads(meta["config"])["vae"]
    assert config["_class_name"] == "CausalVideoAutoencoder" and meta["model_version"].startswith("2.5")
    assert [b[0] for b in config["decoder_blocks"]][1::2] == ["compress_space", "compress_time", "compress_all",
                                                              "compress_all"]
    assert {"per_channel_statistics.mean-of-means", "per_channel_statistics.std-of-means",
            "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight", "decoder.up_blocks.7.conv.conv.weight",
            "decoder.conv_in.conv.weight", "encoder.conv_out.conv.weight",
            "encoder.down_blocks.1.conv.conv.weight"} <= keys
    assert not any("resnets" in k or "upsamplers" in k or "mid_block" in k for k in keys)


def test_every_key_map_row_is_needed(tiny_file, vae):
    """Full coverage: the file loads (fixture), and without any one rename row or the encoder drop the coverage
    check `load_strict` runs fails (a row the tiny file does not exercise would be untested)."""
    path = tiny_file("conv_vae")
    native = load_file(path)
    with torch.device("meta"):
        module = cv.ConvVideoVAE(vae.config)
    rows, drops = cv.KEY_MAP.renames, cv.KEY_MAP.drops
    variants = [KeyMap("variant", rows[:i] + rows[i + 1:], (), drops) for i in range(len(rows))]
    variants.append(KeyMap("variant", rows, (), tuple(d for d in drops if "encoder" not in d.pattern)))
    check_coverage(path, cv.KEY_MAP, module, cv.KEY_MAP.apply(native)[0])
    for key_map in variants:
        with pytest.raises(LTX25Error, match="key coverage"):
            check_coverage(path, key_map, module, key_map.apply(native)[0])


def test_extra_statistics_keys_are_dropped(tiny_file, tmp_path):
    """Dataset statistics other than the two the decoder uses (older files carry `mean-of-stds`, `channel`) are
    dropped with a reason instead of failing coverage."""
    tensors = load_file(tiny_file("conv_vae"))
    tensors["per_channel_statistics.mean-of-stds"] = torch.ones(128)
    path = str(tmp_path / "extra.safetensors")
    with safe_open(tiny_file("conv_vae"), "pt") as f:
        save_file(tensors, path, metadata=f.metadata())
    assert cv.KEY_MAP.drop_reason("per_channel_statistics.mean-of-stds")
    cv.load_conv_vae(path)


def test_shipped_config_gives_the_reference_decoder_ladder():
    """The real 2.5 `config.vae` builds the §9 ladder: 84 decoder tensors, conv_in 128→1024, upsampler convs
    1024→4096 (all ×2 /2), 512→4096 (all /1), 512→512 (time ×2 /2), 256→512 (space ×2 /2), res stages 2/2/4/6/4,
    conv_out 128→48. diffusers reads `upsample_type` in decoding order but reverses every other per-block tuple; a
    mix-up swaps the temporal and spatial upsamplers and changes these shapes."""
    config = cv.ConvVAEConfig.from_metadata("shipped", {"config": {"vae": SHIPPED_CONV_VAE_CONFIG}})
    with torch.device("meta"):
        native = cv.KEY_MAP.to_native(cv.ConvVideoVAE(config).state_dict())
    assert sum(k.startswith("decoder.") for k in native) == 84
    shapes = {k: tuple(v.shape[:2]) for k, v in native.items() if k.endswith("weight")}
    assert shapes["decoder.conv_in.conv.weight"] == (1024, 128)
    assert [shapes[f"decoder.up_blocks.{i}.conv.conv.weight"] for i in (1, 3, 5, 7)] == \
        [(4096, 1024), (4096, 512), (512, 512), (512, 256)]
    assert [len({k.split(".")[4] for k in native if k.startswith(f"decoder.up_blocks.{i}.res_blocks")})
            for i in (0, 2, 4, 6, 8)] == [2, 2, 4, 6, 4]
    assert shapes["decoder.conv_out.conv.weight"] == (48, 128)


def test_values_that_differ_from_diffusers_defaults_come_from_the_file(vae):
    """diffusers' decoder defaults are the 2.0 layout: `reflect` padding, residual ×2 upsamplers, and
    AutoencoderKLLTX2Video builds the decoder causal. The 2.5 file says zeros, no residual, non-causal, ×(2,1,2,2)."""
    decoder = vae.decoder
    assert decoder.conv_in.conv.padding_mode == "zeros"
    assert decoder.is_causal is False
    ups = [block.upsamplers[0] for block in decoder.up_blocks]
    assert [u.residual for u in ups] == [False] * 4
    assert [u.stride for u in ups] == [(2, 2, 2), (2, 2, 2), (2, 1, 1), (1, 2, 2)]
    assert [u.upscale_factor for u in ups] == [2, 1, 2, 2]


@pytest.mark.parametrize("change, key", [
    ({"timestep_conditioning": True}, "config.vae.timestep_conditioning"),
    ({"norm_layer": "group_norm"}, "config.vae.norm_layer"),
    ({"latent_channels": 64}, "config.vae.latent_channels"),
    ({"decoder_blocks": [["res_x", 1]]}, "config.vae.decoder_blocks"),
    ({"_class_name": "CausalDiffusionVAE"}, "config.vae._class_name"),
])
def test_unsupported_config_values_name_the_key(change, key):
    """Each unsupported value is refused by its key, before anything is built."""
    with pytest.raises(LTX25Error) as info:
        cv.ConvVAEConfig.from_metadata("f", {"config": {"vae": {**TINY_VAE_CONFIG, **change}}})
    assert info.value.what == key, str(info.value)


def test_latent_statistics_come_from_the_file(tiny_file, vae):
    """`latents_mean`/`latents_std` [128] hold the file's `mean-of-means`/`std-of-means` (the upsampler reads them
    from whichever video VAE is connected). Checked against the raw file too: a map that swapped the two would
    round-trip through the tiny writer unnoticed."""
    mean, std = latent_statistics(0)
    native = load_file(tiny_file("conv_vae"))
    assert torch.equal(native["per_channel_statistics.mean-of-means"], mean.bfloat16())
    assert torch.equal(native["per_channel_statistics.std-of-means"], std.bfloat16())
    assert vae.kind == "conv"
    assert torch.equal(vae.latents_mean, mean.bfloat16().float()) and torch.equal(vae.latents_std,
                                                                                  std.bfloat16().float())


# ------------------------------------------------------------------------------------------------- decode
def test_decode_frame_count_and_range(vae):
    """`[B,128,F',H',W']` → `[B·F, 32H', 32W', 3]` with F = 8(F'−1)+1, in [0, 1] and not saturated."""
    frames, stats = cv.decode_conv(vae, _latent(2, 128, 3, 2, 2), TilingRequest("off"))
    assert frames.shape == (2 * 17, 64, 64, 3) and frames.dtype == torch.float32 and frames.device.type == "cpu"
    assert frames.min() >= 0 and frames.max() <= 1 and frames.std() > 0.05, float(frames.std())
    assert stats.decoder == "conv" and stats.tile_count == 1 and stats.tile_sizes == ((17, 64, 64),)


def test_statistics_unnormalize_the_latent_before_decoding(vae):
    """The decoder sees `latent·std + mean` (per channel): equal to decoding that by hand, and different from
    decoding the normalized latent (the statistics matter)."""
    z = _latent(1, 128, 2, 2, 2)
    frames, _ = cv.decode_conv(vae, z, TilingRequest("off"))
    with torch.inference_mode():
        raw = z * vae.latents_std.view(1, -1, 1, 1, 1) + vae.latents_mean.view(1, -1, 1, 1, 1)
        by_hand = ((vae.decoder(raw) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)
        normalized = ((vae.decoder(z) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)
    assert torch.allclose(frames, by_hand, atol=1e-5), float((frames - by_hand).abs().max())
    assert (frames - normalized).abs().max() > 0.05


@pytest.mark.parametrize("request_", [
    tiling(8, 64, 0, 0),       # every latent cell and frame its own tile, no overlap
    tiling(16, 96, 8, 32),     # overlaps in both; the last tiles shifted left
    tiling(16, 96, 8, 64),     # wide overlaps: three tiles meet on some pixels
])
def test_tiling_is_exact_for_a_pointwise_decoder(pointwise, request_):
    """With a decoder whose output pixel depends only on its own latent cell, every layout reproduces the
    untiled decode (the blend mixes equal values, so any wrong placement, temporal offset, causal-frame handling
    or weights that do not sum to one shows)."""
    z = _latent(1, 128, 4, 2, 5, seed=1)
    whole, _ = cv.decode_conv(pointwise, z, TilingRequest("off"))
    tiled, stats = cv.decode_conv(pointwise, z, request_)
    assert stats.tile_count > 1
    # 1e-4 of the frames' scale: a tile's shape changes how the decoder's convolutions and norms are vectorised,
    # which moves float32 results by ~1e-5 on some CPUs (AVX-512); a misplaced or misweighted tile moves them by ~0.1.
    tolerance = 1e-4 * float(whole.abs().max())
    assert (tiled - whole).abs().max() <= tolerance, float((tiled - whole).abs().max())


def test_a_last_tile_shifted_back_blends_exactly(pointwise):
    """Six latent frames in tiles of three overlapping by one: the last tile is shifted back to end at the clip's
    end, so it overlaps its neighbour by more than the steady overlap the decode keeps on the device; the extra
    frames go to the host and are added back. Still the untiled decode."""
    z = _latent(1, 128, 6, 2, 3, seed=4)
    request = tiling(16, 64, 0, 0)
    plan = cv.decode_plan(pointwise, tuple(z.shape), request, None)
    assert plan.frames == ((0, 3), (2, 5), (3, 6)) and plan.carried_frames == 1
    whole, _ = cv.decode_conv(pointwise, z, TilingRequest("off"))
    tiled, _ = cv.decode_conv(pointwise, z, request)
    # 1e-4 of the frames' scale: a tile's shape changes how the decoder's convolutions and norms are vectorised,
    # which moves float32 results by ~1e-5 on some CPUs (AVX-512); a misplaced or misweighted tile moves them by ~0.1.
    tolerance = 1e-4 * float(whole.abs().max())
    assert (tiled - whole).abs().max() <= tolerance, float((tiled - whole).abs().max())


def test_blend_removes_the_seam_overlap_zero_shows(vae):
    """Two tiles side by side. With no overlap the tiles meet in a seam: the error against the untiled decode jumps
    from column to column around the border (mean over frames, rows and colours). With an overlap the trapezoid
    cross-fade leaves under a third of that jump. (On this random tiny decoder a hard cut in the middle of the
    overlap would hide the seam too — the partition-of-unity test pins the blend weights themselves.)"""
    z = _latent(1, 128, 2, 2, 4, seed=2)
    whole, _ = cv.decode_conv(vae, z, TilingRequest("off"))

    def worst_column_jump(request):
        tiled, stats = cv.decode_conv(vae, z, request)
        assert stats.tile_count == 2
        error = tiled - whole                                          # [F, H, W, 3]
        return float((error[:, :, 1:] - error[:, :, :-1]).abs().mean(dim=(0, 1, 3)).max())

    seam = worst_column_jump(tiling(64, 64, 0, 0))
    blended = worst_column_jump(tiling(64, 96, 0, 32))
    assert seam > 0.02, f"the tiny decoder shows no seam to remove ({seam})"
    assert blended < seam / 3, f"blended jump {blended} vs seam {seam}"


def test_tiled_decode_matches_untiled_within_tolerance(vae):
    """Spatio-temporal tiles (2×2, two-cell and two-latent-frame overlaps) stay within mean |Δ| 0.01 and max 0.4 of
    the untiled decode on the tiny VAE (measured 0.0043 / 0.287: its tile-border error decays over 1–2 cells)."""
    z = _latent(1, 128, 5, 3, 4, seed=3)
    whole, _ = cv.decode_conv(vae, z, TilingRequest("off"))
    tiled, stats = cv.decode_conv(vae, z, tiling(24, 96, 8, 32))
    assert stats.tile_count >= 4
    diff = (tiled - whole).abs()
    assert diff.mean() < 0.01 and diff.max() < 0.4, (float(diff.mean()), float(diff.max()))


def test_stacked_tiles_decode_like_one_at_a_time(vae):
    """The spatial tiles of a temporal tile are decoded as one batch when memory allows: 2×2 spatial tiles in two
    temporal tiles give the same frames stacked 4 at a time (no budget), 3 at a time (room for two more tiles than
    the plan's estimate) and one at a time (a budget of exactly the estimate); each tile lands in its own place.
    (Stacking is on by default only on CUDA: on the CPU it saves no launches and only costs memory.)"""
    z = _latent(1, 128, 5, 4, 4, seed=3)
    request = tiling(24, 96, 8, 32)
    plan = cv.decode_plan(vae, tuple(z.shape), request, None)
    frames, height, width = plan.tile_pixel_sizes()[0]
    per_tile = int(cv._cost(vae, 1).decoder_bytes * frames * height * width)
    results = {}
    for budget, stack in ((None, 4), (plan.estimate_bytes + 2 * per_tile, 3), (plan.estimate_bytes, 1)):
        results[stack], stats = cv.decode_conv(vae, z, request, free_memory=budget, stack_tiles=True)
        assert stats.extra["tile_batch"] == stack and stats.tile_count == 8
    _, stats = cv.decode_conv(vae, z, request)
    assert stats.extra["tile_batch"] == 1  # the CPU default
    for stack in (4, 3):
        # float32 rounding only: a batched convolution may sum in another order (measured max 2e-5)
        assert torch.allclose(results[stack], results[1], atol=1e-4), float((results[stack] - results[1]).abs().max())


def test_auto_decode_tiles_under_a_forced_budget_and_reports_each_tile(vae):
    """auto with a budget below the untiled estimate decodes in tiles, calls `on_step` once per tile, and returns
    the same shape; the stats list every tile's pixel size."""
    z = _latent(1, 128, 3, 2, 4)
    untiled = cv.decode_plan(vae, tuple(z.shape), TilingRequest("off"), None).estimate_bytes
    calls, plans = [], []
    frames, stats = cv.decode_conv(vae, z, tiling(80, 768, 0, 32, "auto"), free_memory=untiled // 2,
                                   on_step=lambda done, total: calls.append((done, total)), on_plan=plans.append)
    assert frames.shape == (17, 64, 128, 3)
    assert stats.tile_count > 1 and len(stats.tile_sizes) == stats.tile_count
    assert calls == [(i + 1, stats.tile_count) for i in range(stats.tile_count)]
    assert stats.extra["estimate_bytes"] <= untiled // 2
    # the plan the node shows before the first tile: the grid, and the expected peak against the budget
    assert len(plans) == 1 and f"{stats.tile_count} tiles" in plans[0] and "17×64×128" in plans[0]
    assert f"expected peak {stats.extra['estimate_bytes'] / 2**30:.2f} GiB" in plans[0]


class _ConstantTiles(torch.nn.Module):
    """A stand-in decoder that decodes each tile to one raw value: `values[0]` when the frame and column the tile
    starts at add up to an even number, `values[1]` when odd (read from latent channels 0 and 1, which hold each
    cell's frame and column). Neighbouring tiles thus disagree across every overlap, as a real decoder's borders do."""

    def __init__(self, values: tuple[float, float]) -> None:
        super().__init__()
        self.values = values
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the decode's device and dtype

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        start = (z[:, 0].amin(dim=(1, 2, 3)) + z[:, 1].amin(dim=(1, 2, 3))).round().long()
        value = torch.tensor(self.values, device=z.device)[start % 2]
        frames, height, width = 8 * (z.shape[2] - 1) + 1, 32 * z.shape[3], 32 * z.shape[4]
        return value.view(-1, 1, 1, 1, 1).expand(-1, 3, frames, height, width).clone()


@pytest.mark.parametrize("shape,request_", [
    ((1, 1, 4), tiling(80, 96, 0, 64)),   # two column tiles sharing two cells
    ((6, 1, 1), tiling(16, 64, 0, 0)),    # three temporal tiles; the last one's extra overlap goes via the host
    ((4, 1, 4), tiling(16, 96, 8, 64)),   # 2 × 2 tiles
])
def test_tiles_are_blended_before_they_are_clamped(vae, shape, request_):
    """As the reference: the raw outputs are blended and the blend clamped to [0, 1] once. Tiles decode to raw ±3
    here, far outside [−1, 1]; the same decode with every raw value v replaced by (v − 1)/4 stays inside, so it
    gives the unclamped blend b' = (b + 1)/4 of the (x+1)/2-mapped values, and the clamped decode must equal
    clamp(4b' − 1). Clamping each tile first (or clamping partial sums before a later tile's share is added) moves
    the overlaps by up to 0.5."""
    stub = copy.deepcopy(vae)
    stub.decoder = _ConstantTiles((-3.0, 3.0))
    stub.latents_mean.zero_()
    stub.latents_std.fill_(1.0)
    frames, rows, cols = shape
    z = torch.zeros(1, 128, *shape)
    z[0, 0] = torch.arange(frames, dtype=torch.float32).view(-1, 1, 1)
    z[0, 1] = torch.arange(cols, dtype=torch.float32).view(1, 1, -1)
    clamped, stats = cv.decode_conv(stub, z, request_)
    stub.decoder = _ConstantTiles((-1.0, 0.5))
    inside, _ = cv.decode_conv(stub, z, request_)
    assert stats.tile_count > 1 and inside.min() >= 0 and inside.max() <= 1
    expected = (4 * inside - 1).clamp(0, 1)
    assert 0 < float(expected.mean()) < 1  # both clamps are active somewhere
    assert torch.allclose(clamped, expected, atol=1e-5), float((clamped - expected).abs().max())


def test_interrupt_between_tiles_stops_the_decode(vae):
    """An exception raised by `on_step` (how the bridge interrupts) ends the decode after that tile."""
    class Stop(Exception):
        pass

    def on_step(done, total):
        if done == 1:
            raise Stop

    with pytest.raises(Stop):
        cv.decode_conv(vae, _latent(1, 128, 2, 2, 4), tiling(64, 64, 0, 0), on_step=on_step)


# ------------------------------------------------------------------------------------------------- geometry
def test_trapezoid_weights_sum_to_one():
    """Spatial and temporal weights are a partition of unity on every pixel (also where three tiles meet), ramp
    monotonically across overlaps, and give a later temporal tile's causal first frame weight 0."""
    for length, tile, overlap in [(6, 3, 1), (9, 4, 2), (7, 2, 0), (20, 8, 5)]:
        tiles = axis_cuts(length, tile, overlap)
        ranges = [spatial_pixels(t) for t in tiles]
        weights = blend_weights(ranges, length * 32)
        total = torch.zeros(length * 32)
        for (a, b), w in zip(ranges, weights):
            total[a:b] += w
        assert torch.allclose(total, torch.ones_like(total), atol=1e-6), (length, tile, overlap)
    tiles = axis_cuts(6, 3, 2)
    ranges = [temporal_pixels(t) for t in tiles]
    weights = blend_weights(ranges, pixel_frames(6), [t[0] > 0 for t in tiles])
    total = torch.zeros(pixel_frames(6))
    for (a, b), w in zip(ranges, weights):
        total[a:b] += w
    assert torch.allclose(total, torch.ones_like(total), atol=1e-6)
    assert all(w[0] == 0 for w in weights[1:])
    ramp = weights[1][1:9]
    assert (ramp[1:] > ramp[:-1]).all() and 0 < ramp[0] < 0.2
    plan = plan_tiles((6, 2, 2), tiling(16, 64, 8, 0), None, CostModel(1.0))
    assert len(plan.frames) > 1 and all(w[0] == 0 for w in plan.axis_weights()[0][1:])


def test_auto_plan_untiled_when_memory_is_ample_and_tiles_under_a_small_budget():
    """The auto decision is a pure function: ample (or unknown) memory → one tile; a budget below the untiled
    estimate → several tiles whose largest fits; off ignores the budget; an impossible budget gets the smallest
    tiles and says so."""
    cost = CostModel(decoder_bytes=160.0)
    shape = (16, 16, 24)                                   # 768×512×121
    ample = plan_tiles(shape, TilingRequest("auto"), 10**12, cost)
    assert ample.count == 1 and ample.reason.startswith("auto: the untiled")
    assert plan_tiles(shape, TilingRequest("auto"), None, cost).count == 1
    budget = ample.estimate_bytes // 4
    small = plan_tiles(shape, TilingRequest("auto"), budget, cost)
    assert small.count > 1 and small.estimate_bytes <= budget
    assert plan_tiles(shape, TilingRequest("off"), 1, cost).count == 1
    tiny = plan_tiles(shape, TilingRequest("auto"), 1, cost)
    assert tiny.count > small.count and "exceed" in tiny.reason


@pytest.mark.parametrize("budget_gib", [10, 16, 24])
def test_long_videos_keep_the_peak_of_short_ones_under_auto(budget_gib):
    """Under one budget, auto picks one tile shape for every clip length at 1920×1088 (216 B per voxel: the shipped
    decoder in bf16): clips longer than it share it exactly, shorter ones cut it (fewer or shorter temporal tiles),
    so the estimated peak never grows with the length — the temporal groups are streamed to the host. Ranking by the
    clip's own tile count gave 241 frames whole-clip temporal tiles and 1.24× the measured peak of 121."""
    cost, budget = CostModel(decoder_bytes=216.0), budget_gib * 2**30
    plans = {frames: plan_tiles(((frames - 1) // 8 + 1, 34, 60), TilingRequest("auto"), budget, cost)
             for frames in (121, 241, 361, 481, 961)}
    shapes = {frames: tuple(max(b - a for a, b in cuts) for cuts in (p.frames, p.rows, p.cols))
              for frames, p in plans.items()}
    assert all(p.tiled and p.estimate_bytes <= budget for p in plans.values())
    assert shapes[481] == shapes[961], shapes                       # the length-independent shape
    longest = plans[961].estimate_bytes
    assert all(p.estimate_bytes <= longest for p in plans.values()), {f: p.estimate_bytes for f, p in plans.items()}
    assert all(shapes[f][1:] == shapes[961][1:] and shapes[f][0] <= shapes[961][0] for f in shapes), shapes
    overlap = latent_overlaps(TilingRequest("auto"))[1]
    for frames, p in plans.items():  # each temporal tile as short as its count allows: no overlap decoded for nothing
        latent, tile = (frames - 1) // 8 + 1, shapes[frames][0]
        assert tile == overlap + 1 or len(axis_cuts(latent, tile - 1, overlap)) > len(p.frames), (frames, tile)


def test_short_clips_are_planned_on_their_own_length():
    """A clip shorter than the budget's temporal tile is judged on its own frames: 49 frames at 1920×1088 under
    16 GiB take one temporal tile and two spatial ones (judged as 121-frame tiles they took 8), and the reason says
    "exceed" only when even the smallest tiles do."""
    cost = CostModel(decoder_bytes=216.0)
    short = plan_tiles((7, 34, 60), TilingRequest("auto"), 16 * 2**30, cost)
    assert (len(short.frames), short.count) == (1, 2), (short.frames, short.count)
    for budget in (2**28, 2**29, 2**30):
        plan = plan_tiles((1, 34, 60), TilingRequest("auto"), budget, cost)
        assert ("exceed" in plan.reason) == (plan.estimate_bytes > budget), (budget, plan.reason)


# ------------------------------------------------------------------------------------------------- node
def test_diffusion_vae_file_refused_by_the_conv_loader(tmp_path):
    """A file whose metadata says CausalDiffusionVAE is named as a diffusion video VAE, not loaded as conv."""
    path = str(tmp_path / "ltx-2.5-video-vae-bf16.safetensors")
    save_file({"decoder.conv_in_x_t.weight": torch.zeros(4, 4)}, path,
              metadata={"config": json.dumps({"vae": {"_class_name": "CausalDiffusionVAE"}})})
    with pytest.raises(LTX25Error, match="diffusion video VAE"):
        cv.load_conv_vae(path)


def test_decode_node_refuses_a_diffusion_vae_and_bad_latents(tiny_file, tmp_path):
    """The node names what is wrong: a diffusion VAE (→ use the Diffusion VAE Decode node), a latent with the wrong
    channel count, an audio latent."""
    node = LTX25ConvVAEDecode()
    path = str(tmp_path / "diffusion.safetensors")
    save_file({"decoder.conv_in_x_t.weight": torch.zeros(4, 4)}, path,
              metadata={"config": json.dumps({"vae": {"_class_name": "CausalDiffusionVAE"}})})
    diffusion = Loaded(type("DiffusionVAE", (torch.nn.Module,), {"kind": "diffusion"})(), None, inspect_asset(path))
    args = ("auto", 80, 768, 24, 64, 0.0)
    with pytest.raises(LTX25Error, match="Diffusion VAE Decode"):
        node.decode(diffusion, {"samples": _latent(1, 128, 2, 2, 2)}, *args)
    conv = Loaded(cv.load_conv_vae(tiny_file("conv_vae")), None, inspect_asset(tiny_file("conv_vae")))
    with pytest.raises(LTX25Error, match="channel count is 64"):
        node.decode(conv, {"samples": _latent(1, 64, 2, 2, 2)}, *args)
    with pytest.raises(LTX25Error, match="Audio Decode"):
        node.decode(conv, {"samples": _latent(1, 8, 26, 16)}, *args)


def test_decode_node_points_an_audio_vae_to_the_audio_decoder_not_the_diffusion_one(tiny_file):
    """An audio VAE in the video-VAE slot is named as one ("an audio VAE") and sent to LTX-2.5 Audio Decode; the
    hint for the other video decoder is kept for the diffusion VAE only."""
    from nodes.ltx.audio_vae import load_audio_vae
    path = tiny_file("audio_vae")
    audio = Loaded(load_audio_vae(path, torch.float32), None, inspect_asset(path))
    with pytest.raises(LTX25Error, match="is an audio VAE") as error:
        LTX25ConvVAEDecode().decode(audio, {"samples": _latent(1, 128, 2, 2, 2)}, "auto", 80, 768, 24, 64, 0.0)
    assert "Audio Decode" in str(error.value) and "Diffusion VAE Decode" not in str(error.value), error.value


def test_decode_node_returns_images_and_stats(tiny_file):
    """Through model management (standalone bridge): IMAGE `[F, H, W, 3]` and conv decode stats."""
    loaded = Loaded.register(cv.load_conv_vae(tiny_file("conv_vae")), inspect_asset(tiny_file("conv_vae")))
    out = LTX25ConvVAEDecode().decode(loaded, {"samples": _latent(1, 128, 2, 2, 2)}, "off", 80, 768, 24, 64, 0.0)
    images, stats = out["result"]
    assert images.shape == (9, 64, 64, 3) and stats.decoder == "conv" and stats.seconds > 0
    assert out["ui"]["ltx25_decode_stats"] == [stats.as_dict()]  # what the canvas shows on the node


def test_decode_node_refuses_a_budget_below_the_weights_before_loading_them(tiny_file):
    """A memory_budget_gb the decoder's own weights do not fit in is refused by name before the load: a load for
    it may evict the sampler's transformer, and the decode would fail after it anyway."""
    loaded = Loaded.register(cv.load_conv_vae(tiny_file("conv_vae")), inspect_asset(tiny_file("conv_vae")))
    with pytest.raises(LTX25Error, match="decoder's own") as error:
        LTX25ConvVAEDecode().decode(loaded, {"samples": _latent(1, 128, 2, 2, 2)}, "auto", 80, 768, 24, 64, 1e-6)
    assert error.value.where == "LTX25ConvVAEDecode.memory_budget_gb" and not loaded.patcher.is_loaded()
