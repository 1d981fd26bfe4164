"""Shared fixtures: the tiny LTX-2.5 set, written once per test session (each file on first use)."""
from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("LTX25_QUIET", "1")
# compiled code and kernels of the tests go to a throwaway folder, not the user's cache (nodes/ltx/compile_cache.py)
os.environ.setdefault("LTX25_CACHE_DIR", os.path.join(tempfile.gettempdir(), "ltx25_test_compile_cache"))
if not torch.cuda.is_available():
    # Triton reads this when it is imported (comfy_kitchen imports it): without a GPU its interpreter runs our kernel
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

from nodes.tools import tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    """A ComfyUI-style models folder; files appear as `tiny_file` or `tiny_models` write them."""
    return str(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tiny_file(tiny_dir):
    """`tiny_file("conv_vae")` → path of that tiny file (written on first use, seed 0)."""

    def get(component: str) -> str:
        path = tiny.tiny_paths(tiny_dir)[component]
        if not os.path.exists(path):
            tiny.write_tiny(component, path, 0)
        return path

    return get


@pytest.fixture(scope="module")
def transformer_path(tiny_file) -> str:
    return tiny_file("transformer")


@pytest.fixture(scope="module")
def transformer(transformer_path):
    """The tiny transformer in float32, one per test module (tests may change its config or caches)."""
    from nodes.ltx.dit.transformer import load_transformer

    return load_transformer(transformer_path, torch.float32)


@pytest.fixture(scope="session")
def tiny_set(tiny_dir, tiny_file) -> str:
    """The whole tiny set (and the dev template's two extra files), written once."""
    from nodes.tools.tiny.lora import write_tiny_dev_files
    for component in tiny.tiny_paths(tiny_dir):
        tiny_file(component)
    write_tiny_dev_files(tiny_dir)  # the dev transformer and the distilled LoRA of the dev template
    return tiny_dir


@pytest.fixture(scope="module")
def tiny_models(tiny_set) -> str:
    """The tiny set, made the standalone models folder of the bridge for each test module that asks (a test of
    another module may have pointed the bridge at a folder of its own)."""
    from nodes.comfy import bridge as comfy_bridge
    comfy_bridge.set_models_dir(tiny_set)
    return tiny_set


@pytest.fixture(scope="module")
def deep_transformer():
    """A tiny transformer with 5 DiT blocks instead of 2, float32, random weights: enough blocks that streaming
    some of them needs less memory than keeping all (with 2 blocks, two slots are the whole model)."""
    from nodes.ltx.dit.transformer import LTX25Transformer, TransformerConfig
    from nodes.tools.tiny.common import randomize_
    from nodes.tools.tiny.transformer import TINY_WEIGHT_SCALE, tiny_config_block, tiny_metadata

    config = TransformerConfig.from_metadata("deep tiny transformer",
                                             tiny_metadata({**tiny_config_block(), "num_layers": 5}))
    return randomize_(LTX25Transformer(config), 0, "deep_transformer", scale=TINY_WEIGHT_SCALE).float().eval()
