"""A decode that does not fit untiled beside the loaded models tiles to fit beside them rather than evicting them,
when the tiles' extra work is bounded (tiling.working_memory_request): on a small card the evicted model is the
sampler's transformer, placed again and its CUDA graphs captured again on every run."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.decode_conv import LTX25ConvVAEDecode
from nodes.comfy.handles import Loaded
from nodes.ltx.decode import conv_vae as cv
from nodes.ltx.decode import tiling
from nodes.ltx.decode.tiling import TilingRequest, working_memory_request
from nodes.ltx.device_memory import weight_bytes
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from test_bridge import FakePatcher as ResidentModel  # a model occupying fake device memory

GIB = 2**30
LATENT = (1, 128, 17, 4, 4)  # long enough for temporal tiles of bounded extra work on the tiny decoder


def _card(monkeypatch, capacity: int) -> None:
    """A fake device of `capacity` bytes for the standalone manager and the decode's own planning."""
    live = bridge.standalone._standalone_live

    def free(device=None) -> int:
        return capacity - sum(p.size for p in live() if isinstance(p, ResidentModel) and p.on_device)
    monkeypatch.setattr(bridge.standalone, "free_device_memory", free)
    monkeypatch.setattr(bridge, "free_device_memory", free)


def test_the_request_is_untiled_unless_tiles_fit_beside_the_loaded_models_with_bounded_work():
    auto, untiled = TilingRequest(), 10 * GIB
    beside = {4 * GIB: (3 * GIB, 1.4), 2 * GIB: (1.5 * GIB, 2.6)}
    ask = lambda request, spare: working_memory_request(request, untiled, spare, beside.get)  # noqa: E731
    assert ask(auto, 12 * GIB) == untiled, "it fits untiled: nothing to evict, nothing to tile"
    assert ask(auto, 4 * GIB) == 3 * GIB, "tiles of bounded work fit beside the loaded models"
    assert ask(auto, 2 * GIB) == untiled, "tiles doing 2.6 times the work: evicting is cheaper"
    assert ask(auto, 1 * GIB) == untiled, "no tiles fit: evict for the untiled decode as before"
    for chosen in (TilingRequest("off"), TilingRequest("manual"), TilingRequest(memory_budget_gb=12.0)):
        assert ask(chosen, 4 * GIB) == untiled, f"{chosen}: the user's choice is not second-guessed"


def test_spare_memory_is_what_a_load_gets_without_evicting(monkeypatch):
    """`spare_device_memory` and the standalone manager's eviction agree: a request of the spare bytes evicts
    nothing, one byte more evicts the transformer."""
    transformer, decoder = ResidentModel(8 * GIB), ResidentModel(2 * GIB)
    _card(monkeypatch, 16 * GIB)
    bridge.load_models([transformer])
    spare = bridge.spare_device_memory(decoder)
    assert spare == 16 * GIB - 8 * GIB - bridge.standalone.PLACEMENT_HEADROOM - 2 * GIB
    bridge.load_models([decoder], memory_required=spare)
    assert transformer.on_device and decoder.on_device
    bridge.unload_model(decoder)
    bridge.load_models([decoder], memory_required=spare + 1)
    assert not transformer.on_device, "a byte more than the spare memory evicts"
    bridge.unload_model(decoder)


@pytest.fixture
def conv(tiny_file):
    return Loaded.register(cv.load_conv_vae(tiny_file("conv_vae")), inspect_asset(tiny_file("conv_vae")))


@pytest.mark.parametrize("bounded", [True, False])
def test_conv_decode_tiles_beside_the_transformer_instead_of_evicting_it(conv, monkeypatch, bounded):
    """A card with room for the transformer and 70 % of the untiled decode: the decode keeps the transformer and
    tiles within that room, not within the free memory's reserve too; when tiles doing that much work are not
    allowed, the transformer is evicted and the decode runs untiled, as before."""
    untiled = cv.working_memory(conv.module, LATENT, TilingRequest())
    beside = cv.tiles_within(conv.module, LATENT, TilingRequest(), int(0.7 * untiled))
    assert beside is not None and 1.0 < beside[1] <= tiling.MAX_WORK_TO_KEEP_LOADED, beside
    if not bounded:
        monkeypatch.setattr(tiling, "MAX_WORK_TO_KEEP_LOADED", beside[1] - 0.01)
    transformer = ResidentModel(8 * GIB)
    _card(monkeypatch, 8 * GIB + bridge.standalone.PLACEMENT_HEADROOM + int(0.7 * untiled))
    bridge.load_models([transformer])
    latent = {"samples": torch.randn(LATENT, generator=torch.Generator().manual_seed(3))}
    images, stats = LTX25ConvVAEDecode().decode(conv, latent, "auto", 80, 768, 24, 64, 0.0)["result"]
    assert transformer.on_device is bounded, "kept loaded when the tiles' work is bounded, else evicted"
    assert (stats.tile_count > 1) is bounded, stats
    assert images.shape == (129, 128, 128, 3)
    planned = stats.extra["estimate_bytes"]
    assert planned <= int(0.7 * untiled) if bounded else planned == untiled, "tiles planned beside the transformer"
    bridge.unload_model(transformer)


def test_free_memory_leaves_out_cuda_graph_pools(monkeypatch):
    """Idle memory in a CUDA graph's private pool (a kept sampler's captured intermediates) is reserved and not
    allocated, but no other work can allocate from it: planning a decode with it ran out of memory on a 24 GiB card.
    Faked allocator state: 2 GiB driver-free, 5 GiB reserved of which 1 allocated; of the 4 idle, 1.5 sit in a
    graph's pool."""
    from nodes.ltx import device_memory
    segments = [{"device": 0, "segment_pool_id": (0, 0), "total_size": 3 * GIB, "allocated_size": int(0.5 * GIB)},
                {"device": 0, "segment_pool_id": (1, 0), "total_size": 2 * GIB, "allocated_size": int(0.5 * GIB)},
                {"device": 1, "segment_pool_id": (2, 0), "total_size": 9 * GIB, "allocated_size": 0}]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * GIB, 24 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *args, **kwargs: segments)
    cuda = torch.device("cuda", 0)
    assert device_memory.graph_pool_idle_bytes(cuda) == int(1.5 * GIB)
    assert device_memory.free_bytes(cuda) == 2 * GIB + 4 * GIB - int(1.5 * GIB)


@pytest.mark.parametrize("bounded", [True, False])
def test_diffusion_decode_tiles_beside_the_transformer_instead_of_evicting_it(tiny_file, monkeypatch, bounded):
    """As the conv decode: the diffusion decoder keeps the transformer when its tiles fit beside it doing bounded
    extra work (its overlaps, the decoder's receptive field, make that work larger), else evicts it as before."""
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.kernels.na_attention import make_processor
    path = tiny_file("diffusion_vae")
    vae = Loaded.register(dv.load_diffusion_vae(path, torch.float32), inspect_asset(path))
    latent_shape, processor = (1, 128, 9, 6, 6), make_processor("auto", torch.device("cpu"), "test")
    request = dv.default_request(vae.module)
    untiled = dv.working_memory(vae.module, latent_shape, request, processor, True)  # CPU: the frames stay there
    assert untiled - dv.working_memory(vae.module, latent_shape, request, processor) == 65 * 192 * 192 * 3 * 4, \
        "the untiled request counts the float32 frames kept on the device, as the tiles' does"
    room = int(0.7 * untiled)
    beside = dv.tiles_within(vae.module, latent_shape, request, room, processor, True)
    assert beside is not None and beside[0] <= room and 1.0 < beside[1] <= tiling.MAX_WORK_TO_KEEP_LOADED, beside
    if not bounded:
        monkeypatch.setattr(tiling, "MAX_WORK_TO_KEEP_LOADED", beside[1] - 0.01)
    transformer = ResidentModel(8 * GIB)
    _card(monkeypatch, 8 * GIB + bridge.standalone.PLACEMENT_HEADROOM + weight_bytes(vae.module) + room)
    bridge.load_models([transformer])
    latent = {"samples": torch.randn(latent_shape, generator=torch.Generator().manual_seed(4))}
    frames, pixels = request.overlap_frames, request.overlap_pixels
    images, stats = LTX25DiffusionVAEDecode().decode(vae, latent, "auto", 0, 0, "auto", 80, 512, frames, pixels,
                                                     0.0)["result"]
    assert transformer.on_device is bounded, "kept loaded when the tiles' work is bounded, else evicted"
    assert (stats.tile_count > 1) is bounded, stats
    assert images.shape == (65, 192, 192, 3)
    assert stats.extra["budget_bytes"] <= room if bounded else stats.extra["budget_bytes"] > untiled
    bridge.unload_model(transformer)


def test_tiles_within_says_none_fit_only_for_a_budget_below_the_smallest_tiles(tiny_file):
    """`tiles_within` answers None (evict, then decode) when no tiles fit the room, and lets any other planning
    error through: an overlap below the decoder's reach is the user's input to fix, not a reason to evict."""
    from nodes.ltx.decode import diffusion_vae as dv  # as the other diffusion tests here import it
    path = tiny_file("diffusion_vae")
    vae = dv.load_diffusion_vae(path, torch.float32)
    latent_shape, request = (1, 128, 9, 6, 6), dv.default_request(vae)
    assert dv.tiles_within(vae, latent_shape, request, 1) is None
    min_frames, _ = vae.config.geometry().min_overlap
    with pytest.raises(LTX25Error, match="the tile overlap"):
        dv.tiles_within(vae, latent_shape, replace(request, overlap_frames=min_frames - 1), 1)
