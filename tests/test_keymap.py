"""Key maps and strict loading: renames anchored at dot boundaries, fused-tensor splits, drop lists, full-coverage
errors, and the inverse map the tiny writer relies on."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import Drop, KeyMap, Rename, Split, load_strict


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.norm_q = nn.RMSNorm(4)
        self.register_buffer("inv_freq", torch.zeros(2), persistent=False)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([Attn(), Attn()])


MAP = KeyMap(
    "test net",
    renames=(Rename("model.diffusion_model.", ""), Rename("patchify_proj", "proj_in"),
             Rename("transformer_blocks", "blocks"), Rename("q_norm", "norm_q", anywhere=True)),
    splits=(Split("qkv", ("to_q", "to_k", "to_v")),),
    drops=(Drop(r"model\.diffusion_model\.type_emb", "unused by every implementation"),),
)


def native_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {"model.diffusion_model.patchify_proj.weight": torch.randn(4, 3, generator=g),
             "model.diffusion_model.patchify_proj.bias": torch.randn(4, generator=g),
             "model.diffusion_model.type_emb": torch.randn(8, generator=g)}
    for i in range(2):
        p = f"model.diffusion_model.transformer_blocks.{i}."
        state |= {p + "qkv.weight": torch.randn(12, 4, generator=g), p + "qkv.bias": torch.randn(12, generator=g),
                  p + "q_norm.weight": torch.randn(4, generator=g)}
    return state


def init_buffers(module: nn.Module) -> None:
    for block in module.blocks:
        block.inv_freq = torch.arange(2.0)


def test_full_map_loads_every_tensor_and_splits_qkv_in_order():
    """q, k, v are the first, second and third thirds of the fused tensor; nothing stays on meta."""
    state = native_state()
    net = load_strict("f.safetensors", Net, state, MAP, init_buffers=init_buffers)
    fused = state["model.diffusion_model.transformer_blocks.1.qkv.weight"]
    torch.testing.assert_close(net.blocks[1].to_k.weight, fused[4:8])
    torch.testing.assert_close(net.proj_in.bias, state["model.diffusion_model.patchify_proj.bias"])
    assert not any(p.requires_grad for p in net.parameters())


def test_removing_a_rename_row_fails_the_coverage_check():
    """Mutation guard: a map that misses one row must not load (counts and names reported)."""
    mutated = KeyMap(MAP.name, MAP.renames[:-1], MAP.splits, MAP.drops)
    with pytest.raises(LTX25Error) as e:
        load_strict("f.safetensors", Net, native_state(), mutated, init_buffers=init_buffers)
    message = str(e.value)
    assert "2 tensors missing" in message and "transformer_blocks.0.norm_q.weight" in message
    assert "2 file tensors unused" in message and "transformer_blocks.0.q_norm.weight" in message
    assert "f.safetensors" in message


def test_missing_tensor_and_extra_tensor_are_both_refused():
    """Both are named as the file names them, not by the module's internal keys: a missing fused `qkv` is one
    tensor (not its three module parts), a renamed one carries the file's prefix and segment names."""
    state = native_state()
    del state["model.diffusion_model.transformer_blocks.0.q_norm.weight"]
    with pytest.raises(LTX25Error, match=r"1 tensor missing from the file \(model\.diffusion_model\."
                                         r"transformer_blocks\.0\.q_norm\.weight\)"):
        load_strict("f", Net, state, MAP, init_buffers=init_buffers)
    state = native_state()
    del state["model.diffusion_model.transformer_blocks.1.qkv.weight"]
    with pytest.raises(LTX25Error, match=r"1 tensor missing from the file \(model\.diffusion_model\."
                                         r"transformer_blocks\.1\.qkv\.weight\)"):
        load_strict("f", Net, state, MAP, init_buffers=init_buffers)
    state = native_state() | {"model.diffusion_model.mystery.weight": torch.zeros(1)}
    with pytest.raises(LTX25Error, match="1 file tensor unused .*model.diffusion_model.mystery"):
        load_strict("f", Net, state, MAP, init_buffers=init_buffers)


def test_dropping_the_drop_row_makes_type_emb_an_unused_key():
    """The drop list is the only way a file key may go unused."""
    mutated = KeyMap(MAP.name, MAP.renames, MAP.splits, ())
    with pytest.raises(LTX25Error, match="type_emb"):
        load_strict("f", Net, native_state(), mutated, init_buffers=init_buffers)


def test_wrong_shape_is_refused():
    state = native_state()
    state["model.diffusion_model.patchify_proj.weight"] = torch.zeros(4, 5)
    with pytest.raises(LTX25Error, match="shapes"):
        load_strict("f", Net, state, MAP, init_buffers=init_buffers)


def test_buffer_left_on_meta_is_refused():
    """Non-persistent buffers are not in the file; forgetting to re-create them must not pass silently."""
    with pytest.raises(LTX25Error, match="inv_freq"):
        load_strict("f", Net, native_state(), MAP)


def test_segment_renames_never_match_inside_a_longer_name():
    rename = Rename("q_norm", "norm_q", anywhere=True)
    assert rename.forward("a.q_norm.weight") == "a.norm_q.weight"
    assert rename.forward("a.q_norm_extra.weight") == "a.q_norm_extra.weight"
    assert Rename("decoder.", "").forward("decoder.x") == "x"
    assert Rename("decoder.", "").forward("audio_decoder.x") == "audio_decoder.x"


def test_to_native_inverts_apply():
    """The tiny writer emits native names by running the map backwards: apply(to_native(s)) == s."""
    state = native_state()
    mapped, dropped = MAP.apply(state)
    assert list(dropped) == ["model.diffusion_model.type_emb"]
    back = MAP.to_native(mapped)
    assert back.keys() == state.keys() - set(dropped)
    for key, tensor in back.items():
        torch.testing.assert_close(tensor, state[key])
