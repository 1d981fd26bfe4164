"""The connectors (docs/MODEL.md §4, §13 items 1-3): config, right-pad sort, registers, the binary-mask quirk, the
Connector node. The tiny transformer file carries both connectors (2 layers, 128 registers, 1024 tokens)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.conditioning import LTX25Connector
from nodes.comfy.handles import Loaded
from nodes.ltx.dit import connector as C
from nodes.ltx.files.assets import Kind, inspect_asset
from nodes.ltx.conditioning import TextFeatures
from nodes.ltx.errors import LTX25Error
from nodes.ltx.dit.transformer import SHIPPED_CONFIG
from nodes.ltx.release import GEMMA_VERSION
from nodes.tools.tiny.common import TINY_DIMS
from nodes.tools.tiny.transformer import tiny_config_block

L = 1024
VIDEO_W, AUDIO_W = TINY_DIMS["video_inner"], TINY_DIMS["audio_inner"]


@pytest.fixture(scope="module")
def te_info(tiny_file):
    """A text-encoder AssetInfo with the paired Gemma tag (the TE file itself belongs to another writer)."""
    info = inspect_asset(tiny_file("transformer"))
    return dataclasses.replace(info, kind=Kind.TEXT_ENCODER, gemma_version=GEMMA_VERSION)


def tokens(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, VIDEO_W, generator=g), torch.randn(1, n, AUDIO_W, generator=g)


def features(source, n: int, side: str = "left", pad_value: float = 0.0, seed: int = 0) -> TextFeatures:
    """n valid tokens padded to 1024 on `side`; padded rows hold `pad_value` (the extractor writes zeros)."""
    video_tokens, audio_tokens = tokens(n, seed)
    video, audio = torch.full((1, L, VIDEO_W), pad_value), torch.full((1, L, AUDIO_W), pad_value)
    mask = torch.zeros(1, L, dtype=torch.int64)
    where = slice(L - n, L) if side == "left" else slice(0, n)
    video[:, where], audio[:, where], mask[:, where] = video_tokens, audio_tokens, 1
    return TextFeatures(video, audio, mask, source)


# ---------------------------------------------------------------------------------------------------- config
def test_connector_config_keeps_shipped_max_pos_4096(transformer):
    """The shipped connector_positional_embedding_max_pos [4096] reaches the RoPE (code default is [1])."""
    assert C.ConnectorConfig.from_metadata("shipped", {"config": {"transformer": SHIPPED_CONFIG}}).max_pos == (4096,)
    assert transformer.connectors.config.max_pos == (4096,)
    assert transformer.connectors.video.rope.base_seq_len == 4096 and transformer.connectors.audio.rope.base_seq_len == 4096
    assert transformer.connectors.video.rope.theta == 10000.0, "the connector uses its own theta, not the config's"
    assert transformer.connectors.video.rope.double_precision is True, "frequencies_precision float64"


def test_missing_connector_max_pos_is_refused_not_defaulted():
    """ltx-core's default [1] silently gives angles 4096× too large; a file without the key is refused by name."""
    block = {k: v for k, v in tiny_config_block().items() if k != "connector_positional_embedding_max_pos"}
    with pytest.raises(LTX25Error, match="connector_positional_embedding_max_pos"):
        C.ConnectorConfig.from_metadata("stripped.safetensors", {"config": {"transformer": block}})


@pytest.mark.parametrize("key,value", [("connector_ff_bias", False), ("connector_num_learnable_registers", 64),
                                       ("rope_type", "interleaved"), ("connector_norm_output", False)])
def test_unsupported_connector_values_are_refused(key, value):
    """Values the reference modules cannot express raise LTX25Error naming the key."""
    with pytest.raises(LTX25Error, match=key):
        C.ConnectorConfig.from_metadata("odd.safetensors",
                                        {"config": {"transformer": {**tiny_config_block(), key: value}}})


def test_connector_max_pos_changes_the_output(transformer, te_info):
    """max_pos [4096] vs [1] with the same weights gives a different context: the value is load-bearing."""
    feats = features(te_info, 40)
    wrong = C.LTX25Connectors(dataclasses.replace(transformer.connectors.config, max_pos=(1,)))
    wrong.load_state_dict(transformer.connectors.state_dict())
    right_out = C.run_connectors(transformer, feats)
    wrong_out = C.run_connectors(type("M", (), {"connectors": wrong})(), feats)
    diff = (right_out.video - wrong_out.video).abs().max().item()
    assert diff > 1e-2, f"max_pos did not change the output (max diff {diff})"


# ---------------------------------------------------------------------------------------------------- processor steps
def test_right_pad_order_is_stable_and_idempotent():
    """Valid tokens first in their original order, pads last; an already right-padded mask is left alone."""
    mask = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    order, sorted_mask = C.right_pad_order(mask)
    assert order.tolist() == [[1, 3, 4, 0, 2, 5], [0, 1, 2, 3, 4, 5]]
    assert sorted_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]]


def test_registers_fill_padded_rows_by_absolute_position():
    """Row i of a padded tail gets register i mod R (not i − n_valid); valid rows are untouched."""
    registers = torch.arange(4.0)[:, None].expand(4, 3)         # register r = [r, r, r]
    hidden = torch.full((1, 8, 3), -1.0)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0]])
    out = C.fill_registers(hidden, mask, registers)[0, :, 0]
    assert out.tolist() == [-1, -1, -1, 3, 0, 1, 2, 3], f"got {out.tolist()}"


def test_register_fill_needs_a_multiple_of_128_tokens():
    """1000 tokens cannot tile 128 registers: an LTX25Error, not a silent misalignment."""
    with pytest.raises(LTX25Error, match="multiple of 128"):
        C.fill_registers(torch.zeros(1, 1000, 8), torch.ones(1, 1000), torch.zeros(128, 8))


def test_left_padding_gives_the_same_context_as_right_padding(transformer, te_info):
    """The right-pad sort: a left-padded prompt (Gemma's layout) must give what the same tokens give right-padded.
    Without the sort the valid tokens keep their tail positions and the registers land on the head."""
    left = C.run_connectors(transformer, features(te_info, 37, "left"))
    right = C.run_connectors(transformer, features(te_info, 37, "right"))
    for name in ("video", "audio"):
        diff = (getattr(left, name) - getattr(right, name)).abs().max().item()
        assert diff < 1e-5, f"{name}: left vs right padding differ by {diff}"


def test_padded_rows_are_replaced_whatever_they_hold(transformer, te_info):
    """Registers replace every padded row, so garbage there changes nothing."""
    clean = C.run_connectors(transformer, features(te_info, 50, pad_value=0.0))
    dirty = C.run_connectors(transformer, features(te_info, 50, pad_value=7.0))
    diff = (clean.video - dirty.video).abs().max().item()
    assert diff < 1e-5, f"padded-row content leaked into the context (max diff {diff})"


def test_binary_mask_quirk_keeps_register_rows_in_both_streams(transformer, te_info):
    """The reference's `mask < 1e-6` test is always true: video is multiplied by ones, audio not at all. Masking
    the register rows (a tempting 'fix') would zero what the DiT was trained to attend to."""
    n = 20
    feats = features(te_info, n)
    out = C.run_connectors(transformer, feats)
    order, mask = C.right_pad_order(feats.mask)
    with torch.inference_mode():
        raw_video, _ = C._connect(transformer.connectors.video, C.apply_order(feats.video, order), mask)
        raw_audio, _ = C._connect(transformer.connectors.audio, C.apply_order(feats.audio, order), mask)
    assert torch.equal(out.video, raw_video), "video context was masked"
    assert torch.equal(out.audio, raw_audio), "audio context was masked"
    tail_v, tail_a = out.video[0, n:].abs().amax(-1), out.audio[0, n:].abs().amax(-1)
    assert tail_v.min() > 1e-3 and tail_a.min() > 1e-3, f"register rows zeroed ({tail_v.min()}, {tail_a.min()})"


def test_run_connectors_shapes_mode_and_device(transformer, te_info):
    """[B,1024,Dv]/[B,1024,Da] on the features' device, produced under inference mode (no autograd graph)."""
    out = C.run_connectors(transformer, features(te_info, 10))
    assert out.video.shape == (1, L, VIDEO_W) and out.audio.shape == (1, L, AUDIO_W)
    assert out.video.is_inference() and out.video.device == torch.device("cpu")


def test_feature_width_mismatch_is_refused(transformer, te_info):
    """Features from another projection width name the mismatch."""
    feats = features(te_info, 10)
    bad = TextFeatures(torch.zeros(1, L, VIDEO_W * 2), feats.audio, feats.mask, feats.source)
    with pytest.raises(LTX25Error, match="video feature shape"):
        C.run_connectors(transformer, bad)


# ---------------------------------------------------------------------------------------------------- node
def test_connector_node_runs_and_checks_the_gemma_pairing(transformer, te_info, tiny_file):
    """The node returns LTX25_CONDITIONING, and refuses features from an encoder with another Gemma tag."""
    loaded = Loaded.register(transformer, inspect_asset(tiny_file("transformer")))
    try:
        (cond,) = LTX25Connector().connect(loaded, features(te_info, 12))
        assert cond.video.shape == (1, L, VIDEO_W)
        other = dataclasses.replace(te_info, gemma_version="gemma3-12b")
        with pytest.raises(LTX25Error, match="gemma_version"):
            LTX25Connector().connect(loaded, features(other, 12))
    finally:
        bridge.unload_model(loaded.patcher)  # leave model management as the next test found it
