"""Each weight lives once in host memory: loaded weights are views of the file's memory map (file-backed pages the
kernel may drop, not a copy), and a text encoder released after its encode is freed where it is, never copied back
to the host first. bench/bench_host_memory.py measures the same at real widths (docs/PERFORMANCE.md)."""
from __future__ import annotations

import os

import pytest
import torch

from nodes.comfy import bridge, text
from nodes.ltx import streaming
from nodes.ltx.dit.transformer import load_transformer
from nodes.ltx.text import encoder as te


def _mapped(path: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `path`."""
    real, ranges = os.path.realpath(path), []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[-1] == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _copied_keys(module: torch.nn.Module, path: str) -> list[str]:
    """State-dict keys whose bytes are not inside the file's mapping (a copy made while loading)."""
    ranges = _mapped(path)
    assert ranges, f"{path} is not memory-mapped at all: the loader read it into memory"
    return [key for key, t in module.state_dict().items()
            if t.numel() and not any(a <= t.data_ptr() < b for a, b in ranges)]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["as_stored", "bf16"])
def test_loaded_transformer_weights_are_views_of_the_file_map(transformer_path, dtype):
    """A bf16 file loaded 'as stored' or in bf16 keeps every weight in the file's memory map: no anonymous copy
    beside the mapped pages (a `.clone()`, `load_file` into memory or a needless cast in the read would hold the
    22B transformer twice on the host)."""
    model = load_transformer(transformer_path, dtype)
    copied = _copied_keys(model, transformer_path)
    assert not copied, f"{len(copied)} weights copied out of the file map, e.g. {copied[:3]}"


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["as_stored", "bf16"])
def test_loaded_text_encoder_weights_are_views_of_the_file_map(tiny_file, dtype):
    """The same for Gemma: its 24 GB must not exist twice on the host while it is read and placed."""
    path = tiny_file("text_encoder")
    module = te.load_text_encoder(te.TextEncoderSpec.from_file(path, dtype))
    copied = _copied_keys(module, path)
    assert not copied, f"{len(copied)} weights copied out of the file map, e.g. {copied[:3]}"


def test_released_text_encoder_is_not_copied_back_to_the_host(tiny_file, monkeypatch):
    """Encode Prompt's hooks on a device whose tensors cannot be copied out (meta): placing works, and the release
    must free the weights where they are. Unloading instead (offload with pinned host copies) would copy the whole
    encoder into new host memory only to drop it, beside the transformer's host copies; on meta that copy raises."""
    monkeypatch.setattr(bridge.models, "compute_device", lambda: torch.device("meta"))  # the standalone patcher's
    spec = te.TextEncoderSpec.from_file(tiny_file("text_encoder"), None)
    module = te.load_text_encoder(spec)
    load, release = text._placement(spec, 1)
    handle = load(module, None)
    assert all(t.is_meta for t in module.parameters()), "the hook should have placed the encoder on the device"
    release(handle)
    host = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if not t.is_meta]
    assert not host, f"the released encoder still holds host tensors, e.g. {host[:3]}"
    assert bridge.loaded_model_count() == 0, "the released encoder is still registered as loaded"


def test_discard_drops_the_streamer_and_the_host_copies():
    """`streaming.discard` leaves nothing of the weights: no host copies kept for a later placement, no streamer
    whose slots and pinned blocks would outlive the model's use."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    weight = model[0].weight
    streaming._host_copies(model)[id(weight)] = (weight, weight.detach().clone())
    streaming.BlockStreamer([model[1]], torch.device("cpu"), force_stream=[model[1]]).install(model)
    streaming.discard(model)
    assert streaming.streamer_of(model) is None and "_ltx25_host_copies" not in vars(model)
    assert all(t.is_meta for t in model.state_dict().values())
