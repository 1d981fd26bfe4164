"""Quantized weights kept quantized ('as stored'): `QuantizedLinear` against dequantize-then-compute per format, its
memory (the packed bytes), the FP8 GEMM's numerics and selection, and the tiny NVFP4 / FP8 / int8-convrot transformer
and text encoder loaded as stored — every quantized Linear swapped in, strict coverage kept, the same denoise and
features as the dequantized model, and bad files refused by file and key."""
from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nodes.comfy.loaders import LTX25TextEncoderLoader, LTX25TransformerLoader, LTX25VideoVAELoader, WEIGHT_DTYPES
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files import quant
from nodes.ltx.files.quant import INT8, LayerFormat
from nodes.ltx.kernels import quantized_linear as QL
from nodes.ltx.text import encoder as E
from nodes.tools.tiny import quantized as tiny_quantized

U_BF16 = 2.0**-8  # bf16 unit roundoff
KINDS = ("nvfp4", "fp8", "int8", "int8-convrot")


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


# ---------------------------------------------------------------------------------------------------- the module
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_linear_equals_dequantize_then_linear(kind, dtype):
    """Each format's forward against `F.linear(x, dequantized W)`: NVFP4 and FP8 (weight-only off CUDA) decode with
    the same function as the dequantizing load, so bit-identical; int8 multiplies by the scales in the compute dtype
    and rotates the activations instead of W: float32 rounding in float32, a few bf16 roundings in bf16."""
    layer = QL.random_quantized_linear(kind, 512, 96, bias=True, convrot_groupsize=256, seed=1).to(dtype)
    x = torch.randn(3, 7, 512, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = layer(x)
    want = torch.nn.functional.linear(x, layer.dequantized_weight(dtype), layer.bias)
    assert got.dtype == dtype and got.shape == (3, 7, 96)
    if kind in ("nvfp4", "fp8"):
        assert torch.equal(got, want), f"{kind}: max diff {(got - want).abs().max().item()}"
    else:
        bound = 1e-6 if dtype == torch.float32 else 4 * U_BF16
        assert relative(got, want) < bound, f"{kind} {dtype}: {relative(got, want):.2e} of the output scale"


def test_quantized_linear_holds_only_the_packed_bytes():
    """The module's device bytes are the file's packed tensors (+ bias), not a bf16 copy: ~0.28× bf16 for NVFP4
    (4.5 bits a weight), ~0.5× for FP8 and int8."""
    out_features, in_features = 256, 512
    bf16_bytes = out_features * in_features * 2
    ratios = {"nvfp4": (0.25, 0.30), "fp8": (0.5, 0.51), "int8": (0.5, 0.51), "int8-convrot": (0.5, 0.51)}
    for kind, (low, high) in ratios.items():
        layer = QL.random_quantized_linear(kind, in_features, out_features)
        state = layer.state_dict()
        assert module_bytes(layer) == sum(t.numel() * t.element_size() for t in state.values())
        assert low <= module_bytes(layer) / bf16_bytes <= high, f"{kind}: {module_bytes(layer) / bf16_bytes:.3f}"
        want = {"weight", "weight_scale"} | ({"weight_scale_2"} if kind == "nvfp4" else set())
        assert set(state) == want, f"{kind}: state_dict keys {sorted(state)} are not the file's names"


def test_a_dtype_cast_of_the_module_keeps_the_stored_format():
    """`.to(float16)` / `.float()` (a model-wide cast) must cast the bias only: casting E4M3 scales or the fp32
    per-tensor scale would change the weights (docs/MODEL.md §13 item 13)."""
    for kind in ("nvfp4", "fp8"):
        layer = QL.random_quantized_linear(kind, 64, 32, bias=True)
        before = {k: v.clone() for k, v in layer.state_dict().items() if k != "bias"}
        layer.to(torch.float16)
        assert layer.bias.dtype == torch.float16
        for name, tensor in before.items():
            assert getattr(layer, name).dtype == tensor.dtype and torch.equal(getattr(layer, name), tensor), name
        assert isinstance(layer.weight, torch.nn.Parameter) and not layer.weight.requires_grad


# ---------------------------------------------------------------------------------------------------- FP8 GEMM
@pytest.mark.parametrize("rowwise", [True, False])
def test_fp8_scaled_mm_stays_within_activation_rounding(rowwise):
    """The FP8 GEMM (run here through torch's CPU `_scaled_mm`) differs from dequantize-then-linear only by the E4M3
    rounding of the activations: at most 2^-4 of Σ|x|·|W| per output, plus bf16 output rounding."""
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(4)) * 0.1
    stored = quant.quantize_fp8(w)
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    x[0, 0] *= 100  # an outlier token: per-row scaling keeps the other rows fine
    bias = torch.randn(64).bfloat16()
    got = QL.fp8_linear(x, stored["weight"], stored["weight_scale"], bias, rowwise=rowwise)
    weight = quant.dequantize_fp8(stored["weight"], stored["weight_scale"], torch.float32)
    want = torch.nn.functional.linear(x.float(), weight, bias.float())
    bound = 2**-4 * (x.float().abs() @ weight.abs().T) + 2 * U_BF16 * want.abs() + 1e-6
    excess = ((got.float() - want).abs() / bound).max().item()
    assert got.dtype == torch.bfloat16 and excess <= 1.0, f"error {excess:.2f}× the rounding bound"


def test_fp8_gemm_is_chosen_only_where_fp8_tensor_cores_exist(monkeypatch):
    """sm_90+: per-row scales; sm_89: per-tensor (only with a per-tensor weight scale); older GPUs, the CPU, non-bf16
    activations, E5M2 weights or dimensions off 16: weight-only dequantization."""
    w, scale = torch.zeros(32, 64, dtype=torch.float8_e4m3fn), torch.tensor(1.0)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["value"])
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w, scale) == "rowwise"
    assert QL.fp8_gemm_mode(cpu, torch.bfloat16, w, scale) is None
    assert QL.fp8_gemm_mode(cuda, torch.float16, w, scale) is None
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w.to(torch.float8_e5m2), scale) is None
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w[:, :40], scale) is None
    capability["value"] = (8, 9)
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w, scale) == "tensorwise"
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w, torch.ones(32)) is None
    capability["value"] = (8, 6)
    assert QL.fp8_gemm_mode(cuda, torch.bfloat16, w, scale) is None


# ---------------------------------------------------------------------------------------------------- tiny files
def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    video, audio = torch.randn((1, 128, 3, 2, 2), generator=g), torch.randn((1, 8, 5, 16), generator=g)
    return video, audio, Conditioning(torch.randn(1, 1024, 64, generator=g), torch.randn(1, 1024, 32, generator=g))


VARIANTS = [("nvfp4", None), ("fp8", None), ("fp8", "tensors"), ("int8-convrot", "tensors"),
            ("int8-convrot", "metadata")]


@pytest.fixture(scope="module")
def quantized_transformer(transformer_path, tmp_path_factory):
    """`quantized_transformer(variant, record)` → path of that tiny quantized transformer (written once)."""
    folder, paths = tmp_path_factory.mktemp("quantized"), {}

    def get(variant: str, record: str | None = None) -> str:
        if (variant, record) not in paths:
            dst = str(folder / f"{variant}-{record}.safetensors")
            paths[variant, record] = tiny_quantized.write_tiny_transformer(transformer_path, dst, variant, record)
        return paths[variant, record]

    return get


@pytest.mark.parametrize("variant, record", VARIANTS)
def test_tiny_quantized_transformer_as_stored_matches_the_dequantized_model(quantized_transformer, variant, record):
    """Loaded 'as stored', every quantized Linear of the file is a QuantizedLinear (and nothing else is), the model
    holds the packed bytes, and its denoise equals the dequantized model's: bit-identical in bf16 for NVFP4 and FP8;
    in float32 (`.float()` keeps the format) within float32 rounding for every format."""
    path = quantized_transformer(variant, record)
    with safe_open(path, framework="pt") as f:
        quantized = {T.KEY_MAP.rename(k)[: -len(".weight_scale")] for k in f.keys() if k.endswith(".weight_scale")}
    as_stored, dequantized = T.load_transformer(path, None), T.load_transformer(path, torch.bfloat16)
    swapped = {name for name, m in as_stored.named_modules() if isinstance(m, QL.QuantizedLinear)}
    assert swapped == quantized and len(swapped) == 56
    packed = [m for m in as_stored.modules() if isinstance(m, QL.QuantizedLinear)]
    saved = sum(m.out_features * m.in_features * 2 + (0 if m.bias is None else m.bias.numel() * 2) - module_bytes(m)
                for m in packed)
    assert saved > 0 and module_bytes(as_stored) == module_bytes(dequantized) - saved, "bf16 copies are held"
    video, audio, cond = inputs()
    got = T.denoise(as_stored, video, audio, 0.7, cond, 24.0)
    want = T.denoise(dequantized, video, audio, 0.7, cond, 24.0)
    if variant != "int8-convrot":
        assert all(torch.equal(g, w) for g, w in zip(got, want)), "bf16 denoise differs from the dequantized model"
    got = T.denoise(as_stored.float(), video, audio, 0.7, cond, 24.0)
    want = T.denoise(T.load_transformer(path, torch.float32), video, audio, 0.7, cond, 24.0)
    errors = [relative(g, w) for g, w in zip(got, want)]
    assert max(errors) < 1e-5, f"float32 denoise differs by {errors} of the output scale"


def test_int8_convrot_bf16_denoise_differs_no_more_than_bf16_itself(quantized_transformer):
    """int8-convrot rounds differently from a bf16 dequantized weight (activations rotated, scales applied in bf16):
    against the float32 model it is no further off than the dequantized bf16 model is."""
    path = quantized_transformer("int8-convrot", "tensors")
    video, audio, cond = inputs(1)
    exact = T.denoise(T.load_transformer(path, torch.float32), video, audio, 0.7, cond, 24.0)
    ours = T.denoise(T.load_transformer(path, None), video, audio, 0.7, cond, 24.0)
    bf16 = T.denoise(T.load_transformer(path, torch.bfloat16), video, audio, 0.7, cond, 24.0)
    for o, b, e in zip(ours, bf16, exact):
        assert relative(o, e) <= 2 * relative(b, e) + U_BF16, f"{relative(o, e):.2e} vs bf16's {relative(b, e):.2e}"


def test_as_stored_on_a_float_file_is_the_bf16_load(transformer_path):
    """A bf16 file 'as stored': no QuantizedLinear, the same tensors as the bf16 load."""
    as_stored, bf16 = T.load_transformer(transformer_path, None), T.load_transformer(transformer_path, torch.bfloat16)
    assert not any(isinstance(m, QL.QuantizedLinear) for m in as_stored.modules())
    want = bf16.state_dict()
    assert all(torch.equal(t, want[k]) and t.dtype == want[k].dtype for k, t in as_stored.state_dict().items())


def rewrite(src: str, dst: str, edit) -> str:
    with safe_open(src, framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    edit(tensors)
    save_file(tensors, dst, metadata=metadata)
    return dst


LAYER = "model.diffusion_model.transformer_blocks.1.ff.net.2"
NAMED = r"transformer_blocks\.1\.ff\.net\.2\."  # the layer, under its file or its module name


@pytest.mark.parametrize("variant, edit, what", [
    ("nvfp4", lambda t: t.pop(LAYER + ".weight_scale_2"), NAMED + r"weight_scale_2 is missing"),
    ("fp8", lambda t: t.pop(LAYER + ".weight_scale"), NAMED + r"weight_scale is missing"),
    ("int8-convrot", lambda t: t.update({LAYER + ".weight_scale": t[LAYER + ".weight_scale"][:5]}),
     NAMED + r"weight_scale is torch.float32 \(5, 1\)"),
    ("int8-convrot", lambda t: t.update({LAYER + ".weight": t[LAYER + ".weight"].T.contiguous(),
                                         LAYER + ".weight_scale": torch.ones(256, 1)}),
     NAMED + r"weight( is)? \(256, 64\)"),
    ("fp8", lambda t: t.update({"model.diffusion_model.stray.weight_scale": torch.tensor(1.0)}),
     r"1 file tensor unused \(model\.diffusion_model\.stray\.weight_scale\)"),  # the file's name for it
])
def test_bad_quantized_files_are_refused_by_file_and_key(quantized_transformer, tmp_path, variant, edit, what):
    """A missing scale, a scale or packed weight of the wrong shape, a stray scale: LTX25Error naming the file and
    the key, in both modes (strict coverage holds as stored too)."""
    src = quantized_transformer(variant, "tensors" if variant == "int8-convrot" else None)
    dst = rewrite(src, str(tmp_path / "bad.safetensors"), edit)
    for dtype in (None, torch.bfloat16):
        with pytest.raises(LTX25Error) as error:
            T.load_transformer(dst, dtype)
        message = str(error.value)
        assert message.startswith(dst) and re.search(what, message), message


# ---------------------------------------------------------------------------------------------------- text encoder
def test_tiny_int8_convrot_text_encoder_as_stored_matches_the_dequantized_encoder(tiny_file, tmp_path):
    """The int8-convrot text encoder as stored: its decoder-layer Linears stay quantized, the quantized embedding
    table (not a Linear) is dequantized at load, fewer bytes are held, and the features equal the dequantized
    encoder's in float32 (given the same bf16 embedding table)."""
    path = tiny_quantized.write_tiny_text_encoder(tiny_file("text_encoder"), str(tmp_path / "te.safetensors"))
    spec = E.TextEncoderSpec.from_file(path, None)
    as_stored = E.load_text_encoder(spec)
    dequantized = E.load_text_encoder(E.TextEncoderSpec.from_file(path, torch.float32))
    swapped = [m for m in as_stored.modules() if isinstance(m, QL.QuantizedLinear)]
    layers = len(as_stored.gemma.language_model.layers)
    assert len(swapped) == 7 * layers - 1, "q/k/v/o + gate/up/down per layer (the global layer has k = v)"
    assert all(m.format == LayerFormat(INT8, 16) for m in swapped)
    embed = as_stored.gemma.language_model.embed_tokens.weight
    assert embed.dtype == torch.bfloat16
    assert module_bytes(as_stored) < module_bytes(dequantized.to(torch.bfloat16)) * 0.85
    dequantized = E.load_text_encoder(E.TextEncoderSpec.from_file(path, torch.float32))
    with torch.no_grad():
        dequantized.gemma.language_model.embed_tokens.weight.copy_(embed.float())
    tokens = spec.tokenizer.encode(["a red fox runs through the snow", "rain"])
    got = E.run_encoder(as_stored.float(), tokens.ids, tokens.mask)
    want = E.run_encoder(dequantized, tokens.ids, tokens.mask)
    errors = [relative(g, w) for g, w in zip(got, want)]
    assert max(errors) < 1e-5, f"features differ by {errors} of their scale"


# ---------------------------------------------------------------------------------------------------- widgets
def test_as_stored_is_the_first_and_default_choice_where_quantized_files_exist():
    """Transformer and text encoder: 'as stored' (None to the engine) first and default; the bf16-only components
    keep bf16."""
    assert WEIGHT_DTYPES["as stored"] is None
    for loader in (LTX25TransformerLoader, LTX25TextEncoderLoader):
        choices, options = loader.INPUT_TYPES()["required"]["weight_dtype"]
        assert choices[0] == "as stored" and options["default"] == "as stored"
    choices, options = LTX25VideoVAELoader.INPUT_TYPES()["required"]["weight_dtype"]
    assert "as stored" not in choices and options["default"] == "bf16"


def test_real_shape_layers_build_for_benchmarks():
    """`random_quantized_linear` builds any format at a given shape (the benchmark's entry point)."""
    layer = QL.random_quantized_linear("int8-convrot", 1024, 64, bias=True)
    assert layer.format == LayerFormat(INT8, 256) and layer(torch.randn(2, 1024).bfloat16()).shape == (2, 64)
    with pytest.raises(LTX25Error, match="kind is 'mxfp8'"):
        QL.random_quantized_linear("mxfp8", 64, 64)


# ---------------------------------------------------------------------------------------------------- FP8 compute
def test_fp8_row_scales_keep_every_row_within_e4m3_rounding():
    """`quantize_fp8_rows`: one scale per output row, so every weight comes back within E4M3's rounding of itself
    measured against its OWN row's largest value (half a unit in the last place: 2^-4 of the value, or 2^-10 of the
    row's amax / 448 in E4M3's subnormal range), also for a row 1000× smaller than the largest. Fails with one scale
    for the whole tensor (that row would fall into the subnormals and lose its mantissa)."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
    w[5] *= 1e-3
    w[9] *= 30
    stored = quant.quantize_fp8_rows(w)
    back = quant.dequantize_fp8(stored["weight"], stored["weight_scale"], torch.float32)
    row_unit = w.abs().amax(dim=1, keepdim=True) / quant.E4M3_MAX
    bound = torch.maximum(w.abs() * 2**-4, row_unit * 2**-10) * (1 + 1e-6)
    excess = ((back - w).abs() / bound).max().item()
    assert stored["weight"].dtype == torch.float8_e4m3fn and stored["weight_scale"].shape == (32,)
    assert excess <= 1.0, f"error {excess:.2f}× the per-row rounding bound"


def test_fp8_linear_with_row_scales_is_the_float32_product_of_its_quantized_operands():
    """The FP8-compute GEMM (`torch._scaled_mm`, which torch also runs on the CPU) is the float32 product of its two
    E4M3 operands times their scales — activations scaled per token by their own amax / 448, weights per row — up
    to float32 accumulation and the bf16 output rounding. Fails if a per-row weight scale lands on the wrong axis or
    the activation scale is dropped."""
    g = torch.Generator().manual_seed(8)
    w = torch.randn(48, 64, generator=g) * torch.logspace(-2, 1, 48)[:, None]
    stored = quant.quantize_fp8_rows(w)
    x = torch.randn(3, 7, 64, generator=g).bfloat16()
    x[0, 0] *= 50
    bias = torch.randn(48, generator=g).bfloat16()
    got = QL.fp8_linear(x, stored["weight"], stored["weight_scale"], bias, rowwise=True)
    rows = x.reshape(-1, 64).float()
    x_scale = rows.abs().amax(dim=1, keepdim=True) / quant.E4M3_MAX
    xq = (rows / x_scale).to(torch.float8_e4m3fn).float() * x_scale
    wq = stored["weight"].float() * stored["weight_scale"][:, None]
    want = (xq @ wq.T + bias.float()).reshape(3, 7, 48)
    bound = 2 * U_BF16 * want.abs() + 1e-5 * (xq.abs() @ wq.abs().T).reshape(3, 7, 48) + 1e-6
    excess = ((got.float() - want).abs() / bound).max().item()
    assert got.dtype == torch.bfloat16 and excess <= 1.0, f"error {excess:.2f}× the rounding bound"


def test_fp8_compute_load_turns_only_the_blocks_linears_into_per_row_fp8(tiny_models):
    """The loader's 'fp8 compute': the bf16 file, then every Linear inside the DiT's blocks whose sizes the FP8 GEMM
    takes (multiples of 16) is an FP8 QuantizedLinear with one scale per output row; nothing outside the blocks
    changes, the blocks' memory shrinks, and the denoise stays near the bf16 model's (here the CPU's weight-only
    path: only the weights' rounding differs). FP8 compute on another dtype is refused."""
    from nodes.comfy.loaders import FP8_COMPUTE
    from nodes.ltx.release import OFFICIAL_FILES
    name = OFFICIAL_FILES["transformer"][1]
    assert LTX25TransformerLoader.INPUT_TYPES()["required"]["weight_dtype"][0][-1] == FP8_COMPUTE
    fp8 = LTX25TransformerLoader().load(name, FP8_COMPUTE)[0].module
    bf16 = LTX25TransformerLoader().load(name, "bf16")[0].module
    eligible = {n for n, m in bf16.named_modules() if type(m) is torch.nn.Linear and n.startswith(
        "dit.transformer_blocks.") and m.in_features % 16 == 0 and m.out_features % 16 == 0}
    swapped = {n: m for n, m in fp8.named_modules() if isinstance(m, QL.QuantizedLinear)}
    assert set(swapped) == eligible and len(eligible) > 20, sorted(set(swapped) ^ eligible)[:5]
    assert all(m.weight.dtype == torch.float8_e4m3fn and m.weight_scale.numel() == m.out_features
               for m in swapped.values())
    outside = {k: t for k, t in bf16.state_dict().items() if not k.startswith("dit.transformer_blocks.")}
    assert all(torch.equal(fp8.state_dict()[k], t) for k, t in outside.items())
    assert module_bytes(fp8) < module_bytes(bf16)
    video, audio, cond = inputs(2)
    got, want = T.denoise(fp8, video, audio, 0.7, cond, 24.0), T.denoise(bf16, video, audio, 0.7, cond, 24.0)
    errors = [relative(g, w) for g, w in zip(got, want)]
    assert 0 < max(errors) < 2**-4, f"fp8-compute denoise off by {errors} of the output scale"
    with pytest.raises(LTX25Error, match="FP8 compute"):
        T.load_transformer(name, torch.float32, fp8_compute=True)  # refused before the file is read


# Not bf16: Triton's interpreter truncates float32 → bf16 where the GPU rounds to nearest even; the float32 products
# equal bit for bit here prove the decode, and bench/bench_nvfp4_linear.py checks bf16 equality on the GPU.
@pytest.mark.parametrize("row_bytes", [None, 16])  # 16: a row takes several programs, as the DiT's rows do
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nvfp4_one_pass_decode_equals_the_dequantizing_load_bit_for_bit(dtype, row_bytes, monkeypatch):
    """The Triton decode (run here in Triton's interpreter) reads every byte value, every E4M3 block scale from its
    swizzled place across two 128-row tiles and two column tiles, and the tensor scale exactly as
    `quant.dequantize_nvfp4` does; high nibble first, sign bit 3."""
    from nodes.ltx.kernels import nvfp4_triton
    if nvfp4_triton.triton is None:
        pytest.fail("Triton is a dependency of the pack's kernels and must be importable in the test environment")
    if row_bytes is not None:
        monkeypatch.setattr(nvfp4_triton, "ROW_BYTES", row_bytes)
    g = torch.Generator().manual_seed(1)
    rows, cols = 130, 96
    packed = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8)
    packed.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)  # every byte value once
    stored = quant.quantize_nvfp4(torch.randn(rows, cols, generator=g))
    block_scale, tensor_scale = stored["weight_scale"], torch.tensor(0.37)
    scale_bytes = block_scale.view(torch.uint8).view(-1)
    scale_bytes.copy_(torch.arange(scale_bytes.numel()) % 127)  # every E4M3 scale but NaN, subnormals included
    want = quant.dequantize_nvfp4(packed, block_scale, tensor_scale, dtype)
    got = nvfp4_triton.dequantize(packed, block_scale, tensor_scale, dtype, force_kernel=True)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert got.dtype == dtype and torch.equal(got.view(bits), want.view(bits))


def test_nvfp4_one_pass_decode_gives_way_to_the_torch_ops_where_it_cannot_run(monkeypatch, caplog):
    """A Triton that cannot build the kernel (or a kernel that disagrees) must leave NVFP4 layers on the torch-op
    decode with a warning, not fail every layer: the probe says so."""
    from nodes.ltx.kernels import nvfp4_triton

    def broken(*_args):
        raise RuntimeError("PTX assembly failed")
    monkeypatch.setattr(nvfp4_triton, "_launch", broken)
    assert nvfp4_triton._probe(torch.device("cpu")) is False
    assert "decode with torch ops" in caplog.text
    monkeypatch.setattr(nvfp4_triton, "_launch", lambda p, b, t, d: quant.dequantize_nvfp4(p, b, t, d) + 1)
    assert nvfp4_triton._probe(torch.device("cpu")) is False
    monkeypatch.setattr(nvfp4_triton, "_launch", lambda p, b, t, d: quant.dequantize_nvfp4(p, b, t, d))
    assert nvfp4_triton._probe(torch.device("cpu")) is True
