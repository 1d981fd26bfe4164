"""LoRA files on the transformer handle (nodes/ltx/files/lora.py, nodes/comfy/lora.py, the standalone patcher):
each key spelling equals a hand-merged model, LoRAs stack, strength 0 is the base model bit for bit, patches undo
exactly, the patcher carries low-rank factors (no dense whole-model delta), IC-LoRA files map every key and carry
their reference scaling, and bad files are refused naming the file and the key. Applying LoRAs on the fly
(quantized weights, streaming, branches) is tests/test_lora_on_the_fly.py's."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from safetensors.torch import save_file

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.comfy.lora import LTX25LoraLoader
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.files.lora import LoraFactors, LoraTargets, ReferenceScales, read_lora, read_lora_file
from nodes.tools.tiny import lora as tiny_lora
from nodes.tools.tiny.common import TINY_DIMS

RANK, ALPHA = 4, 2.0  # alpha is written for the kohya/comfyui spellings: their scale is alpha/rank = 0.5
SCALES = {"peft": 1.0, "diffusers": 1.0, "comfyui": ALPHA / RANK, "kohya": ALPHA / RANK}


def _inputs():
    g = torch.Generator().manual_seed(11)
    return (torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g),
            Conditioning(torch.randn(1, 16, TINY_DIMS["video_inner"], generator=g),
                         torch.randn(1, 16, TINY_DIMS["audio_inner"], generator=g)))


def _x0(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    video, audio, cond = _inputs()
    return T.denoise(module, video, audio, 0.6, cond, 24.0)


@pytest.fixture
def handle(transformer_path):
    return Loaded.register(T.load_transformer(transformer_path, torch.float32), inspect_asset(transformer_path))


@pytest.fixture
def targets(handle):
    return LoraTargets.of(handle.module, T.KEY_MAP)


def _hand_merged(module: torch.nn.Module, *loras: tuple[dict, float, float]) -> torch.nn.Module:
    """A copy with `W + strength·scale·up@down` added by hand for each (factors, strength, scale)."""
    merged = copy.deepcopy(module)
    state = merged.state_dict(keep_vars=True)
    with torch.no_grad():
        for factors, strength, scale in loras:
            for key, (up, down) in factors.items():
                state[key].add_(strength * scale * (up @ down))
    return merged


def _close(got, want) -> tuple[bool, float]:
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
    return worst < 1e-5, worst


@pytest.mark.parametrize("style, apply", [(style, "auto") for style in tiny_lora.STYLES] + [("kohya", "merged")])
def test_each_key_spelling_equals_a_hand_merged_model(handle, targets, tmp_path, style, apply):
    """A LoRA in each spelling (peft lora_A/B under diffusion_model., comfyui lora_down/up + alpha under
    model.diffusion_model., kohya lora_unet_ + alpha, diffusers transformer.) patches exactly the weights it names,
    applied on the fly (auto) or merged: the patched handle's x0 equals a model merged by hand with
    W + strength·(alpha/rank)·up@down. Fails if a spelling maps to the wrong weight, if alpha is ignored or applied
    to PEFT files, or if up/down are swapped."""
    path = tiny_lora.write_tiny_lora(str(tmp_path / f"{style}.safetensors"), style, seed=3, rank=RANK, alpha=ALPHA)
    patches = read_lora(path, targets)
    factors = tiny_lora.tiny_lora_factors(seed=3, rank=RANK)
    assert set(patches) == set(factors) and all(isinstance(p, LoraFactors) for p in patches.values())
    base = _x0(handle.ready())
    want = _x0(_hand_merged(handle.module, (factors, 0.7, SCALES[style])))
    got = _x0(handle.with_weight_deltas(patches, strength=0.7, apply=apply).ready())
    ok, worst = _close(got, want)
    assert ok, f"{style}: relative difference {worst:.2e}"
    assert max((a - b).abs().max().item() for a, b in zip(got, base)) > 1e-3, "the LoRA changed nothing"


def test_two_loras_stack_and_the_unpatched_branch_is_restored_exactly(handle, targets, tmp_path):
    """Chained LoRA nodes stack (W + s1·d1 + s2·d2); switching back to the unpatched handle restores every weight
    bit for bit, and the shared module keeps its tensors' storage (no weight copied whole)."""
    first = tiny_lora.write_tiny_lora(str(tmp_path / "a.safetensors"), "peft", seed=1, rank=RANK)
    second = tiny_lora.write_tiny_lora(str(tmp_path / "b.safetensors"), "kohya", seed=2, rank=RANK, alpha=ALPHA)
    original = {k: v.clone() for k, v in handle.module.state_dict().items()}
    storages = {k: t.data_ptr() for k, t in handle.module.state_dict().items()}
    handle.ready()
    want = _x0(_hand_merged(handle.module, (tiny_lora.tiny_lora_factors(1, RANK), 0.5, 1.0),
                            (tiny_lora.tiny_lora_factors(2, RANK), -0.8, ALPHA / RANK)))
    stacked = handle.with_weight_deltas(read_lora(first, targets), 0.5) \
                    .with_weight_deltas(read_lora(second, targets), -0.8)
    ok, worst = _close(_x0(stacked.ready()), want)
    assert ok, f"relative difference {worst:.2e}"
    handle.ready()
    assert all(torch.equal(t, original[k]) for k, t in handle.module.state_dict().items())
    assert {k: t.data_ptr() for k, t in handle.module.state_dict().items()} == storages


def test_strength_zero_is_the_base_model_bit_for_bit(handle, targets, tiny_models):
    """The LoRA node at strength 0 returns the very handle it got (ComfyUI's LoraLoader does the same); the engine
    patch at strength 0 leaves every output bit unchanged too."""
    path = tiny_lora.write_tiny_dev_files(tiny_models)["distilled_lora"]
    name = os.path.basename(path)
    assert LTX25LoraLoader().apply(handle, name, 0.0)[0] is handle
    base = _x0(handle.ready())
    zero = _x0(handle.with_weight_deltas(read_lora(path, targets), 0.0).ready())
    assert all(torch.equal(a, b) for a, b in zip(zero, base))


def test_the_node_reads_the_loras_folder_and_keeps_the_factors_low_rank(handle, tiny_models):
    """LTX-2.5 Load LoRA lists models/loras/ and patches a clone (the input handle stays unpatched) with low-rank
    factors, never a dense [out, in] delta: by default applied on the fly (no weight patch at all), with
    apply=merged as the patcher's weight patches."""
    name = os.path.basename(tiny_lora.write_tiny_dev_files(tiny_models)["distilled_lora"])
    assert name in LTX25LoraLoader.INPUT_TYPES()["required"]["lora_file"][0]
    patched = LTX25LoraLoader().apply(handle, name, 1.0)[0]
    assert patched is not handle and patched.module is handle.module and not handle.patcher.patches
    assert not bridge.low_rank_of(handle.patcher).updates and not patched.patcher.patches
    values = [value for entries in bridge.low_rank_of(patched.patcher).updates.values() for _s, value in entries]
    assert values and all(isinstance(v, LoraFactors) and v.rank == 4 for v in values)
    merged = LTX25LoraLoader().apply(handle, name, 1.0, apply="merged")[0]
    values = [value for entries in merged.patcher.patches.values() for _strength, value in entries]
    assert values and all(isinstance(v, LoraFactors) and v.rank == 4 for v in values)
    assert not bridge.low_rank_of(merged.patcher).updates


def test_weight_patch_hands_the_standalone_patcher_the_factors_and_dense_deltas_as_tuples():
    """Without ComfyUI the factors are the patch value (multiplied out only when applied); a dense delta keeps
    ComfyUI's `(delta,)` shape."""
    factors = LoraFactors(torch.ones(3, 2), torch.ones(2, 5), alpha=1.0)
    assert bridge.weight_patch(factors) is factors
    dense = torch.zeros(3, 5)
    assert bridge.weight_patch(dense)[0] is dense
    assert torch.equal(factors.delta(torch.device("cpu")), torch.full((3, 5), 1.0))  # 2·(1/2)


KEY = "diffusion_model.transformer_blocks.0.attn1.to_q"


def _write(tmp_path, tensors: dict, name: str = "bad.safetensors") -> str:
    path = str(tmp_path / name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    return path


@pytest.mark.parametrize("tensors, key, fragment", [
    ({f"{KEY}.hada_w1_a": torch.zeros(2, 2)}, f"{KEY}.hada_w1_a", "no LoRA form"),
    ({"diffusion_model.transformer_blocks.7.attn1.to_q.lora_A.weight": torch.zeros(4, 64),
      "diffusion_model.transformer_blocks.7.attn1.to_q.lora_B.weight": torch.zeros(64, 4)},
     "diffusion_model.transformer_blocks.7.attn1.to_q.lora_A.weight", "no parameter"),
    ({f"{KEY}.lora_A.weight": torch.zeros(4, 64)}, f"{KEY}.lora_A.weight", "half of a LoRA pair"),
    ({f"{KEY}.lora_A.weight": torch.zeros(4, 64), f"{KEY}.lora_up.weight": torch.zeros(64, 4)},
     f"{KEY}.lora_A.weight", "paired with"),
    ({f"{KEY}.lora_A.weight": torch.zeros(4, 32), f"{KEY}.lora_B.weight": torch.zeros(64, 4)},
     f"{KEY}.lora_A.weight", "shaped"),
    ({f"{KEY}.alpha": torch.tensor(1.0)}, f"{KEY}.alpha", "without its pair"),
    ({"diffusion_model.transformer_blocks.0.norm1.lora_A.weight": torch.zeros(4, 64),
      "diffusion_model.transformer_blocks.0.norm1.lora_B.weight": torch.zeros(64, 4)},
     "diffusion_model.transformer_blocks.0.norm1.lora_A.weight", "no parameter"),
])
def test_bad_lora_keys_are_refused_naming_the_file_and_the_key(targets, tmp_path, tensors, key, fragment):
    """Every file key is used or refused: unknown forms (LoHa), parameters the model lacks, half pairs, mixed
    spellings, wrong shapes and stray alphas each raise LTX25Error whose message names the file and the key."""
    path = _write(tmp_path, tensors)
    with pytest.raises(LTX25Error, match=fragment) as info:
        read_lora(path, targets)
    assert path in str(info.value) and key in str(info.value), str(info.value)


def test_a_dense_delta_on_a_quantized_weight_is_refused_and_a_pair_is_accepted(tmp_path):
    """A weight kept quantized (U8/F8 storage) takes LoRA pairs (applied on the fly, shape-checked against the
    layer's [out, in]) but not a dense `.diff`, which would have to be added to the packed bytes: the error names
    the key and says to load the transformer dequantized."""
    module = torch.nn.Module()
    module.dit = torch.nn.Module()
    module.dit.proj = torch.nn.Linear(8, 8)
    module.dit.proj.weight = torch.nn.Parameter(torch.zeros(8, 4, dtype=torch.uint8), requires_grad=False)
    from nodes.ltx.files.keymap import KeyMap, Rename
    key_map = KeyMap("test", renames=(Rename("model.diffusion_model", "dit"),))
    targets = LoraTargets.of(module, key_map)
    path = _write(tmp_path, {"diffusion_model.proj.lora_A.weight": torch.zeros(2, 8),
                             "diffusion_model.proj.lora_B.weight": torch.zeros(8, 2)})
    assert read_lora(path, targets)["dit.proj.weight"].shape == (8, 8)
    path = _write(tmp_path, {"diffusion_model.proj.diff": torch.zeros(8, 4)}, "diff.safetensors")
    with pytest.raises(LTX25Error, match="quantized") as info:
        read_lora(path, targets)
    assert "diffusion_model.proj.diff" in str(info.value) and "bf16" in str(info.value)


def test_dense_diffs_patch_weights_and_biases(handle, targets, tmp_path):
    """ComfyUI's `.diff` / `.diff_b` entries (dense deltas, e.g. for norms) patch their weight and bias."""
    weight_key = "dit.transformer_blocks.1.attn1.norm_q.weight"
    bias_key = "dit.transformer_blocks.0.audio_ff.net.2.bias"
    state = {k: v.clone() for k, v in handle.module.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    diff, diff_b = torch.randn(state[weight_key].shape, generator=g), torch.randn(state[bias_key].shape, generator=g)
    path = _write(tmp_path, {"diffusion_model.transformer_blocks.1.attn1.q_norm.diff": diff,
                             "diffusion_model.transformer_blocks.0.audio_ff.net.2.diff_b": diff_b})
    patches = read_lora(path, targets)
    assert set(patches) == {weight_key, bias_key}
    patched = handle.with_weight_deltas(patches, 0.3).ready().state_dict()
    assert torch.equal(patched[weight_key], state[weight_key] + 0.3 * diff)
    assert torch.equal(patched[bias_key], state[bias_key] + 0.3 * diff_b)
    handle.ready()


# ---------------------------------------------------------------------------------------------------- IC-LoRA files
@pytest.mark.parametrize("variant", list(tiny_lora.IC_LORA_TARGETS))
def test_ic_lora_files_map_every_key_onto_its_layer(targets, tmp_path, variant):
    """An IC-LoRA as the LTX-2 trainer writes it for each of its IC configs (video, audio, and every attention of
    both streams incl. the cross-modal ones): every file key is used (2 per patched layer), each pair lands on the
    module the native name names (independently resolved through the key map) with its own tensors, and the
    metadata gives the reference scaling."""
    path = tiny_lora.write_tiny_ic_lora(str(tmp_path / f"{variant}.safetensors"), variant, seed=4)
    tensors = tiny_lora.ic_lora_tensors(variant, seed=4)
    lora = read_lora_file(path, targets)
    assert 2 * len(lora.patches) == len(tensors) and lora.reference == ReferenceScales(2, 1)
    for file_key, down in tensors.items():
        if not file_key.endswith(".lora_A.weight"):
            continue
        native = "model." + file_key[: -len(".lora_A.weight")] + ".weight"
        (module_key,), _dropped = T.KEY_MAP.apply({native: down})
        factors = lora.patches[module_key]
        assert torch.equal(factors.down, down.bfloat16()) and factors.alpha is None
        assert torch.equal(factors.up, tensors[file_key.replace("lora_A", "lora_B")].bfloat16())


def test_an_ic_lora_equals_a_hand_merged_model_and_the_handle_carries_its_scaling(handle, targets, tmp_path):
    """The all-attention IC-LoRA through the node's path: x0 equals W + strength·up@down merged by hand (PEFT: no
    alpha), and the handle carries the file's reference scaling (spatial 2, temporal 3) for the reference-video
    conditioning; a plain LoRA stacked after it keeps it."""
    path = tiny_lora.write_tiny_ic_lora(str(tmp_path / "ic.safetensors"), "av2av", seed=6, metadata={
        "reference_downscale_factor": "2", "reference_temporal_scale_factor": "3"})
    lora = read_lora_file(path, targets)
    merged = copy.deepcopy(handle.module)
    state = merged.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, factors in lora.patches.items():
            state[key].add_(0.6 * factors.up.float() @ factors.down.float())
    patched = handle.with_lora(lora, 0.6, name="ic.safetensors")
    ok, worst = _close(_x0(patched.ready()), _x0(merged))
    assert ok, f"relative difference {worst:.2e}"
    assert patched.reference == ReferenceScales(2, 3) and handle.reference == ReferenceScales()
    plain = tiny_lora.write_tiny_lora(str(tmp_path / "plain.safetensors"), "peft", seed=1)
    assert patched.with_lora(read_lora_file(plain, targets), 0.5).reference == ReferenceScales(2, 3)


@pytest.mark.parametrize("metadata, key, fragment", [
    ({"reference_downscale_factor": "two"}, "reference_downscale_factor", "whole number"),
    ({"reference_spatial_scale_factor": "0"}, "reference_spatial_scale_factor", "whole number"),
    ({"reference_temporal_scale_factor": "1.5"}, "reference_temporal_scale_factor", "whole number"),
    ({"reference_spatial_scale_factor": "2", "reference_downscale_factor": "4"}, "reference_downscale_factor",
     "disagree"),
    ({"hdr_transform": "logc3"}, "hdr_transform", "HDR"),
    ({"use_hdr_transform": "true"}, "use_hdr_transform", "HDR"),
])
def test_ic_lora_metadata_the_pack_cannot_honour_is_refused_by_name(targets, tmp_path, metadata, key, fragment):
    """Scales that are no whole number ≥ 1, the two spellings of the spatial scale disagreeing, and an HDR IC-LoRA
    (whose output needs an HDR decode) are refused naming the file and the metadata key."""
    path = tiny_lora.write_tiny_ic_lora(str(tmp_path / "ic.safetensors"), "v2v", metadata=metadata)
    with pytest.raises(LTX25Error, match=fragment) as info:
        read_lora_file(path, targets)
    assert path in str(info.value) and key in str(info.value), str(info.value)


def test_ic_lora_keys_of_another_form_are_refused_by_name(targets, tmp_path):
    """A DoRA magnitude beside the trainer's pairs is no LoRA form this pack applies: refused by file and key."""
    tensors = tiny_lora.ic_lora_tensors("v2v")
    key = "diffusion_model.transformer_blocks.0.attn1.to_q.lora_magnitude_vector"
    path = _write(tmp_path, {**tensors, key: torch.ones(TINY_DIMS["video_inner"])})
    with pytest.raises(LTX25Error, match="no LoRA form") as info:
        read_lora_file(path, targets)
    assert key in str(info.value)


def test_ic_loras_asking_for_different_reference_scales_are_refused(handle, targets, tmp_path):
    """As the reference's IC-LoRA pipeline: two LoRAs whose reference videos were scaled differently cannot share
    one reference video, so the second is refused naming it."""
    first = read_lora_file(tiny_lora.write_tiny_ic_lora(str(tmp_path / "a.safetensors"), "v2v"), targets)
    second = read_lora_file(tiny_lora.write_tiny_ic_lora(str(tmp_path / "b.safetensors"), "a2a", metadata={
        "reference_spatial_scale_factor": "4"}), targets)
    with pytest.raises(LTX25Error, match="reference spatial scale") as info:
        handle.with_lora(first, 1.0, name="a").with_lora(second, 1.0, name="b.safetensors")
    assert "b.safetensors" in str(info.value)


# ------------------------------------------------------------------------------- damaged files, wrong files, NaNs
def _truncated(path: str) -> None:
    data = open(tiny_lora.write_tiny_lora(path, "peft"), "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _wrong_dtype_tag(path: str) -> None:
    """A header read_header accepts (names, offsets inside the file) but safetensors refuses (no such dtype)."""
    import json
    import struct
    header = json.dumps({f"{KEY}.lora_A.weight": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}).encode()
    open(path, "wb").write(struct.pack("<Q", len(header)) + header + bytes(4))


@pytest.mark.parametrize("write, fragment", [
    (_truncated, "truncated"),
    (lambda path: open(path, "wb").close(), "0 bytes long"),
    (lambda path: open(path, "wb").write(bytes(100)), "header"),
    (lambda path: open(path, "wb").write(b"\xff" * 100), "header length"),
    (lambda path: open(path, "wb").write(b"PK\x03\x04junk"), "PyTorch checkpoint"),
    (_wrong_dtype_tag, "unreadable"),
], ids=["truncated", "zero-byte", "zeros", "huge-header", "torch-zip", "bad-dtype"])
def test_damaged_and_non_safetensors_files_are_refused_naming_the_file(targets, tmp_path, write, fragment):
    """A truncated download, an empty or garbage file, a torch.save zip renamed .safetensors and a header safetensors
    itself rejects each raise LTX25Error naming the file (not safetensors' bare SafetensorError, which names
    neither the node nor the file). Fails if the loader opens the file with safe_open unchecked."""
    path = str(tmp_path / "bad.safetensors")
    write(path)
    with pytest.raises(LTX25Error, match=fragment) as info:
        read_lora_file(path, targets)
    assert path in str(info.value), str(info.value)


@pytest.mark.parametrize("component, folder", [("transformer", "models/diffusion_models/"),
                                               ("audio_vae", "models/vae/")])
def test_an_ltx_file_of_another_kind_is_refused_from_its_header_saying_what_it_is(
        targets, tiny_file, monkeypatch, component, folder):
    """A whole LTX-2.5 transformer (tens of GB at full size) or VAE chosen as a LoRA is named for what it is, with
    the folder it belongs in, from the header alone: no tensor is read (safe_open is made to fail). Fails if the
    tensors are read before the key names are checked, or if the message is the generic 'no LoRA form' one."""
    from nodes.ltx.files import lora as lora_module

    def no_read(*args, **kwargs):
        raise AssertionError("a tensor was read before the key names were checked")
    monkeypatch.setattr(lora_module, "safe_open", no_read)
    path = tiny_file(component)
    with pytest.raises(LTX25Error, match="not|expected a LoRA") as info:
        read_lora_file(path, targets)
    message = str(info.value)
    assert path in message and folder in message and inspect_asset(path).kind.value in message, message


@pytest.mark.parametrize("style, suffix, alpha", [("peft", ".lora_A.weight", None), ("kohya", ".lora_up.weight", 2.0),
                                                  ("kohya", ".alpha", 2.0), ("peft", ".diff", None)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_values_are_refused_naming_the_file_and_the_key(targets, tmp_path, style, suffix, alpha, bad):
    """One NaN/inf in a down or up factor, an alpha or a dense diff would make every patched step NaN (a black
    video, silently): refused at load, naming the file and the key. Fails without the finiteness check."""
    tensors = tiny_lora.lora_file_tensors(tiny_lora.tiny_lora_factors(seed=2), style, alpha=alpha)
    if suffix == ".diff":
        tensors = {f"{KEY}.diff": torch.zeros(TINY_DIMS["video_inner"], TINY_DIMS["video_inner"])}
    key = sorted(k for k in tensors if k.endswith(suffix))[-1]
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[-1] = bad
    path = _write(tmp_path, tensors)
    with pytest.raises(LTX25Error, match="NaN or infinite") as info:
        read_lora_file(path, targets)
    assert path in str(info.value) and key in str(info.value), str(info.value)


@pytest.mark.parametrize("strength", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_strength_is_refused_by_the_node(handle, tiny_models, strength):
    """ComfyUI's min/max check lets NaN through (every comparison with NaN is false): LTX-2.5 Load LoRA refuses a
    non-finite strength naming its input, instead of returning a model whose every output is NaN."""
    name = os.path.basename(tiny_lora.write_tiny_dev_files(tiny_models)["distilled_lora"])
    with pytest.raises(LTX25Error, match="LTX25LoraLoader.strength"):
        LTX25LoraLoader().apply(handle, name, strength)


def test_the_reference_guide_says_a_lora_at_strength_zero_is_no_lora(handle, tiny_models):
    """The LoRA node at strength 0 hands on the model without the LoRA; the IC-LoRA guide's refusal then says so
    (strength 0) instead of only asking to connect a LoRA node that is connected."""
    from nodes.comfy.reference_video import LTX25ReferenceVideoGuide
    name = os.path.basename(tiny_lora.write_tiny_dev_files(tiny_models)["distilled_lora"])
    model = LTX25LoraLoader().apply(handle, name, 0.0)[0]
    with pytest.raises(LTX25Error, match="without a LoRA") as info:
        LTX25ReferenceVideoGuide().guide(model, torch.rand(1, 8, 8, 3), None, 1.0)
    assert "strength" in str(info.value) and "0" in str(info.value), str(info.value)
