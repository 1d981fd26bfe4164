"""The diffusion VAE: config from the file, key map and strict loading, the stage driver against diffusers' own
stage functions, tiling fidelity, the stage-5 scheduler loop, interrupts, and the decode node."""
from __future__ import annotations

import dataclasses
import gc
import json
import types

import pytest
import torch
from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoDiffusionDecoderModel
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

from nodes.comfy import bridge as comfy_bridge
from nodes.ltx import compat
from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.errors import LTX25Error
from nodes.tools.tiny.common import latent_statistics

RELEASED_DECODER = {  # docs/MODEL.md §10.1
    "in_channels": 128, "out_channels": 3, "patch_size": 4, "head_dim": 64,
    "stage_channels": [2048, 1024, 512, 512, 256], "stage_depths": [4, 6, 4, 2, 8],
    "stage_kernels": [[3, 7, 7], [3, 7, 7], [3, 5, 5], [3, 5, 5], [11, 11, 11]],
    "upsamples": [[[1, 2, 2], 2], [[2, 1, 1], 2], [[2, 2, 2], 1], [[2, 2, 2], 2]], "stage5_kernel": [11, 11, 11],
    "timestep_scale_multiplier": 1000.0, "default_num_inference_steps": 1, "resampler_kind": "linear",
    "spatial_padding_mode": "zeros"}
LATENT = torch.randn(1, 128, 3, 3, 3, generator=torch.Generator().manual_seed(7))
OFF = TilingRequest("off")


def manual(frames: int, pixels: int = 4096) -> TilingRequest:
    """Manual tiles at the tiny decoder's smallest safe overlaps (8 frames / 32 px); 4096 px leaves space whole."""
    return TilingRequest("manual", frames, pixels, overlap_frames=8, overlap_pixels=32)


TILES = dict(request=manual(16, 64))  # 2 × 2 × 2 tiles


def _metadata(decoder=RELEASED_DECODER, **vae):
    return {"config": {"vae": {"_class_name": "CausalDiffusionVAE", "decoder": decoder, "model_output_type": "x0",
                               **vae}}}


def _rewrite(src: str, dst: str, edit_metadata=None, edit_tensors=None) -> str:
    with safe_open(src, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    config = json.loads(metadata["config"])
    if edit_metadata:
        edit_metadata(config)
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, dst, metadata={**metadata, "config": json.dumps(config)})
    return dst


@pytest.fixture(scope="module")
def vae(tiny_file):
    return dv.load_diffusion_vae(tiny_file("diffusion_vae"), torch.float32)


@pytest.fixture(scope="module")
def untiled(vae):
    return dv.decode(vae, LATENT, processor="sdpa", request=OFF, seed=3)


# ------------------------------------------------------------------------------------------- config and keys
def test_config_comes_from_the_file_not_the_code_defaults(tiny_file, tmp_path):
    """Timestep ×1000, x0 output and 1 step are read from the file (the reference code would use ×1, v, 2);
    `t_emb_dim` is absent in the release and means 384; a missing value is refused rather than guessed."""
    config = dv.DiffusionVAEConfig.from_metadata("released", _metadata())
    assert (config.timestep_scale_multiplier, config.model_output_type, config.default_num_inference_steps,
            config.t_emb_dim, config.stage_kernels[-1], config.compression) == (1000.0, "x0", 1, 384, (3, 5, 5),
                                                                                 (8, 32))
    edited = _rewrite(tiny_file("diffusion_vae"), str(tmp_path / "vae.safetensors"), lambda c: c["vae"].update(
        model_output_type="v", decoder={**c["vae"]["decoder"], "timestep_scale_multiplier": 250.0,
                                        "default_num_inference_steps": 3}))
    decoder = dv.load_diffusion_vae(edited, torch.float32).model.decoder
    assert (decoder.timestep_scale_multiplier, decoder.model_output_type, decoder.default_num_inference_steps) \
        == (250.0, "v", 3)
    for missing in ("timestep_scale_multiplier", "default_num_inference_steps"):
        decoder_cfg = {k: v for k, v in RELEASED_DECODER.items() if k != missing}
        with pytest.raises(LTX25Error, match=missing):
            dv.DiffusionVAEConfig.from_metadata("x", _metadata(decoder_cfg))
    with pytest.raises(LTX25Error, match="model_output_type"):
        dv.DiffusionVAEConfig.from_metadata("x", {"config": {"vae": {"_class_name": "CausalDiffusionVAE",
                                                                      "decoder": RELEASED_DECODER}}})


def test_a_stripped_diffusion_vae_is_called_stripped_not_another_kind_of_file(tiny_file, tmp_path):
    """Without its metadata the file is still a diffusion VAE by its tensor names (that is how the loader took
    it): the error says its config is absent from the metadata, never that the file is not a diffusion VAE."""
    from safetensors.torch import load_file, save_file
    path = str(tmp_path / "stripped.safetensors")
    save_file(load_file(tiny_file("diffusion_vae")), path)
    with pytest.raises(LTX25Error, match="config.vae._class_name is absent") as error:
        dv.load_diffusion_vae(path, torch.float32)
    assert "stripped" in str(error.value) and "not a diffusion VAE" not in str(error.value), error.value
    with pytest.raises(LTX25Error, match="not a diffusion VAE file"):  # a config of another class still is one
        dv.DiffusionVAEConfig.from_metadata("x", {"config": {"vae": {"_class_name": "CausalVideoAutoencoder"}}})


def test_timestep_reaches_the_embedder_times_one_thousand(vae):
    """At sigma 1 the timestep embedder sees 1000 (the file's multiplier), not 1."""
    seen = []
    hook = vae.model.decoder.t_embedder.register_forward_pre_hook(lambda m, args: seen.append(float(args[0][0])))
    try:
        dv.decode(vae, LATENT, processor="sdpa", request=OFF, steps=2)
    finally:
        hook.remove()
    assert seen == [1000.0, 500.0], seen


def test_released_module_tree_maps_to_the_310_native_decoder_keys():
    """diffusers' module tree for the released config maps back to exactly the 310 `decoder.*` tensors of the
    shipped file (fused qkv, attn.proj, t_embedder.mlp, plus the dropped type_emb) and forward again to itself."""
    config = dv.DiffusionVAEConfig.from_metadata("released", _metadata())
    with torch.device("meta"):
        model = LTX2VideoDiffusionDecoderModel(**config.diffusers_kwargs())
    state = model.state_dict()
    native = dv.KEY_MAP.to_native({k: v for k, v in state.items() if not k.startswith("latents_")})
    native["decoder.type_emb"] = torch.empty(128, device="meta")
    assert len(native) == 310 and all(k.startswith("decoder.") for k in native)
    assert "decoder.det_stages.0.0.attn.qkv.weight" in native and "decoder.t_embedder.mlp.2.bias" in native
    assert "decoder.diff_blocks.7.attn.proj.weight" in native and "decoder.upsamples.3.proj.weight" in native
    mapped, dropped = dv.KEY_MAP.apply(native)
    assert set(mapped) == set(state) - {"latents_mean", "latents_std"} and list(dropped) == ["decoder.type_emb"]
    assert sum(v.numel() for v in model.parameters()) == 417_133_616


def test_fused_qkv_splits_in_thirds_and_only_attention_proj_is_renamed():
    """The fused `[3C, C]` tensor is q, k, v in that order; `upsamples.N.proj` and `shared_adaln.proj` keep
    their names while `attn.proj` becomes `to_out.0`."""
    fused = torch.arange(12.0).view(6, 2)
    mapped, _ = dv.KEY_MAP.apply({"decoder.diff_blocks.0.attn.qkv.weight": fused,
                                  "decoder.upsamples.0.proj.weight": fused, "decoder.shared_adaln.proj.bias": fused,
                                  "decoder.diff_blocks.0.attn.proj.weight": fused,
                                  "decoder.det_stages.1.2.attn.q_norm.weight": fused})
    prefix = "decoder.diff_blocks.0.attn."
    for i, part in enumerate(("to_q", "to_k", "to_v")):
        assert torch.equal(mapped[prefix + part + ".weight"], fused[2 * i:2 * i + 2])
    assert {"decoder.upsamples.0.proj.weight", "decoder.shared_adaln.proj.bias", prefix + "to_out.0.weight",
            "decoder.det_stages.1.2.attn.norm_q.weight"} <= set(mapped)


def test_strict_loading_refuses_unknown_and_missing_tensors(tiny_file, tmp_path):
    """Every file tensor is used or on the drop list, and every module tensor is filled."""
    src = tiny_file("diffusion_vae")
    extra = _rewrite(src, str(tmp_path / "extra.safetensors"),
                     edit_tensors=lambda t: t.update({"decoder.surprise.weight": torch.zeros(2)}))
    with pytest.raises(LTX25Error, match="surprise"):
        dv.load_diffusion_vae(extra)
    stray = _rewrite(src, str(tmp_path / "stray.safetensors"),
                     edit_tensors=lambda t: t.update({"audio_vae.x": torch.zeros(2)}))
    with pytest.raises(LTX25Error, match="audio_vae.x"):
        dv.load_diffusion_vae(stray)
    missing = _rewrite(src, str(tmp_path / "missing.safetensors"),
                       edit_tensors=lambda t: t.pop("decoder.conv_out.bias"))
    with pytest.raises(LTX25Error, match="conv_out.bias"):
        dv.load_diffusion_vae(missing)


def test_legacy_gates_fold_into_the_following_linear():
    """A legacy static gate multiplies its Linear's rows (weight and bias) and disappears; others pass through."""
    w, b, g = torch.randn(4, 3), torch.randn(4), torch.tensor([1.0, 2.0, 0.5, -1.0])
    native = {"decoder.diff_blocks.0.attn.proj.weight": w, "decoder.diff_blocks.0.attn.proj.bias": b,
              "decoder.diff_blocks.0.gate_msa": g, "decoder.diff_blocks.0.mlp.w_down.weight": w}
    folded = dv.fold_legacy_gates(native)
    assert "decoder.diff_blocks.0.gate_msa" not in folded
    assert torch.allclose(folded["decoder.diff_blocks.0.attn.proj.weight"], g[:, None] * w)
    assert torch.allclose(folded["decoder.diff_blocks.0.attn.proj.bias"], g * b)
    assert folded["decoder.diff_blocks.0.mlp.w_down.weight"] is w


def test_container_exposes_statistics_kind_and_no_flex_processor(vae):
    """The upsampler reads `latents_mean/std` from whichever video VAE is connected; the loader never leaves
    diffusers' dense-mask flex processor installed."""
    mean, std = latent_statistics(0)
    assert vae.kind == "diffusion"
    assert torch.allclose(vae.latents_mean, mean.bfloat16().float()) and torch.allclose(vae.latents_std,
                                                                                        std.bfloat16().float())
    processors = {type(p).__name__ for p in vae.model.attn_processors.values()}
    assert processors <= {"SdpaNAProcessor", "ComfyKitchenNAProcessor", "NattenNAProcessor"}, processors


# ------------------------------------------------------------------------------------------- the stage driver
def test_stage_driver_matches_diffusers_stage_functions(vae):
    """Our stages 1-3 (third upsample deferred to the tiles) and per-tile stage-4 input equal diffusers'
    `forward_stages_1_to_3`: bit for bit on the whole volume, to float rounding on any sub-box (a Linear over fewer
    rows may sum in another order), origin leading-frame rule included."""
    decoder = vae.model.decoder
    z = torch.randn(1, 128, 4, 3, 3)
    with torch.inference_mode():
        full = decoder.forward_stages_1_to_3(z)
        pre = compat.stages_1_to_3_before_last_upsample(decoder, z)
        for box in [((0, full.shape[1]), (0, 12), (0, 12)), ((5, 12), (3, 9), (4, 11)), ((6, 7), (11, 12), (0, 1))]:
            got = dv.stage4_input(decoder, pre, *box)
            want = full[:, slice(*box[0]), slice(*box[1]), slice(*box[2])]
            same = torch.equal(got, want) if box[0] == (0, full.shape[1]) else torch.allclose(got, want, 1e-5, 1e-5)
            assert same, f"{box}: max diff {(got - want).abs().max():.3e}"


def test_untiled_decode_equals_diffusers_decoder_on_the_same_noise(vae, monkeypatch):
    """With the same start noise, our single-tile decode is diffusers' own `forward_stage_4` + `denoise` on
    the un-normalized latent (mapped to [0, 1]): we only drive the network, never rewrite it."""
    decoder = vae.model.decoder
    noise = torch.randn(1, 3, 17, 96, 96, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(dv, "tile_noise", lambda *a: noise.clone())
    got, _ = dv.decode(vae, LATENT, processor="sdpa", request=OFF)
    z = LATENT * vae.latents_std.view(1, -1, 1, 1, 1) + vae.latents_mean.view(1, -1, 1, 1, 1)
    with torch.inference_mode():
        want = decoder.denoise(decoder.forward_stage_4(decoder.forward_stages_1_to_3(z)), noise, 1)
    want = ((want[0] + 1) / 2).clamp(0, 1).permute(1, 2, 3, 0)
    assert torch.allclose(got, want, atol=1e-6), f"max diff {(got - want).abs().max():.3e}"


def test_untiled_equals_single_tile_bit_exact(vae, untiled):
    """`off` and a manual tile at least the video's size run the same single-tile schedule: identical pixels."""
    single, stats = dv.decode(vae, LATENT, processor="sdpa", request=manual(4096), seed=3)
    assert stats.tile_count == untiled[1].tile_count == 1
    assert torch.equal(single, untiled[0])


def test_tiled_matches_untiled_within_tolerance(vae, untiled):
    """2×2×2 tiles with the (scaled) reference overlaps reproduce the untiled video up to seam noise; a wrong
    causal offset, ghost or origin rule would shift whole tiles and fail this by orders of magnitude."""
    tiled, stats = dv.decode(vae, LATENT, processor="sdpa", seed=3, **TILES)
    assert stats.extra["grid"] == (2, 2, 2) and stats.tile_count == 8
    diff = (tiled - untiled[0]).abs()
    assert tiled.shape == untiled[0].shape == (17, 96, 96, 3)
    assert diff.mean() < 2e-3 and diff.max() < 0.05, f"mean {diff.mean():.2e} max {diff.max():.2e}"
    # Away from every seam (first/last 2 frames × top-left 16 px: one tile at full weight, beyond the tiny
    # decoder's 3-frame / 12-px reach from any tile edge) tiling must not change a single pixel.
    for frames in (slice(0, 2), slice(15, 17)):
        assert diff[frames, :16, :16].max() < 1e-5, f"{frames}: {diff[frames, :16, :16].max():.2e}"


def test_small_latents_are_floor_padded_and_cropped_back(vae):
    """A latent below the decoder's floor (3, 7, 7 released; 3, 3, 3 tiny) still decodes, to its own size."""
    frames, _ = dv.decode(vae, LATENT[:, :, :1, :1, :2], processor="sdpa", request=OFF)
    assert frames.shape == (1, 32, 64, 3) and 0 <= frames.min() <= frames.max() <= 1


def test_seed_controls_the_noise_and_nothing_else_does(vae, untiled):
    """The same seed reproduces the video; another seed changes it."""
    again, _ = dv.decode(vae, LATENT, processor="sdpa", request=OFF, seed=3)
    other, _ = dv.decode(vae, LATENT, processor="sdpa", request=OFF, seed=4)
    assert torch.equal(again, untiled[0]) and not torch.allclose(other, untiled[0], atol=1e-3)


# ------------------------------------------------------------------------------------------- stage-5 scheduler
@pytest.mark.parametrize("output_type", ["x0", "v"])
@pytest.mark.parametrize("steps", [1, 2])
def test_scheduler_loop_equals_closed_form_euler(output_type, steps):
    """The FlowMatchEuler loop over sigmas linspace(1, 1/N, N) is the closed-form Euler update: x0 models are
    turned into velocity (x − x0)/σ and the last x0 is returned as is; v models step to σ = 0."""
    def predict(x, sigma):
        sigmas.append(float(sigma))
        outputs.append(0.3 * x + 0.7 * float(sigma) - 0.1)
        return outputs[-1]

    x = torch.randn(2, 3, 4, 5, 5)
    sigmas: list[float] = []
    outputs: list[torch.Tensor] = []
    got = dv.run_stage5(predict, x, steps, output_type, dv.make_stage5_scheduler())
    want, grid = x.clone(), [1.0, 0.5][:steps] if steps == 2 else [1.0]
    for i, s in enumerate(grid):
        out = 0.3 * want + 0.7 * s - 0.1
        s_next = grid[i + 1] if i + 1 < len(grid) else 0.0
        if output_type == "x0" and i == len(grid) - 1:
            want = out
            break
        velocity = out if output_type == "v" else (want - out) / s
        want = want + (s_next - s) * velocity
    assert sigmas == grid
    if output_type == "x0":  # the last prediction itself, not a float32 Euler round trip that lands on it
        assert got is outputs[-1]
    assert torch.allclose(got, want, atol=1e-5), f"max diff {(got - want).abs().max():.3e}"


@pytest.mark.parametrize("config", [{"use_dynamic_shifting": True}, {"shift": 3.0}, {"use_karras_sigmas": True},
                                    {"stochastic_sampling": True}])
def test_scheduler_configs_that_reshape_sigmas_are_refused(config):
    """Dynamic/static shifting and friends would change the decoder's trained sigmas; the error names the
    config to use."""
    with pytest.raises(LTX25Error, match=r"FlowMatchEulerDiscreteScheduler\(shift=1.0, use_dynamic_shifting=False"):
        dv.make_stage5_scheduler(config)


# ------------------------------------------------------------------------------------------- progress, interrupts
def test_progress_reports_every_tile_step(vae):
    """on_step sees 1..tiles×steps with the total, which is what drives ComfyUI's bar and interrupt checks."""
    seen = []
    _, stats = dv.decode(vae, LATENT, processor="sdpa", steps=2, request=manual(16),
                         on_step=lambda done, total: seen.append((done, total)))
    assert stats.tile_count == 2 and seen == [(i, 4) for i in range(1, 5)]


def _live_tensor_bytes(exclude: set[int]) -> int:
    gc.collect()
    return sum(t.untyped_storage().nbytes() for t in gc.get_objects()
               if type(t) in (torch.Tensor, torch.nn.Parameter)  # not fake/functional tensors of compiled code
               and t.untyped_storage().data_ptr() not in exclude)


def test_interrupt_between_tiles_leaves_no_allocation_behind(vae):
    """An interrupt raised from on_step after the first tile leaves no decode tensor alive, even while the
    exception (and its traceback, which ComfyUI keeps until the next prompt) is still referenced."""
    keep = {t.untyped_storage().data_ptr() for t in [*vae.parameters(), *vae.buffers(), LATENT]}
    before = _live_tensor_bytes(keep)

    def stop(done, total):
        if done == 1:
            comfy_bridge.request_interrupt()
        comfy_bridge.check_interrupt()

    with pytest.raises(comfy_bridge.InterruptError) as excinfo:
        dv.decode(vae, LATENT, processor="sdpa", on_step=stop, **TILES)
    leaked = _live_tensor_bytes(keep) - before
    assert excinfo.value is not None and leaked < 64 * 1024, f"{leaked} bytes of tensors survived the interrupt"


# ------------------------------------------------------------------------------------------- the node
def test_node_decodes_and_refuses_a_conv_vae(tiny_file):
    """The node takes the loader's handle and a LATENT, returns IMAGE [F, H, W, 3] and decode stats; a conv VAE
    on its input is an error that points at the conv decode node."""
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.comfy.handles import Loaded
    from nodes.ltx.files.assets import inspect_asset

    path = tiny_file("diffusion_vae")
    handle = Loaded.register(dv.load_diffusion_vae(path, torch.float32), inspect_asset(path))
    node = LTX25DiffusionVAEDecode()
    out = node.decode(handle, {"samples": LATENT[:, :, :, :2, :2]}, "auto", 0, 5, "auto", 80, 512, 40, 160, 0.0)
    images, stats = out["result"]
    assert images.shape == (17, 64, 64, 3) and stats.decoder == "diffusion" and stats.steps == 1
    assert out["ui"]["ltx25_decode_stats"] == [stats.as_dict()]  # what the canvas shows on the node
    assert stats.processor == "sdpa" and stats.tile_count == 1
    conv = types.SimpleNamespace(module=types.SimpleNamespace(kind="conv"),
                                 info=types.SimpleNamespace(name="ltx-2.5-video-vae-conv-bf16.safetensors"))
    with pytest.raises(LTX25Error, match="Conv VAE Decode"):
        node.decode(conv, {"samples": LATENT}, "auto", 0, 0, "auto", 80, 512, 40, 160, 0.0)
    inputs = LTX25DiffusionVAEDecode.INPUT_TYPES()["required"]
    assert all("tooltip" in spec[1] for spec in inputs.values())


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op makes."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_a_tiled_decode_keeps_no_canvas_sized_blend_buffer(vae):
    """Tiles go straight into the output frames: no `[B, 3, F, H, W]` tensor spanning the whole canvas is ever
    made (the old decode kept one per temporal group in fp16, 1.4 GiB at 1920×1088, the floor's second term)."""
    latent = torch.randn(1, 128, 5, 3, 3, generator=torch.Generator().manual_seed(2))
    schedule = dv.plan(vae, (5, 3, 3), manual(16, 64), None)
    assert schedule.grid[0] >= 3 and schedule.grid[1] > 1, schedule.grid
    canvas_hw = schedule.canvas[1:]
    with _Shapes() as seen:
        frames, _ = dv.decode(vae, latent, processor="sdpa", request=manual(16, 64))
    assert frames.shape == (33, 96, 96, 3) and seen.shapes
    assert not [shape for shape in seen.shapes if len(shape) == 5 and shape[-2:] == canvas_hw]


@pytest.mark.parametrize("shape,request_", [((1, 128, 5, 3, 3), manual(16, 64)), ((2, 128, 4, 2, 3), manual(16, 64)),
                                            ((1, 128, 6, 1, 2), manual(16))])
def test_tiled_frames_are_the_blend_of_the_tiles_own_pixels(vae, monkeypatch, shape, request_):
    """Each tile's pixels, weighted by its trapezoid ramps, are added into the output, and a frame is mapped to
    [0, 1] (and clamped) once, after every tile reaching it was added: equal to a float64 blend of the very same
    tile outputs to float32 rounding. A missing weight, a crop off by a row, a frame mapped before the next
    group's ramp reached it (or twice) would differ by the frames' own scale. Batch of two and a floor-padded
    latent included."""
    tiles = []
    original = dv._Decode.tile

    def recorded(self, *args, **kwargs):
        tiles.append((args[2], original(self, *args, **kwargs)))
        return tiles[-1][1].clone()

    monkeypatch.setattr(dv._Decode, "tile", recorded)
    latent = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    frames, stats = dv.decode(vae, latent, processor="sdpa", request=request_, seed=1)
    schedule = dv.plan(vae, shape[2:], request_, None)
    assert stats.tile_count == len(tiles) == schedule.tile_count > 2
    blend = torch.zeros(shape[0], 3, *schedule.canvas, dtype=torch.float64)
    for tile, x0 in tiles:
        weight = tile.t.weights().double()[:, None, None] * tile.h.weights().double()[None, :, None] * \
            tile.w.weights().double()[None, None, :]
        blend[:, :, slice(*tile.t.pixels), slice(*tile.h.pixels), slice(*tile.w.pixels)] += x0.double() * weight
    f, rows, cols = schedule.content
    want = ((blend[:, :, f, rows, cols] + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).reshape(frames.shape)
    err = (frames.double() - want).abs().max()
    assert err < 1e-6, f"max diff {err:.2e}"


# ------------------------------------------------------------------------------------ stages 1-3 in slabs
def test_slabbed_stages_1_to_3_equal_the_whole_clip_on_every_slab(vae):
    """Every latent slab the geometry says can run gives the whole clip's stages-1-3 features, to float rounding
    relative to their scale, at exactly the frames `slab_trace` predicts: a halo too small (too little cut off a
    slab's edge) or a wrong causal frame mapping would differ by the features' own size."""
    decoder, geometry = vae.model.decoder, vae.config.geometry()
    z = torch.randn(1, 128, 7, 3, 3, generator=torch.Generator().manual_seed(11))
    ghosted = torch.cat([z, z[:, :, -1:].expand(-1, -1, geometry.ghost_latent_frames, -1, -1)], dim=2)
    total, ran = ghosted.shape[2], 0
    with torch.inference_mode():
        full = compat.stages_1_to_3_before_last_upsample(decoder, z)
        scale = full.abs().max()
        for start in range(total):
            for stop in range(start + 1, total + 1):
                if not geometry.slab_fits(start, stop, total):
                    continue
                got, first = compat.stages_1_to_3_slab(decoder, ghosted[:, :, start:stop], start, total)
                assert (first, first + got.shape[1]) == geometry.slab_trace(start, stop, total)[0], (start, stop)
                err = (got - full[:, first:first + got.shape[1]]).abs().max() / scale
                assert err < 1e-5, f"slab {start}:{stop}: relative error {err:.2e}"
                ran += 1
    assert ran > total  # interior, leading, trailing and whole slabs all ran


@pytest.mark.parametrize("pre_chunk", [1, 3])
def test_slabbed_decode_equals_the_whole_clip_decode(vae, monkeypatch, pre_chunk):
    """A temporally tiled decode whose stages 1-3 run per group in slabs gives the frames of the same schedule with
    stages 1-3 on the whole clip, to float rounding: the group features, their frame offset and the slab cover are
    right (a wrong `pre_first` or an uncovered chunk would shift or zero whole tiles)."""
    latent = torch.randn(1, 128, 6, 3, 3, generator=torch.Generator().manual_seed(5))
    whole, stats = dv.decode(vae, latent, processor="sdpa", request=manual(16, 64), seed=3)
    plan = dv.plan

    def slabbed(*args, **kwargs):
        return dataclasses.replace(plan(*args, **kwargs), pre_chunk=pre_chunk)

    monkeypatch.setattr(dv, "plan", slabbed)
    got, slab_stats = dv.decode(vae, latent, processor="sdpa", request=manual(16, 64), seed=3)
    assert stats.extra["grid"][0] > 1 and slab_stats.extra["grid"] == stats.extra["grid"]
    err = (got - whole).abs().max()
    assert err < 1e-5, f"max diff {err:.2e}"


def test_model_management_is_asked_for_what_the_processors_blocks_hold(vae):
    """The node asks model management to free the untiled decode's working memory for the processor it will run:
    the lean blocks' count with the triton processor (5 tensors of stage 5's width per token), diffusers' blocks'
    otherwise (12), and never less than the decode will plan with."""
    from nodes.ltx.kernels import na_attention as na
    shape, triton = (1, 128, 4, 3, 3), na.TritonNAProcessor()  # constructed only: nothing runs here
    lean, full = dv.working_memory(vae, shape, None, triton), dv.working_memory(vae, shape)
    untiled = dv.plan(vae, shape[2:], OFF, None)
    assert lean == dv.memory_model(vae, 1, triton).estimate(untiled) < full
    assert full == dv.memory_model(vae, 1).estimate(untiled)


def test_node_refuses_a_budget_below_the_weights_before_loading_them(tiny_file):
    """As the conv decode node: a memory_budget_gb below the decoder's weights is refused by name before the load."""
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.comfy.handles import Loaded
    from nodes.ltx.files.assets import inspect_asset
    path = tiny_file("diffusion_vae")
    handle = Loaded.register(dv.load_diffusion_vae(path, torch.float32), inspect_asset(path))
    with pytest.raises(LTX25Error, match="decoder's own") as error:
        LTX25DiffusionVAEDecode().decode(handle, {"samples": LATENT[:, :, :, :2, :2]}, "auto", 0, 5, "auto", 80, 512,
                                         40, 160, 1e-6)
    assert error.value.where == "LTX25DiffusionVAEDecode.memory_budget_gb" and not handle.patcher.is_loaded()
