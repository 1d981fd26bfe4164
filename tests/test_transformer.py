"""The LTX-2.5 transformer file (docs/MODEL.md §5, §12, §13 items 6-9, 13, 17): config, key map and strict loading,
"presence decides" for the connectors, NVFP4 loading, positions, the keyframe marker, the AV gate and x0."""
from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel
from safetensors import safe_open
from safetensors.torch import save_file

from nodes.ltx.dit import positions as P
from nodes.ltx.files import quant
from nodes.ltx.dit import transformer as T
from nodes.ltx.files.assets import inspect_asset, read_state_dict
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import KeyMap, load_strict
from nodes.tools.tiny import transformer as tiny_transformer

VIDEO, AUDIO = (1, 128, 3, 2, 2), (1, 8, 5, 16)   # 17 frames: 3 latent frames of 2×2 cells; 5 audio frames


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    video, audio = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    cond = Conditioning(torch.randn(1, 1024, 64, generator=g), torch.randn(1, 1024, 32, generator=g))
    return video, audio, cond


def rewrite(src: str, dst: str, keep=lambda key: True, replace: dict | None = None,
            block_update: dict | None = None, drop_block_keys: tuple = ()) -> str:
    """A variant of the tiny file: some tensors dropped or replaced, config.transformer edited."""
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if keep(k)}
        metadata = dict(f.metadata())
    tensors.update(replace or {})
    config = json.loads(metadata["config"])
    config["transformer"].update(block_update or {})
    for key in drop_block_keys:
        config["transformer"].pop(key)
    metadata["config"] = json.dumps(config)
    save_file(tensors, dst, metadata=metadata)
    return dst


# ---------------------------------------------------------------------------------------------------- config
def test_shipped_config_builds_the_4349_native_keys():
    """The released config rebuilds exactly the 4349-key inventory of the shipped file (84/block + 59 + 258)."""
    config = T.TransformerConfig.from_metadata("shipped", {"config": {"transformer": dict(T.SHIPPED_CONFIG)}})
    with torch.device("meta"):
        module = T.LTX25Transformer(config)
    native = T.KEY_MAP.to_native(module.state_dict())
    assert len(native) == 4349, f"{len(native)} native keys"
    assert tuple(native["model.diffusion_model.adaln_single.linear.weight"].shape) == (36864, 4096)
    assert tuple(native["model.diffusion_model.transformer_blocks.0.audio_to_video_attn.to_q.weight"].shape) == \
        (2048, 4096)
    assert set(T.KEY_MAP.apply(native)[0]) == set(module.state_dict()), "key map does not round-trip"


def test_every_diffusers_argument_comes_from_the_file_or_a_fixed_fact():
    """No LTX2VideoTransformer3DModel argument is left to its class default (several are LTX-2.0 values)."""
    config = T.TransformerConfig.from_metadata("shipped", {"config": {"transformer": dict(T.SHIPPED_CONFIG)}})
    wanted = set(inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters) - {"self"}
    assert set(config.diffusers_kwargs()) == wanted, f"unset: {wanted - set(config.diffusers_kwargs())}"


def test_av_gate_multiplier_comes_from_the_file_and_matters(transformer_path, transformer):
    """av_ca_timestep_scale_multiplier: 1000 in the file (ltx-core defaults to 1). It reaches diffusers'
    cross_attn_timestep_scale_multiplier, changing it to 1 changes the prediction, and a file without it is
    refused rather than defaulted."""
    assert transformer.config.av_ca_timestep_scale_multiplier == 1000.0
    assert transformer.dit.config.cross_attn_timestep_scale_multiplier == 1000.0
    video, audio, cond = inputs()
    want = T.denoise(transformer, video, audio, 0.7, cond, 24.0)
    try:
        transformer.dit.register_to_config(cross_attn_timestep_scale_multiplier=1)
        got = T.denoise(transformer, video, audio, 0.7, cond, 24.0)
    finally:
        transformer.dit.register_to_config(cross_attn_timestep_scale_multiplier=1000.0)
    diff = max((a - b).abs().max().item() for a, b in zip(want, got))
    assert diff > 1e-4, f"the AV gate multiplier did not change the output (max diff {diff})"
    block = {k: v for k, v in tiny_transformer.tiny_config_block().items() if k != "av_ca_timestep_scale_multiplier"}
    with pytest.raises(LTX25Error, match="av_ca_timestep_scale_multiplier"):
        T.TransformerConfig.from_metadata(transformer_path, {"config": {"transformer": block}})


@pytest.mark.parametrize("key,value", [("rope_type", "interleaved"), ("caption_proj_before_connector", False),
                                       ("use_middle_indices_grid", False), ("qk_norm", "layer_norm"),
                                       ("audio_num_attention_heads", 4), ("frequencies_precision", "float16"),
                                       ("num_layers", "48")])
def test_unsupported_config_values_are_refused_by_name(transformer_path, key, value):
    """Anything the LTX-2.5 architecture cannot be built with raises LTX25Error naming the key."""
    block = {**tiny_transformer.tiny_config_block(), key: value}
    with pytest.raises(LTX25Error, match=key):
        T.TransformerConfig.from_metadata(transformer_path, {"config": {"transformer": block}})


def test_stripped_metadata_is_refused(transformer_path):
    """No config.transformer block: an error that says so, not a model built from defaults."""
    with pytest.raises(LTX25Error, match="config.transformer"):
        T.TransformerConfig.from_metadata(transformer_path, {"model_version": "2.5.0"})


# ---------------------------------------------------------------------------------------------------- loading
def test_tiny_file_loads_with_full_coverage(transformer_path, transformer):
    """Every file key used, every module tensor filled (293 = 2·84 + 59 + 2·(2·16 + 1))."""
    header = inspect_asset(transformer_path).header
    assert len(header.tensors) == 2 * 84 + 59 + 2 * 33
    assert len(transformer.state_dict()) == len(header.tensors)
    assert transformer.model_version == "2.5.0"
    assert not any(p.requires_grad for p in transformer.parameters())


def test_removing_any_key_map_row_breaks_loading(transformer_path):
    """Each rename row is needed: without it the strict load names missing/unused keys."""
    native = read_state_dict(transformer_path)
    metadata = tiny_transformer.tiny_metadata()
    build = lambda: T.LTX25Transformer(T.TransformerConfig.from_metadata(transformer_path, metadata))  # noqa: E731
    for i, row in enumerate(T.KEY_MAP.renames):
        smaller = KeyMap("without one row", T.KEY_MAP.renames[:i] + T.KEY_MAP.renames[i + 1:])
        with pytest.raises(LTX25Error, match="key coverage"):
            load_strict(transformer_path, build, native, smaller)
            pytest.fail(f"loading worked without {row}")


def test_video_ff_has_no_bias_and_audio_ff_keeps_it(transformer_path, transformer):
    """2.5: ff_bias false removes the video FF biases only; audio FF and connector FF keep theirs."""
    keys = inspect_asset(transformer_path).header.tensors
    assert "model.diffusion_model.transformer_blocks.0.ff.net.0.proj.bias" not in keys
    assert "model.diffusion_model.transformer_blocks.0.audio_ff.net.0.proj.bias" in keys
    block = transformer.dit.transformer_blocks[0]
    assert block.ff.net[0].proj.bias is None and block.ff.net[2].bias is None
    assert block.audio_ff.net[0].proj.bias is not None
    assert transformer.connectors.video.transformer_blocks[0].ff.net[0].proj.bias is not None


def test_file_with_one_connector_is_refused(transformer_path, tmp_path):
    """Presence decides: half a connector pair is a damaged file, named as such."""
    dst = rewrite(transformer_path, str(tmp_path / "one.safetensors"), keep=lambda k: "audio_embeddings_connector" not in k)
    with pytest.raises(LTX25Error, match="only video_embeddings_connector"):
        T.load_transformer(dst, torch.float32)


def test_file_without_connectors_is_refused(transformer_path, tmp_path):
    """A DiT-only file: the error says it carries no connectors."""
    dst = rewrite(transformer_path, str(tmp_path / "none.safetensors"), keep=lambda k: "embeddings_connector" not in k)
    with pytest.raises(LTX25Error, match="carries no connectors"):
        T.load_transformer(dst, torch.float32)


def quantize_nvfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of quant.dequantize_nvfp4: [out, in] float → U8 [out, in/2] (high nibble first), 128×4-swizzled
    E4M3 block scales, fp32 per-tensor scale (block amax ↦ 6 in E2M1 units)."""
    rows, cols = weight.shape
    scale_2 = weight.abs().max() / (448 * 6)
    blocks = weight.reshape(rows, cols // quant.NVFP4_BLOCK, quant.NVFP4_BLOCK)
    block_scale = (blocks.abs().amax(-1) / 6 / scale_2).to(torch.float8_e4m3fn)
    values = blocks / (block_scale.float() * scale_2).clamp(min=1e-30).unsqueeze(-1)
    table = torch.tensor(quant.E2M1_VALUES)
    nibbles = (values.abs().unsqueeze(-1) - table).abs().argmin(-1) | ((values < 0).long() << 3)
    nibbles = nibbles.reshape(rows, cols)
    packed = ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).to(torch.uint8)
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-(cols // 16) // 4) * 4
    swizzled = torch.zeros(padded_rows * padded_cols, dtype=torch.uint8)
    swizzled[quant.swizzled_offsets(rows, cols // 16).flatten()] = block_scale.view(torch.uint8).flatten()
    return packed, swizzled.view(torch.float8_e4m3fn).reshape(padded_rows, padded_cols), scale_2.float()


def test_nvfp4_variant_loads_within_quantization_error(transformer_path, transformer, tmp_path):
    """NVFP4 Linears (U8 + swizzled E4M3 scales + fp32 scalars, as in the -nvfp4 file) are dequantized at load:
    exactly what the quantizer encoded, and within FP4 rounding of the float weights."""
    float_state = read_state_dict(transformer_path)
    names = [f"model.diffusion_model.transformer_blocks.{i}.{m}.weight" for i in (0, 1)
             for m in ("attn1.to_q", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2")]
    replace = {}
    for name in names:
        packed, scales, scale_2 = quantize_nvfp4(float_state[name].float())
        replace |= {name: packed, name + "_scale": scales, name + "_scale_2": scale_2,
                    name[: -len("weight")] + "input_scale": torch.tensor(1.0)}
    dst = rewrite(transformer_path, str(tmp_path / "nvfp4.safetensors"), replace=replace)
    assert inspect_asset(dst).quantization == "nvfp4"
    loaded = T.load_transformer(dst, torch.float32)
    modules = dict(loaded.named_parameters())
    for name in names:
        module_name = T.KEY_MAP.rename(name)
        got, float_weight = modules[module_name], float_state[name].float()
        encoded = quant.dequantize_nvfp4(replace[name], replace[name + "_scale"], replace[name + "_scale_2"],
                                         torch.float32)
        assert torch.equal(got, encoded), f"{name}: not the encoded values"
        block_amax = float_weight.reshape(float_weight.shape[0], -1, 16).abs().amax(-1, keepdim=True)
        error = ((got - float_weight).reshape(block_amax.shape[0], -1, 16).abs() / block_amax).max().item()
        assert error < 0.25, f"{name}: error {error:.3f} of the block maximum"
    other = "dit.transformer_blocks.0.attn1.to_k.weight"
    assert torch.equal(modules[other], dict(transformer.named_parameters())[other]), "unquantized weight changed"


# ---------------------------------------------------------------------------------------------------- positions
def test_video_positions_are_seconds_with_causal_first_frame():
    """Time bounds: frame 0 [0,1), frame f [8f−7, 8f+1) pixel frames, divided by fps; space [32h, 32h+32) px."""
    bounds = P.video_position_bounds(1, 3, 2, 2, fps=24.0)
    assert bounds.shape == (1, 3, 12, 2)
    time = bounds[0, 0].reshape(3, 4, 2)[:, 0]              # one token per latent frame
    assert torch.allclose(time * 24.0, torch.tensor([[0.0, 1.0], [1.0, 9.0], [9.0, 17.0]])), time * 24
    height = bounds[0, 1].reshape(3, 2, 2, 2)[0, :, 0]
    assert height.tolist() == [[0.0, 32.0], [32.0, 64.0]]
    width = bounds[0, 2].reshape(3, 2, 2, 2)[0, 0, :]
    assert width.tolist() == [[0.0, 32.0], [32.0, 64.0]]


def test_audio_positions_are_mel_frame_seconds():
    """Latent i covers mel frames max(4i−3,0)…max(4i+1,0) of 10 ms each."""
    bounds = P.audio_position_bounds(2, 3)
    assert bounds.shape == (2, 1, 3, 2)
    assert torch.allclose(bounds[1, 0], torch.tensor([[0.0, 0.01], [0.01, 0.05], [0.05, 0.09]]))


def test_positions_agree_with_diffusers_coords(transformer):
    """Our cached bounds equal what diffusers' own coordinate helpers compute for the same shapes."""
    ours = P.video_position_bounds(1, 3, 2, 2, fps=25.0)
    theirs = transformer.dit.rope.prepare_video_coords(1, 3, 2, 2, torch.device("cpu"), fps=25.0)
    assert torch.equal(ours, theirs)
    assert torch.allclose(P.audio_position_bounds(1, 5), transformer.dit.audio_rope.prepare_audio_coords(1, 5, "cpu"))


def test_rope_uses_bound_midpoints_over_max_pos(transformer):
    """Closed form of the video RoPE at the first frequency of each axis: angle = π/2·(2·mid/max_pos − 1) with the
    MIDPOINT of each bound (frame 1: 5/24 s; row 1: 48 px), after the 2 identity pad entries (split RoPE)."""
    bounds = P.video_position_bounds(1, 3, 2, 2, fps=24.0)
    cos, _ = transformer.dit.rope(bounds)                              # [B, heads, N, head_dim/2]
    flat = cos.transpose(1, 2).reshape(1, 12, -1)                # [B, N, dim/2]: 2 pad, then (t, h, w) per freq
    assert torch.all(flat[..., :2] == 1.0)
    token = 1 * 4 + 1 * 2 + 0                                    # f=1, h=1, w=0
    mids = (5.0 / 24.0, 48.0, 16.0)
    want = [math.cos(math.pi / 2 * (2 * m / mp - 1)) for m, mp in zip(mids, (20, 2048, 2048))]
    got = flat[0, token, 2:5].tolist()
    assert got == pytest.approx(want, abs=1e-6), f"got {got}, want {want}"


# ---------------------------------------------------------------------------------------------------- denoise
def test_denoise_returns_float32_x0_in_the_latent_layouts(transformer):
    """[B,128,F,H,W] and [B,8,T,16] float32, produced under inference mode; positions cached per shape."""
    video, audio, cond = inputs()
    transformer._grids.clear()
    x0_video, x0_audio = T.denoise(transformer, video.bfloat16(), audio.bfloat16(), 0.5, cond, 24.0)
    T.denoise(transformer, video, audio, 0.3, cond, 24.0)
    assert x0_video.shape == VIDEO and x0_audio.shape == AUDIO
    assert x0_video.dtype == torch.float32 and x0_video.is_inference()
    assert len(transformer._grids) == 1, "positions rebuilt for the same shape"


def test_x0_is_latent_minus_velocity_times_sigma(transformer):
    """The X0 wrapper: x0 = latent − v·σ per token in float32 (v captured at the DiT's output)."""
    video, audio, cond = inputs(1)
    seen = {}
    handle = transformer.dit.register_forward_hook(lambda mod, args, out: seen.update(v=out[0], a=out[1]))
    try:
        x0_video, x0_audio = T.denoise(transformer, video, audio, 0.725, cond, 24.0)
    finally:
        handle.remove()
    want_video = video - P.unpatchify_video(seen["v"], VIDEO) * 0.725
    want_audio = audio - P.unpatchify_audio(seen["a"], AUDIO) * 0.725
    assert (x0_video - want_video).abs().max() < 1e-6 and (x0_audio - want_audio).abs().max() < 1e-6


def test_keyframe_embedding_marks_first_latent_frame_tokens_only(transformer):
    """Right after proj_in, keyframes_abs_pos_embedding is added to the first latent frame's H·W tokens and to
    nothing else (read at the first block's input: attention spreads it everywhere after that)."""
    video, audio, cond = inputs(2)
    seen = {}
    handle = transformer.dit.transformer_blocks[0].register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(h=kwargs["hidden_states"]), with_kwargs=True)
    try:
        T.denoise(transformer, video, audio, 0.9, cond, 24.0)
    finally:
        handle.remove()
    with torch.inference_mode():
        added = seen["h"] - transformer.dit.proj_in(P.patchify_video(video))
    embedding = transformer.dit.keyframes_abs_pos_embedding[0]
    frame = VIDEO[3] * VIDEO[4]
    assert (added[0, :frame] - embedding).abs().max() < 1e-6, "first-frame tokens lack the marker"
    assert added[0, frame:].abs().max() < 1e-6, "marker added beyond the first latent frame"
    assert embedding.abs().max() > 1e-3, "vacuous: the tiny embedding is zero"


def test_denoise_matches_the_plain_diffusers_forward(transformer):
    """Against diffusers computing its own coordinates (bound midpoints, seconds) with per-token timesteps and the
    first-frame keyframe mask: the same prediction. Pins our positions, the [B,1] timestep broadcast and x0."""
    video, audio, cond = inputs(3)
    sigma, (b, _, f, h, w), frames = 0.725, VIDEO, AUDIO[2]
    with torch.inference_mode():
        t = sigma * 1000.0
        v, a = transformer.dit(hidden_states=P.patchify_video(video), audio_hidden_states=P.patchify_audio(audio),
                         encoder_hidden_states=cond.video, audio_encoder_hidden_states=cond.audio,
                         timestep=torch.full((b, f * h * w), t), audio_timestep=torch.full((b, frames), t),
                         sigma=torch.full((b,), t), audio_sigma=torch.full((b,), t), num_frames=f, height=h,
                         width=w, fps=24.0, audio_num_frames=frames,
                         video_keyframes_mask=P.first_frame_keyframes_mask(b, f, h, w),
                         use_cross_timestep=True, return_dict=False)
    x0_video, x0_audio = T.denoise(transformer, video, audio, sigma, cond, 24.0)
    diff_v = (x0_video - (video - P.unpatchify_video(v, VIDEO) * sigma)).abs().max().item()
    diff_a = (x0_audio - (audio - P.unpatchify_audio(a, AUDIO) * sigma)).abs().max().item()
    assert diff_v < 1e-5 and diff_a < 1e-5, f"max diff video {diff_v}, audio {diff_a}"


def test_mismatched_inputs_are_refused(transformer):
    """Wrong channel counts or a conditioning batch that does not match: LTX25Error, not a shape crash inside."""
    video, audio, cond = inputs()
    with pytest.raises(LTX25Error, match="video latent"):
        T.denoise(transformer, video[:, :64], audio, 0.5, cond, 24.0)
    with pytest.raises(LTX25Error, match="video context"):
        T.denoise(transformer, video, audio, 0.5, Conditioning(cond.video.repeat(2, 1, 1), cond.audio), 24.0)


def test_write_tiny_is_deterministic(tmp_path):
    """Same seed, same tensors (tests and the demo rely on a reproducible tiny set)."""
    a = read_state_dict(tiny_transformer.write_tiny(str(tmp_path / "a.safetensors"), 3))
    b = read_state_dict(tiny_transformer.write_tiny(str(tmp_path / "b.safetensors"), 3))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
