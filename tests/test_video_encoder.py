"""The video VAE encoder (docs/MODEL.md §17.1, §17.2): loaded strictly from either video-VAE file, its output equal
to diffusers' encoder run by hand, normalized with the file's statistics, the causal first frame, the reference's
tiling, and the refusals."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoEncoder3d
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nodes.comfy import bridge
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.encode import video_encoder as ve
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import KeyMap, check_coverage
from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG
from nodes.tools.tiny.common import randomize_
from nodes.tools.tiny.conv_vae import TINY_VAE_CONFIG, _tiny_blocks
from nodes.tools.tiny.diffusion_vae import TINY_ENCODER

FILES = ("conv_vae", "diffusion_vae")


@pytest.fixture(scope="module")
def encoders(tiny_file):
    return {component: ve.load_video_encoder(tiny_file(component), torch.float32) for component in FILES}


def _frames(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def _rewrite(source: str, target: str, change_tensors=None, change_config=None) -> str:
    """A copy of a tiny file with its tensors and/or its `config.vae` changed."""
    tensors = load_file(source)
    with safe_open(source, "pt") as f:
        metadata = dict(f.metadata())
    if change_tensors:
        change_tensors(tensors)
    if change_config:
        config = json.loads(metadata["config"])
        change_config(config["vae"])
        metadata["config"] = json.dumps(config)
    save_file(tensors, target, metadata=metadata)
    return target


# ------------------------------------------------------------------------------------------------- file and keys
@pytest.mark.parametrize("component", FILES)
def test_tiny_files_carry_the_encoder_in_native_names(tiny_file, component):
    """Both files bundle the encoder as the released files do: flat `encoder.down_blocks.{0..8}` with
    `res_blocks.i.conv{1,2}.conv` at the even (res_x) indices and `conv.conv` at the odd (downsampler) ones, one
    resnet per res stage so every kind of the real encoder's tensors is there; no diffusers names."""
    with safe_open(tiny_file(component), "pt") as f:
        keys = {k for k in f.keys() if k.startswith("encoder.")}
    assert {f"encoder.down_blocks.{i}.res_blocks.0.conv{j}.conv.weight" for i in (0, 2, 4, 6, 8) for j in (1, 2)} \
        <= keys
    assert {f"encoder.down_blocks.{i}.conv.conv.bias" for i in (1, 3, 5, 7)} <= keys
    assert {"encoder.conv_in.conv.weight", "encoder.conv_out.conv.weight"} <= keys
    assert not any(part in k for k in keys for part in ("resnets", "downsamplers", "mid_block"))


def _by_hand(path: str, frames: torch.Tensor) -> torch.Tensor:
    """The file's encoder run as diffusers' class directly: arguments written out for the tiny layout (widths 128,
    one layer per stage, the 2.5 downsampler order), tensors renamed by plain string edits, the first 128 output
    channels normalized with the file's two statistics."""
    model = LTX2VideoEncoder3d(in_channels=3, out_channels=128, block_out_channels=(128,) * 4,
                               layers_per_block=(1,) * 5, patch_size=4, is_causal=True, spatial_padding_mode="zeros",
                               downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal")).eval()
    native = load_file(path)
    state = {}
    for key, value in native.items():
        if not key.startswith("encoder."):
            continue
        name = key[len("encoder."):]
        for i in range(9):
            block = f"down_blocks.{i // 2}" if i < 8 else "mid_block"
            name = name.replace(f"down_blocks.{i}.res_blocks.", f"{block}.resnets.") if i % 2 == 0 else \
                name.replace(f"down_blocks.{i}.conv.", f"{block}.downsamplers.0.conv.")
        state[name] = value.float()
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        means = model(frames.permute(0, 4, 1, 2, 3) * 2 - 1)[:, :128]
    mean = native["per_channel_statistics.mean-of-means"].float().view(1, -1, 1, 1, 1)
    std = native["per_channel_statistics.std-of-means"].float().view(1, -1, 1, 1, 1)
    return (means - mean) / std


@pytest.mark.parametrize("component", FILES)
def test_encode_equals_diffusers_run_by_hand_on_both_files(tiny_file, encoders, component):
    """From either file (flat config or nested `config.vae.encoder`) the encode is diffusers' encoder on `2x − 1`,
    first 128 channels, normalized `(z − mean-of-means) / std-of-means`: `[1, 128, 2, 1, 2]` for 9×32×64."""
    frames = _frames(1, 9, 32, 64, 3)
    latent = ve.encode_video(encoders[component], frames)
    expected = _by_hand(tiny_file(component), frames)
    assert latent.shape == (1, 128, 2, 1, 2) and latent.dtype == torch.float32 and latent.device.type == "cpu"
    assert torch.allclose(latent, expected, atol=1e-4 * float(expected.abs().max())), \
        float((latent - expected).abs().max())


def test_every_key_map_row_is_needed(tiny_file, encoders):
    """Full coverage from the file, and without any one rename row the coverage check fails (each row is
    exercised by the tiny file)."""
    path = tiny_file("conv_vae")
    native = {k: v for k, v in load_file(path).items() if k.startswith(ve.READ_PREFIXES)}
    with torch.device("meta"):
        module = ve.VideoEncoder(encoders["conv_vae"].config)
    check_coverage(path, ve.KEY_MAP, module, ve.KEY_MAP.apply(native)[0])
    rows = ve.KEY_MAP.renames
    for i in range(len(rows)):
        variant = KeyMap("variant", rows[:i] + rows[i + 1:], (), ve.KEY_MAP.drops)
        with pytest.raises(LTX25Error, match="key coverage"):
            check_coverage(path, variant, module, variant.apply(native)[0])


@pytest.mark.parametrize("change, found", [
    (lambda t: t.pop("encoder.down_blocks.4.res_blocks.0.conv2.conv.weight"), "encoder.down_blocks.4.res_blocks.0"),
    (lambda t: t.update({"encoder.down_blocks.9.conv.conv.weight": torch.zeros(1)}), "encoder.down_blocks.9"),
])
def test_a_missing_or_extra_encoder_tensor_is_named(tiny_file, tmp_path, change, found):
    """A file lacking one encoder tensor, or carrying one no module takes, is refused by name (coverage), not
    loaded with a hole or a silently ignored tensor."""
    path = _rewrite(tiny_file("conv_vae"), str(tmp_path / "changed.safetensors"), change_tensors=change)
    with pytest.raises(LTX25Error, match="key coverage") as error:
        ve.load_video_encoder(path)
    assert found in str(error.value), error.value


def test_the_decoders_tensors_are_dropped_by_name_and_nothing_else(tiny_file, tmp_path):
    """Every tensor outside `encoder.*` / the statistics is on the drop list with its reason (both decoders'
    `decoder.*`); a tensor of no known part (here a vocoder's) is refused, naming it."""
    for component in FILES:
        with safe_open(tiny_file(component), "pt") as f:
            others = [k for k in f.keys() if not k.startswith(ve.READ_PREFIXES)]
        assert others and all(ve.KEY_MAP.drop_reason(k) for k in others), component
    path = _rewrite(tiny_file("conv_vae"), str(tmp_path / "stray.safetensors"),
                    change_tensors=lambda t: t.update({"vocoder.conv_pre.weight": torch.zeros(1)}))
    with pytest.raises(LTX25Error, match="vocoder.conv_pre.weight"):
        ve.load_video_encoder(path)


def test_a_decoder_only_file_is_refused_as_such(tiny_file, tmp_path):
    """A repack stripped to its decoder says so instead of listing 74 missing tensors."""
    path = _rewrite(tiny_file("conv_vae"), str(tmp_path / "decoder_only.safetensors"),
                    change_tensors=lambda t: [t.pop(k) for k in [k for k in t if k.startswith("encoder.")]])
    with pytest.raises(LTX25Error, match="stripped to its decoder"):
        ve.load_video_encoder(path)


@pytest.mark.parametrize("component, change, key", [
    ("conv_vae", lambda v: v.update(latent_log_var="per_channel"), "config.vae.latent_log_var"),
    ("conv_vae", lambda v: v.update(norm_layer="group_norm"), "config.vae.norm_layer"),
    ("conv_vae", lambda v: v.update(encoder_base_channels=64), "config.vae.encoder_base_channels"),
    ("conv_vae", lambda v: v["encoder_blocks"].__setitem__(1, ["compress_space", {}]), "config.vae.encoder_blocks"),
    ("diffusion_vae", lambda v: v.pop("encoder"), "config.vae.encoder"),
    ("diffusion_vae", lambda v: v["encoder"].update(base_channels=256), "config.vae.encoder.base_channels"),
    ("diffusion_vae", lambda v: v["encoder"].update(patch_size=2), "config.vae.encoder compression"),
])
def test_unsupported_encoder_configs_name_the_key(tiny_file, tmp_path, component, change, key):
    """Each value the pack's encoder could not reproduce is refused by its key, before anything is built: a log-var
    layout that moves the means, another norm, a first width other than the latent's (the reference ignores the
    field, ComfyUI builds from it), a non-residual downsampler, a diffusion file without its encoder block, a grid
    other than 32×32×8."""
    path = _rewrite(tiny_file(component), str(tmp_path / "config.safetensors"), change_config=change)
    with pytest.raises(LTX25Error) as error:
        ve.load_video_encoder(path)
    assert error.value.what.startswith(key), str(error.value)


def test_shipped_config_builds_the_released_encoder():
    """The real 2.5 `config.vae` builds an encoder of exactly 84 tensors (the count [X] reads in both files) with
    the §9.1 ladder: conv_in 48→128, stages at 128, 256, 512, 1024, 1024 with 4/6/4/2/2 resnets, conv_out 1024→129;
    and the diffusion file's nested block (ComfyUI's copy of it) builds the same one."""
    config = ve.VideoEncoderConfig.from_metadata("shipped", {"config": {"vae": SHIPPED_CONV_VAE_CONFIG}}, False)
    with torch.device("meta"):
        native = ve.KEY_MAP.to_native({f"encoder.{k}": v for k, v in ve.VideoEncoder(config).encoder.state_dict()
                                       .items()})
    assert len(native) == 84
    assert tuple(native["encoder.conv_in.conv.weight"].shape[:2]) == (128, 48)
    assert tuple(native["encoder.conv_out.conv.weight"].shape[:2]) == (129, 1024)
    widths = [native[f"encoder.down_blocks.{i}.res_blocks.0.conv1.conv.weight"].shape[0] for i in (0, 2, 4, 6, 8)]
    counts = [len({k.split(".")[4] for k in native if k.startswith(f"encoder.down_blocks.{i}.res_blocks")})
              for i in (0, 2, 4, 6, 8)]
    assert widths == [128, 256, 512, 1024, 1024] and counts == [4, 6, 4, 2, 2]
    nested = {"_class_name": "CausalDiffusionVAE", "encoder": {
        "dims": 3, "in_channels": 3, "out_channels": 128, "blocks": SHIPPED_CONV_VAE_CONFIG["encoder_blocks"],
        "patch_size": 4, "latent_log_var": "constant", "norm_layer": "pixel_norm", "base_channels": 128,
        "spatial_padding_mode": "zeros"}}
    assert ve.VideoEncoderConfig.from_metadata("nested", {"config": {"vae": nested}}, True) == config


def test_tiny_diffusion_file_declares_its_encoder_block():
    """The tiny diffusion file's `config.vae.encoder` is in the diffusion file's own names (`blocks`,
    `out_channels`, `base_channels`): what the nested reader is tested on."""
    assert {"blocks", "out_channels", "base_channels"} <= set(TINY_ENCODER) and "encoder_blocks" not in TINY_ENCODER


# ------------------------------------------------------------------------------------------------- encode
def test_one_image_gives_one_latent_frame_the_clips_first(encoders):
    """The causal first frame: an image (F = 1) encodes to ONE latent frame, and it is the first latent frame of
    any clip starting with that image (the encoder pads time with the first frame and looks only back)."""
    encoder = encoders["conv_vae"]
    clip = _frames(1, 9, 32, 64, 3, seed=1)
    image = ve.encode_video(encoder, clip[:, :1])
    latent = ve.encode_video(encoder, clip)
    assert image.shape == (1, 128, 1, 1, 2) and latent.shape == (1, 128, 2, 1, 2)
    assert torch.allclose(image[:, :, 0], latent[:, :, 0], atol=1e-4), float((image[:, :, 0] - latent[:, :, 0])
                                                                              .abs().max())
    assert (latent[:, :, 1] - latent[:, :, 0]).abs().max() > 0.1


def test_the_latent_is_normalized_as_the_decoders_undo_it(tiny_file, encoders):
    """Encode → the conv decoder's own loader and decode: shapes `[1,128,2,1,1]` → 9 frames 32×32 in [0, 1],
    float32; and un-normalizing the latent with the decoder's statistics (what `decode_conv` does first) gives the
    encoder's raw means back — both files' statistics are the same numbers, so encoder and decoder agree on the
    latent space."""
    from nodes.ltx.decode.conv_vae import decode_conv, load_conv_vae
    from nodes.ltx.latents import denormalize_video
    encoder = encoders["conv_vae"]
    frames = _frames(1, 9, 32, 32, 3, seed=2)
    latent = ve.encode_video(encoder, frames)
    vae = load_conv_vae(tiny_file("conv_vae"), torch.float32)
    decoded, _ = decode_conv(vae, latent, TilingRequest("off"))
    assert latent.shape == (1, 128, 2, 1, 1) and decoded.shape == (9, 32, 32, 3) and decoded.dtype == torch.float32
    assert 0 <= float(decoded.min()) and float(decoded.max()) <= 1
    assert torch.equal(vae.latents_mean, encoder.latents_mean) and torch.equal(vae.latents_std, encoder.latents_std)
    with torch.no_grad():
        raw = encoder.encoder(frames.permute(0, 4, 1, 2, 3) * 2 - 1)[:, :128]
    back = denormalize_video(latent, vae.latents_mean, vae.latents_std, torch.device("cpu"))
    assert torch.allclose(back, raw, atol=1e-4 * float(raw.abs().max())), float((back - raw).abs().max())


def test_weights_run_in_the_loaded_dtype(tiny_file):
    """`dtype` casts the weights (bf16 here) and the encode runs in it; the latent comes back float32."""
    encoder = ve.load_video_encoder(tiny_file("conv_vae"), torch.bfloat16)
    assert next(encoder.encoder.parameters()).dtype == torch.bfloat16
    assert ve.encode_video(encoder, _frames(1, 1, 32, 32, 3)).dtype == torch.float32


@pytest.mark.parametrize("pixels, what", [
    (torch.rand(1, 8, 64, 64, 3), "frame count is 8"),
    (torch.rand(1, 9, 48, 64, 3), "height is 48"),
    (torch.rand(1, 9, 64, 40, 3), "width is 40"),
    (torch.rand(1, 9, 64, 64, 4), "shape"),
    (torch.rand(9, 64, 64, 3), "shape"),
    (torch.zeros(1, 9, 64, 64, 3, dtype=torch.uint8), "torch.uint8"),
    (torch.rand(1, 0, 64, 64, 3), "shape"),
    ({"samples": torch.zeros(1, 128, 2, 2, 2)}, "dict"),
])
def test_bad_frames_are_refused_by_name(encoders, pixels, what):
    """Wrong frame counts (not 8k+1), sizes off the 32-px grid, RGBA, a missing batch axis, integer pixels, no
    frames, a LATENT: each an LTX25Error naming the input and what it found."""
    with pytest.raises(LTX25Error, match="encode_video.pixels") as error:
        ve.encode_video(encoders["conv_vae"], pixels)
    assert what in str(error.value), error.value


# ------------------------------------------------------------------------------------------------- tiling
@pytest.fixture(scope="module")
def cheap():
    """An encoder of the tiny layout without resnets (same grid, a fraction of the work), random weights: for the
    tiling tests, whose subject is the tiles, not the layers."""
    blocks = _tiny_blocks(0, (("compress_space_res", 1), ("compress_time_res", 1), ("compress_all_res", 1),
                              ("compress_all_res", 1)))
    config = ve.VideoEncoderConfig.from_metadata("cheap", {"config": {"vae": {**TINY_VAE_CONFIG,
                                                                               "encoder_blocks": blocks}}}, False)
    encoder = ve.VideoEncoder(config)
    randomize_(encoder, 0, "cheap_encoder", 0.05)
    encoder.latents_std.uniform_(0.75, 1.25, generator=torch.Generator().manual_seed(1))
    return encoder.eval().requires_grad_(False)


def _local(encoder: ve.VideoEncoder, leak: float) -> ve.VideoEncoder:
    """A copy whose convolutions look mostly (leak 0: only) at the current frame and pixel cell: each kernel keeps
    its last temporal tap (causal padding puts the current frame there) at the spatial centre, the other taps
    scaled by `leak`. With leak 0 every latent cell depends on its own 8×32×32 pixels alone."""
    local = copy.deepcopy(encoder)
    with torch.no_grad():
        for m in local.modules():
            if isinstance(m, torch.nn.Conv3d):
                taps = torch.full(m.weight.shape[2:], leak)
                taps[-1, m.weight.shape[3] // 2, m.weight.shape[4] // 2] = 1.0
                m.weight.mul_(taps)
    return local


TILINGS = {  # (frames, request): spatial tiles (2 row tiles of 3 cells sharing 2), temporal tiles (4 latent frames)
    "spatial": ((1, 1, 128, 64, 3), TilingRequest("manual", 800, 96, 16, 64)),
    "temporal": ((1, 33, 32, 32, 3), TilingRequest("manual", 24, 800, 16, 64)),
}


@pytest.mark.parametrize("case", list(TILINGS))
def test_tiling_is_exact_for_a_local_encoder(cheap, case):
    """With an encoder whose latent cells see only their own pixels, the tiled encode reproduces the untiled one:
    tiles cut on the latent grid, each encoded from exactly its pixels, the later temporal tile starting one
    latent frame early with that frame (made from one pixel frame) weighted 0, weights summing to one. A wrong
    pixel slice, a kept causal frame or weights off unity show as differences of the latent's own size."""
    shape, request = TILINGS[case]
    encoder, frames = _local(cheap, 0.0), _frames(*shape, seed=3)
    plan = ve.encode_plan(encoder, shape, request, None)
    assert plan.count == 2 and (plan.frames == ((0, 4), (1, 5)) if case == "temporal" else len(plan.rows) == 2)
    whole = ve.encode_video(encoder, frames, TilingRequest("off"))
    lines = []
    tiled = ve.encode_video(encoder, frames, request, on_plan=lines.append)
    assert len(lines) == 1 and "2 tiles" in lines[0], lines
    assert (tiled - whole).abs().max() <= 1e-5 * float(whole.abs().max()), float((tiled - whole).abs().max())


@pytest.mark.parametrize("case", list(TILINGS))
def test_tiled_encode_is_close_to_untiled(cheap, case):
    """An encoder that also sees its neighbours a little (leak 0.02, like a trained one's decaying reach): tiled
    within 6% (relative RMS) of untiled (measured 2–3% spatial, 1.1% temporal); the same encoder with
    hard cuts and no blending is off by more."""
    shape, request = TILINGS[case]
    encoder, frames = _local(cheap, 0.02), _frames(*shape, seed=4)
    whole = ve.encode_video(encoder, frames, TilingRequest("off"))
    tiled = ve.encode_video(encoder, frames, request)
    relative = float((tiled - whole).norm() / whole.norm())
    assert 0 < relative < 0.06, relative


def test_auto_tiles_only_when_the_budget_is_short(encoders):
    """auto: one tile when the estimate fits the budget (or none is given), tiles that fit a small one otherwise;
    `working_memory` is the untiled estimate model management is asked for."""
    encoder = encoders["conv_vae"]
    shape = (1, 121, 512, 768)
    need = ve.working_memory(encoder, shape)
    assert ve.encode_plan(encoder, shape, TilingRequest(), need).count == 1
    assert ve.encode_plan(encoder, shape, TilingRequest(), None).count == 1
    small = ve.encode_plan(encoder, shape, TilingRequest(), need // 8)
    assert small.count > 1 and small.estimate_bytes <= need // 8


@pytest.mark.parametrize("field, request_", [
    ("overlap_frames", TilingRequest("manual", 24, 96, 8, 64)),
    ("overlap_pixels", TilingRequest("auto", 80, 768, 24, 32)),
])
def test_overlaps_below_the_references_floor_are_refused(encoders, field, request_):
    """The reference refuses tiled encodes with less than 16 frames / 64 px of overlap; so does the pack."""
    with pytest.raises(LTX25Error, match=f"encode_video.{field}"):
        ve.encode_video(encoders["conv_vae"], _frames(1, 9, 64, 64, 3), request_)


def test_an_interrupt_stops_inside_the_untiled_encode(encoders):
    """Untiled, the clip is one tile: the check before each encoder block stops it before that tile completes,
    and the hooks are gone afterwards."""
    calls, tiles = [], []

    def check():
        calls.append(1)
        if len(calls) == 2:
            raise bridge.InterruptError("stop")

    encoder = encoders["conv_vae"]
    with pytest.raises(bridge.InterruptError):
        ve.encode_video(encoder, _frames(1, 9, 32, 32, 3), TilingRequest("off"), on_step=lambda *a: tiles.append(a),
                        check=check)
    assert len(calls) == 2 and tiles == []
    assert ve.encode_video(encoder, _frames(1, 1, 32, 32, 3)).shape == (1, 128, 1, 1, 1)
