"""The standalone model manager (no ComfyUI): evicts other models when a phase needs the room, and never keeps a
model alive after its last user dropped it."""
from __future__ import annotations

import gc
import weakref

import torch

from nodes.comfy import bridge


class FakePatcher:
    """A patcher whose 'device' is a flag, so eviction can be observed on a CPU-only machine."""

    def __init__(self, size: int) -> None:
        self.size, self.on_device, self.model = size, False, self
        self.load_device, self.on_unload = "fake", None

    def model_size(self) -> int:
        return self.size

    def is_loaded(self) -> bool:
        return self.on_device

    def unload(self) -> None:
        self.on_device = False

    def apply_patches(self) -> bool:
        return False

    def planned_working_memory(self) -> int:
        return 1 << 62  # the fake never re-plans

    def place(self, _memory_required: int) -> None:
        self.on_device = True


def test_loading_a_decoder_evicts_the_transformer_when_memory_is_short(monkeypatch):
    """A 10 GiB card holding an 8 GiB transformer: a 4 GiB decoder evicts it; with room to spare nothing moves. The
    room counted is what placement may use, the free memory less its headroom: a 4 GiB decoder with 1 GiB of work
    beside the 1 GiB headroom also evicts the transformer from a 13.5 GiB card."""
    gib = 2**30
    transformer, decoder = FakePatcher(8 * gib), FakePatcher(4 * gib)
    capacity = 10 * gib
    # the fakes' sizes only: real models that earlier test modules left loaded are not on this imaginary card
    monkeypatch.setattr(bridge.standalone, "free_device_memory",
                        lambda device=None: capacity - sum(p.size for p in (transformer, decoder) if p.on_device))
    bridge.load_models([transformer])
    assert transformer.on_device and bridge.loaded_model_count() >= 1
    bridge.load_models([decoder], memory_required=gib)
    assert decoder.on_device and not transformer.on_device, "the transformer should have been evicted"
    capacity = 100 * gib
    bridge.load_models([transformer])
    assert transformer.on_device and decoder.on_device, "nothing needs evicting when memory is ample"
    bridge.unload_model(decoder)
    capacity = int(13.5 * gib)  # 5.5 GiB free beside the transformer: 4 + 1 of work fit, not with the headroom
    bridge.load_models([decoder], memory_required=gib)
    assert decoder.on_device and not transformer.on_device, "placement's headroom counts when deciding to evict"


def test_dropped_models_are_not_kept_alive_by_the_manager():
    patcher = bridge.make_patcher(torch.nn.Linear(4, 4))
    bridge.load_models([patcher])
    ref = weakref.ref(patcher)
    del patcher
    gc.collect()
    assert ref() is None


def test_interrupt_raises_the_bridge_exception_once():
    bridge.request_interrupt()
    on_step = bridge.step_callback(3, "test")
    try:
        on_step(1, 3)
    except bridge.InterruptError:
        pass
    else:
        raise AssertionError("the interrupt was not raised")
    on_step(2, 3)  # the flag is consumed


def test_unloading_runs_the_models_release_hook():
    """The transformer's CUDA graphs are freed when model management offloads it (standalone patcher)."""
    released = []
    patcher = bridge.make_patcher(torch.nn.Linear(2, 2), on_unload=released.append)
    bridge.load_models([patcher])
    bridge.unload_model(patcher)
    assert released == [patcher.model]
