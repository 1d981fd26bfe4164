"""Weight streaming (nodes/ltx/streaming.py): the placement plan for a table of budgets, a clear error when nothing
fits, and streamed runs of the tiny transformer and text encoder that are bit-identical to resident runs while the
streamed blocks' weights really pass through the two device slots."""
from __future__ import annotations

import copy

import pytest
import torch

from nodes.ltx import streaming
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.text import encoder as te
from nodes.tools.tiny.common import TINY_DIMS

GIB = 2**30


@pytest.mark.parametrize("budget_gib, resident, indices", [
    (60.0, 4, (0, 1, 2, 3)),  # everything fits with its working memory: fully resident, no slots
    (40.0, 4, (0, 1, 2, 3)),  # exactly fits: 2 GiB other + 4 × 8 GiB blocks + 6 GiB working
    (39.0, 1, (1,)),          # floor 2 + 2 slots × 8 + 6 = 24, one block more is 32, a second would be 40
    (24.0, 0, ()),            # the floor itself: every block streams
])
def test_plan_keeps_as_many_blocks_as_fit(budget_gib, resident, indices):
    """Weights other than blocks, two slots of the largest block and the working memory always fit first; then
    blocks while the budget allows. A wrong slot count or order of accounting moves these numbers."""
    plan = streaming.plan_placement(2 * GIB, [8 * GIB] * 4, 6 * GIB, int(budget_gib * GIB))
    assert plan.resident_blocks == resident and plan.resident_indices == indices
    assert plan.streamed_bytes == (4 - resident) * 8 * GIB
    assert plan.slot_bytes == (0 if resident == 4 else 16 * GIB)
    assert plan.peak_bytes <= budget_gib * GIB


@pytest.mark.parametrize("blocks, streamed", [
    (48, 25),  # the 24 GiB card's plan
    (48, 12),
    (5, 3),
])
def test_streamed_blocks_are_spread_between_resident_ones(blocks, streamed):
    """The copy of a streamed block overlaps the compute of the resident blocks before it only if streamed blocks
    do not bunch up at the end: the gaps between streamed blocks are all blocks/streamed, rounded down or up."""
    size = 1 * GIB
    budget = 2 * size + (blocks - streamed) * size  # slots + the resident blocks, nothing else
    plan = streaming.plan_placement(0, [size] * blocks, 0, budget)
    chosen = [i for i in range(blocks) if i not in plan.resident_indices]
    assert len(chosen) == streamed
    gaps = [b - a for a, b in zip(chosen, chosen[1:])]
    assert min(gaps) >= blocks // streamed and max(gaps) <= -(-blocks // streamed)
    assert chosen[0] <= blocks // streamed and blocks - 1 - chosen[-1] <= blocks // streamed


def test_plan_refuses_with_numbers_when_even_streaming_cannot_fit():
    """Below the floor (other weights + two slots + working memory) the error says what was needed and what was
    available, in GiB, and what to do."""
    with pytest.raises(LTX25Error) as caught:
        streaming.plan_placement(2 * GIB, [8 * GIB] * 4, 6 * GIB, 20 * GIB, where="LTX25DistilledSampler.model")
    message = str(caught.value)
    assert "LTX25DistilledSampler.model" in message and "24.00 GiB" in message and "20.00 GiB" in message


def _inputs():
    g = torch.Generator().manual_seed(3)
    video, audio = torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g)
    cond = Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g))
    return video, audio, cond


def _watch_slots(model: torch.nn.Module, seen: list) -> list:
    """Forward hooks recording, for each streamed block, whether its weights lay in a slot during its forward and
    equalled the host copy."""
    streamer = streaming.streamer_of(model)
    hooks = []
    for index in streamer.streamed:
        def check(_module, _args, index=index):
            slots = [(s.data_ptr(), s.data_ptr() + s.numel()) for s in streamer.slots]
            for table, name, host, _ in streamer.streamed[index].entries:
                live = table[name]
                inside = any(lo <= live.data_ptr() < hi for lo, hi in slots)
                seen.append((index, inside, torch.equal(live, host)))
        hooks.append(streamer.blocks[index].register_forward_pre_hook(check))
        # registered after the streamer's own pre-hook, so it sees the swapped-in tensors
    return hooks


def test_streamed_transformer_is_bit_identical_to_resident(deep_transformer):
    """A budget that keeps no block resident: every block's weights pass through the slots (checked inside each
    forward), outside a forward the module holds its host tensors again, and the x0 equals the resident run's
    exactly."""
    model = copy.deepcopy(deep_transformer)
    video, audio, cond = _inputs()
    want = T.denoise(model, video, audio, 0.6, cond, 24.0)
    blocks = streaming.blocks_of(model)
    other = streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(model)]) - sum(
        streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(b)]) for b in blocks)
    largest = max(streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(b)]) for b in blocks)
    plan = streaming.place(model, torch.device("cpu"), other + 2 * largest, where="test")
    assert plan.resident_blocks == 0 and streaming.is_streaming(model)
    seen: list = []
    hooks = _watch_slots(model, seen)
    for _ in range(2):  # the second forward reuses the block prefetched at the end of the first
        got = T.denoise(model, video, audio, 0.6, cond, 24.0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for hook in hooks:
        hook.remove()
    assert len(seen) == 2 * sum(len(streaming.streamer_of(model).streamed[i].entries) for i in range(len(blocks)))
    assert all(inside and equal for _, inside, equal in seen), seen[:4]
    host_ptrs = {e[2].data_ptr() for s in streaming.streamer_of(model).streamed.values() for e in s.entries}
    block_ptrs = {t.data_ptr() for b in blocks for _, _, t in streaming._owned_tensors(b)}
    assert block_ptrs == host_ptrs  # between forwards the blocks hold their host tensors


def test_partly_resident_transformer_streams_only_the_rest(deep_transformer):
    """With room for two blocks beside the slots, blocks 1 and 3 stay resident (no hooks) and 0, 2, 4 stream
    (spread between them); same x0; removing the streamer leaves a working module."""
    model = copy.deepcopy(deep_transformer)
    video, audio, cond = _inputs()
    want = T.denoise(model, video, audio, 0.3, cond, 24.0)
    sizes = [streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(b)])
             for b in streaming.blocks_of(model)]
    total = streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(model)])
    plan = streaming.place(model, torch.device("cpu"), total - sum(sizes[2:]) + 2 * max(sizes), where="test")
    assert plan.resident_indices == (1, 3) and sorted(streaming.streamer_of(model).streamed) == [0, 2, 4]
    got = T.denoise(model, video, audio, 0.3, cond, 24.0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    streaming.remove_streamer(model)
    assert not streaming.is_streaming(model)
    again = T.denoise(model, video, audio, 0.3, cond, 24.0)
    assert torch.equal(again[0], want[0])


def test_streamed_text_encoder_is_bit_identical_to_resident(tiny_file):
    """Gemma's decoder layers stream like the DiT's blocks: the projected features are unchanged. They stream from
    where they are, not from a pinned copy (`PIN_STREAMED`: one forward per prompt; tests/test_host_memory.py)."""
    spec = te.TextEncoderSpec.from_file(tiny_file("text_encoder"), torch.float32)
    module = te.load_text_encoder(spec)
    tokens = spec.tokenizer.encode(["a fox in the snow", "waves at dusk"])
    want = te.run_encoder(module, tokens.ids, tokens.mask)
    layers = streaming.blocks_of(module)
    assert len(layers) == TINY_DIMS["text_layers"]
    largest = max(streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(b)]) for b in layers)
    total = streaming.tensor_bytes([t for _, _, t in streaming._owned_tensors(module)])
    plan = streaming.place(module, torch.device("cpu"), total - 3 * largest + 2 * largest, where="test")
    assert 0 < plan.resident_blocks < len(layers)
    assert not streaming.streamer_of(module).pin, "the text encoder's streamed layers would be pinned"
    got = te.run_encoder(module, tokens.ids, tokens.mask)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_picked_tensors_stream_with_their_transform_applied_to_each_device_copy(deep_transformer):
    """`adopt` with a `select` (here: the feed-forward layers of blocks 1 and 3, as a placement made elsewhere might
    leave them) and a `transform` (here: adding a delta, as a weight patch does): only those tensors leave for host
    memory, the x0 equals a resident model whose weights carry the delta, and the host copies stay the originals in
    every forward. Fails when a transform is skipped, applied twice or written into the host copy."""
    model = copy.deepcopy(deep_transformer)
    video, audio, cond = _inputs()
    blocks = streaming.blocks_of(model)
    picked = {id(m) for i in (1, 3) for m in blocks[i].ff.modules()}
    deltas = {id(m): torch.full_like(m.weight, 1e-3) for m in blocks[1].ff.modules() if isinstance(m, torch.nn.Linear)}
    patched = copy.deepcopy(model)
    for block, twin in zip(blocks, streaming.blocks_of(patched)):
        for module, target in zip(block.modules(), twin.modules()):
            if id(module) in deltas:
                target.weight.data += deltas[id(module)]
    want = T.denoise(patched, video, audio, 0.6, cond, 24.0)
    originals = {name: t.clone() for name, t in model.state_dict().items()}
    transform = (lambda owner, name: (lambda w, d=deltas[id(owner)]: w.add_(d))
                 if name == "weight" and id(owner) in deltas else None)
    streamer = streaming.adopt(model, torch.device("cpu"), select=lambda owner, _n, _t: id(owner) in picked,
                               transform=transform)
    assert sorted(streamer.streamed) == [1, 3] and sum(len(s.transforms) for s in streamer.streamed.values()) == \
        len(deltas)
    for _ in range(2):  # the second forward copies the host originals again and patches them once more
        got = T.denoise(model, video, audio, 0.6, cond, 24.0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(torch.equal(t, originals[name]) for name, t in model.state_dict().items())


def test_a_cpu_device_with_an_index_is_the_cpu():
    """`cpu:0` (a compute device some callers name) compares equal to where CPU tensors live, so nothing is taken for
    off-device and copied."""
    assert streaming._concrete(torch.device("cpu", 0)) == torch.zeros(1).device
