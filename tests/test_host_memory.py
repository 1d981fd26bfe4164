"""Each weight lives once in host memory: loaded weights are views of the file's memory map (file-backed pages the
kernel may drop, not a copy), a weight copied off the host gives its mapped pages back, and a text encoder released
after its encode is freed where it is, never copied back to the host first. bench/bench_host_memory.py measures the
same at real widths (docs/PERFORMANCE.md)."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nodes.comfy import bridge, text
from nodes.ltx import streaming
from nodes.ltx.dit.transformer import load_transformer
from nodes.ltx.files import mapped_pages
from nodes.ltx.text import encoder as te

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise: Linux")


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


# ---------------------------------------------------------------------------------------------------- file pages
class _Blocks(torch.nn.Module):
    """Three 2 MiB weights (many pages each), one of them in a streamable block."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(512, 1024, bias=False)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(512, 1024, bias=False) for _ in range(2)])

    def streamable_blocks(self) -> list[torch.nn.ModuleList]:
        return [self.blocks]


def _load_mapped(tmp_path, cls) -> tuple[torch.nn.Module, str, dict]:
    """A `cls` whose weights are views of a safetensors file's map (no page read yet); the path and the values."""
    path = str(tmp_path / "weights.safetensors")
    values = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(i))
              for i, (k, v) in enumerate(cls().state_dict().items())}
    save_file(values, path)
    with torch.device("meta"):
        model = cls()
    with safe_open(path, framework="pt") as f:
        model.load_state_dict({k: f.get_tensor(k) for k in f.keys()}, assign=True)
    return model, path, values


@pytest.fixture
def mapped_model(tmp_path):
    """`_Blocks` whose weights are views of a safetensors file's map, every page read once (as a copy reads it);
    with the file's path and the weights' values."""
    model, path, values = _load_mapped(tmp_path, _Blocks)
    for t in model.parameters():
        t.detach().sum()
    return model, path, values


def _mapped_rss(path: str) -> int:
    """Bytes of `path`'s mappings resident in this process (/proc/self/smaps)."""
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and not fields[0].endswith(":"):  # a mapping's header line: start-end perms offset dev inode path
                inside = len(fields) >= 6 and fields[-1] == real
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def _data_bytes(path: str) -> int:
    with open(path, "rb") as f:
        return os.path.getsize(path) - 8 - int.from_bytes(f.read(8), "little")


@linux_only
def test_weights_placed_on_the_device_give_their_file_pages_back(mapped_model):
    """Once `streaming.place` has copied a weight off the host, the file pages it read are no longer the process's:
    without the release every page of the file stays resident (counted in VmHWM) until the placement ends — Gemma's
    24 GiB beside the evicted transformer's pinned copies. Placed on meta (the copy reads nothing there; the pages
    were read by the fixture, as a device copy reads them)."""
    model, path, values = mapped_model
    # views of the weights kept alive keep the mapping (unmapped with its last view, it would prove nothing), as the
    # placement in progress does with the weights still to copy
    views = [t.detach() for t in model.parameters()]
    before = _mapped_rss(path)
    assert before >= 0.9 * _data_bytes(path), f"only {before} bytes of the read file resident: nothing to check"
    streaming.place(model, torch.device("meta"), 1 << 40)
    assert all(t.is_meta for t in model.parameters())
    after = _mapped_rss(path)
    assert after <= 0.02 * before, f"{after} of {before} bytes of the file still resident after the placement"
    assert torch.equal(views[0], values["head.weight"])


@linux_only
def test_weights_copied_by_someone_else_give_their_file_pages_back(mapped_model):
    """`release_moved` (after ComfyUI's placement, which swaps a parameter's data for its device copy): the views the
    module no longer holds give their pages back; the one it still holds on the host (a block left there) keeps
    them, and its values."""
    model, path, values = mapped_model
    files = mapped_pages.FileMappings.current()
    views = streaming.mapped_views(model, files)
    assert len(views) == 3
    model.head.to("meta")
    model.blocks[0].to("meta")
    released = streaming.release_moved(model, views, files)
    block_bytes = 1024 * 512 * 4
    assert 2 * block_bytes - 4 * mapped_pages.PAGE <= released <= 2 * block_bytes, f"{released} bytes released"
    left = _mapped_rss(path)
    assert block_bytes - mapped_pages.PAGE <= left <= block_bytes + 8 * mapped_pages.PAGE, \
        f"{left} bytes resident, expected one block's ({block_bytes})"
    assert torch.equal(model.blocks[1].weight, values["blocks.1.weight"])


@linux_only
def test_a_released_view_reads_the_file_again(mapped_model):
    """A view whose pages were released and that someone still reads (ComfyUI's backup of a patched weight) reads
    the file's values again, bit for bit: the pages come back from the page cache on the next touch."""
    model, path, values = mapped_model
    files = mapped_pages.FileMappings.current()
    weight = model.head.weight.detach()
    assert files.release(weight) >= weight.numel() * 4 - 2 * mapped_pages.PAGE
    assert _mapped_rss(path) <= 0.7 * _data_bytes(path)
    assert torch.equal(weight, values["head.weight"])


@linux_only
def test_pages_written_through_a_view_are_kept(mapped_model):
    """A weight merged in place on the CPU (a LoRA) writes the process's own copy of the file's pages: releasing
    those would silently bring back the file's values (MADV_DONTNEED on a private mapping). The pages written stay;
    the others are released."""
    model, path, values = mapped_model
    weight = model.head.weight.detach()
    with torch.no_grad():
        weight[:256].mul_(2)  # a quarter of the weight, whole pages and more
    files = mapped_pages.FileMappings.current()
    released = files.release(weight)
    expected = values["head.weight"].clone()
    expected[:256] *= 2
    assert torch.equal(weight, expected), "values written through the view were lost"
    assert 0.7 * weight.numel() * 4 <= released <= 0.76 * weight.numel() * 4, f"{released} bytes released"


def test_nothing_is_released_where_madvise_is_missing(mapped_model, monkeypatch):
    """Elsewhere than Linux (no madvise) releasing is a no-op and placing works as before."""
    model, _, values = mapped_model
    monkeypatch.setattr(mapped_pages, "_MADVISE", None)
    files = mapped_pages.FileMappings.current()
    assert files.release(model.head.weight) == 0
    streaming.place(model, torch.device("meta"), 1 << 40)
    assert all(t.is_meta for t in model.parameters())


class _NoBlocks(torch.nn.Module):
    """A decoder's shape of model: weights, no streamable blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = torch.nn.Linear(512, 1024, bias=False)
        self.conv_out = torch.nn.Linear(1024, 512, bias=False)


class _ThreeBlocks(_Blocks):
    def __init__(self) -> None:
        super().__init__()
        self.blocks.append(torch.nn.Linear(512, 1024, bias=False))


@linux_only
def test_an_evicted_model_without_blocks_takes_its_file_back_instead_of_a_host_copy(tmp_path):
    """A decoder evicted for another model (the text encoder's next prompt, on a small card) goes back to its file's
    views: nothing copied, no host memory held (a pinned copy would stay in the process for good). Placed again, it
    reads the same values. Placed on meta (the copy reads nothing), evicted to the CPU: a tensor without a
    host copy could not come back from meta at all."""
    model, path, values = _load_mapped(tmp_path, _NoBlocks)
    for _ in range(2):
        streaming.place(model, torch.device("meta"), 1 << 40, keep_host=True)
        assert all(t.is_meta for t in model.parameters())
        streaming.offload(model, "cpu", keep_host=True)
        assert _copied_keys(model, path) == [], "a weight came back as a copy, not as its file's view"
        assert all(torch.equal(t, values[k]) for k, t in model.state_dict().items())


@linux_only
@pytest.mark.parametrize("pin_streamed", [False, True], ids=["text_encoder", "default"])
def test_a_model_that_pins_nothing_streams_its_blocks_from_the_file_pages(tmp_path, pin_streamed):
    """The text encoder (`PIN_STREAMED = False`) streams the layers that do not fit from its file: each streamed
    copy gives its pages back, so after a forward the file's streamed pages are not the process's (nor copied into
    pinned memory, which on a small card sat beside the evicted transformer's pinned copy). A model that pins
    streams from its pinned copy (on the CPU nothing is pinned, so there its file pages stay mapped). Streamed onto
    the CPU, where the slot copies really read the pages; the outputs are the file's weights' either way."""
    model, path, values = _load_mapped(tmp_path, _ThreeBlocks)
    model.PIN_STREAMED = pin_streamed
    block = 1024 * 512 * 4
    plan = streaming.place(model, torch.device("cpu"), int(3.5 * block))  # the head and two slots: every block streams
    assert plan.resident_indices == () and streaming.is_streaming(model)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(9))
    for i in range(3):
        assert torch.equal(model.blocks[i](x), x @ values[f"blocks.{i}.weight"].T)
    left = _mapped_rss(path)
    if pin_streamed:
        assert left >= 3 * block, f"{left} bytes resident: the default streamer was expected to keep its pages"
    else:
        assert left <= 0.02 * 3 * block, f"{left} bytes of the file resident after streaming every block"
