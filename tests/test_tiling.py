"""The tiling both video decoders share: one request with the same widgets on both decode nodes, the memory budget's
meaning, the budget search's choice, the ramps, and each decoder's working-memory estimate."""
from __future__ import annotations

import inspect

import pytest
import torch

from nodes.comfy.decode_conv import LTX25ConvVAEDecode
from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
from nodes.ltx.decode import conv_vae as cv
from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest, ramp_weights, search_budget
from nodes.ltx.errors import LTX25Error

WIDGETS = ["tiling", "tile_frames", "tile_pixels", "overlap_frames", "overlap_pixels", "memory_budget_gb"]
GiB = 2**30


def test_both_decode_nodes_take_the_same_tiling_widgets():
    """Same names, order, kinds and ranges on both nodes, and each node hands them to `TilingRequest` in that order:
    a widget renamed on one node only, or a decode() that swaps two, breaks saved workflows of that node."""
    specs = []
    for node in (LTX25ConvVAEDecode, LTX25DiffusionVAEDecode):
        required = node.INPUT_TYPES()["required"]
        tiling = [name for name in required if name in WIDGETS]
        assert tiling == WIDGETS, tiling
        assert list(inspect.signature(node.decode).parameters)[-len(WIDGETS):] == WIDGETS
        specs.append({name: (required[name][0], {k: v for k, v in required[name][1].items()
                                                  if k in ("min", "max", "step")}) for name in WIDGETS})
    assert specs[0] == specs[1]
    assert list(inspect.signature(TilingRequest).parameters) == ["mode", *WIDGETS[1:]]


@pytest.mark.parametrize("request_,field", [
    (TilingRequest("tiled"), "tiling"),
    (TilingRequest(tile_pixels=-32), "tile_pixels"),
    (TilingRequest(overlap_frames=8.5), "overlap_frames"),
    (TilingRequest(memory_budget_gb=-1.0), "memory_budget_gb"),
    (TilingRequest("manual", tile_pixels=64, overlap_pixels=64), "overlap_pixels"),
    (TilingRequest("manual", tile_frames=16, overlap_frames=24), "overlap_frames"),
])
def test_unusable_requests_name_their_widget(request_, field):
    """Each refusal names the node input to change (`<node>.<widget>`), not an internal field."""
    with pytest.raises(LTX25Error) as info:
        request_.check("Node")
    assert info.value.where == f"Node.{field}", str(info.value)


def test_memory_budget_counts_the_weights_and_zero_means_what_is_free():
    """A budget in GiB covers the decoder's weights too, so the decode may plan with the rest; 0 plans with the free
    device memory; a budget the weights alone fill is refused (on the memory_budget_gb widget)."""
    assert TilingRequest().budget_bytes(GiB, 5 * GiB, "N") == 5 * GiB
    assert TilingRequest(memory_budget_gb=3.0).budget_bytes(GiB, 5 * GiB, "N") == 2 * GiB
    with pytest.raises(LTX25Error, match="weights") as info:
        TilingRequest(memory_budget_gb=1.0).budget_bytes(GiB, 5 * GiB, "N")
    assert info.value.where == "N.memory_budget_gb"


def test_budget_search_takes_the_least_rank_that_fits_and_the_first_of_equals():
    """Candidates over the budget never win however well they rank; among equal ranks the first (the caller lists
    larger tiles first) wins; the smallest estimate is reported for when nothing fits."""
    candidates = [("a", 9, 0), ("b", 5, 2), ("c", 4, 1), ("d", 3, 1), ("e", 2, 3)]
    best, smallest = search_budget(candidates, lambda c: c[1], 5, lambda c: c[2])
    assert best[0] == "c" and smallest[0] == "e"
    assert search_budget(candidates, lambda c: c[1], 1, lambda c: c[2]) == (None, candidates[-1])


def test_ramps_of_two_neighbours_sum_to_one_across_their_overlap():
    """A tile falling over R pixels and its neighbour rising over the same R sum to exactly one there; a skipped
    first pixel (the conv decoder's causal frame) weighs 0 and the rise starts after it."""
    for r in (1, 2, 7, 40):
        falling, rising = ramp_weights(r + 5, 0, r), ramp_weights(r + 5, r, 0)
        assert torch.equal(falling[-r:] + rising[:r], torch.ones(r, dtype=torch.float64))
    skipped = ramp_weights(6, 3, 0, skip_first=True)
    assert skipped.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("load,decoder", [(cv.load_conv_vae, "conv_vae"), (dv.load_diffusion_vae, "diffusion_vae")])
def test_working_memory_is_the_untiled_decode_unless_manual_tiles_are_asked_for(tiny_file, load, decoder):
    """What each decode node asks model management to free: the untiled decode's working memory for auto and off
    (auto then tiles within what is really free), the smaller manual tiles' for manual."""
    vae = load(tiny_file(decoder), torch.float32)
    engine = cv if decoder == "conv_vae" else dv
    shape = (1, 128, 5, 8, 8)
    untiled = engine.working_memory(vae, shape)
    manual = TilingRequest("manual", 16, 64, 8, 32)
    assert engine.working_memory(vae, shape, TilingRequest("auto")) == untiled
    assert engine.working_memory(vae, shape, TilingRequest("off")) == untiled
    assert 0 < engine.working_memory(vae, shape, manual) < untiled
