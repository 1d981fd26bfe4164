"""The text encoder's device option: 'cpu' runs Gemma where it was built, never through model management (no GPU
memory on a small card), with the same features as 'auto'."""
from __future__ import annotations

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.text import LTX25EncodePrompt
from nodes.ltx.errors import LTX25Error
from nodes.ltx.text import encoder as te


def test_cpu_device_skips_model_management_with_the_same_features(tiny_file, monkeypatch):
    loads = []
    real = bridge.load_models
    monkeypatch.setattr(bridge, "load_models", lambda patchers, memory=0: loads.append(memory) or real(patchers, memory))
    path = tiny_file("text_encoder")
    features, loads_after = {}, {}
    for device in ("auto", "cpu"):
        te.clear_caches()
        spec = te.TextEncoderSpec.from_file(path, torch.float32, device)
        (features[device],) = LTX25EncodePrompt().encode(spec, "a heron lifts off the lake")
        loads_after[device] = len(loads)
    assert loads_after == {"auto": 1, "cpu": 1}  # the cpu encode asked model management for nothing
    assert torch.equal(features["auto"].video, features["cpu"].video)
    assert torch.equal(features["auto"].audio, features["cpu"].audio)


def test_unknown_encoder_device_is_refused(tiny_file):
    with pytest.raises(LTX25Error, match="encoder device"):
        te.TextEncoderSpec.from_file(tiny_file("text_encoder"), torch.float32, "tpu")
