"""A Linear whose weight stays quantized on the device (NVFP4, FP8, int8/int8-convrot), and the 'as stored' load
that swaps it into a model in place of the file's quantized nn.Linear children.

Forward, per format (each equals `F.linear(x, dequantized weight)` up to the compute dtype's rounding; the exact
dequantization is `files.quant`'s):
- NVFP4: the weight is dequantized just in time into the activation dtype, then a plain GEMM (Hopper has no FP4
  tensor cores); on CUDA by a one-pass Triton decode (nvfp4_triton.py) equal bit for bit to the dequantizing load's.
- FP8: on CUDA capability ≥ 8.9 with bf16 activations, `torch._scaled_mm`: activations scaled to E4M3 per row (per
  tensor before sm_90) from their own amax — the file's static `input_scale` is not used; elsewhere, or for a layer
  recorded `full_precision_matrix_mult`, the weight is dequantized just in time (bit-identical to the loaded file).
- int8: the weight × its row scales in the activation dtype, GEMM; with convrot, the activations are rotated instead
  of the weight (x·Wᵀ = (x·H)·(q·s)ᵀ, H its own inverse), ComfyUI's own arrangement and cheaper than rotating W.

`fp8_compute_` makes FP8 layers of a float model's Linears (the transformer loader's opt-in 'fp8 compute'): the
same FP8 forward, with weights quantized at load, one scale per output row.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn

from ..errors import LTX25Error
from ..files import quant
from ..files.keymap import KeyMap, load_strict
from ..files.quant import FP8, INT8, NVFP4, LayerFormat, QuantLayer
from . import nvfp4_triton

AS_STORED_FLOAT_DTYPE = torch.bfloat16  # 'as stored': every tensor that is not a quantized weight's


class QuantizedLinear(nn.Module):
    """`y = x·Wᵀ + b` with W kept as the file stores it.

    State, in the file's names, dtypes and layouts (so `state_dict()` round-trips and its bytes are the packed bytes):
    `weight` (packed U8 / FP8 / I8; a Parameter without grad, so loaders that move modules by their parameters move
    it), buffers `weight_scale` and (NVFP4) `weight_scale_2`, and `bias` in the compute dtype. A dtype cast of the
    module (`.to(torch.float16)`, `.half()`) casts the bias only: the stored format never changes."""

    def __init__(self, fmt: LayerFormat, in_features: int, out_features: int, weight: torch.Tensor,
                 weight_scale: torch.Tensor, weight_scale_2: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.format, self.in_features, self.out_features = fmt, in_features, out_features
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer("weight_scale", weight_scale)
        if fmt.kind == NVFP4:
            self.register_buffer("weight_scale_2", weight_scale_2)
        self.register_parameter("bias", None if bias is None else nn.Parameter(bias, requires_grad=False))

    def extra_repr(self) -> str:
        group = f", convrot {self.format.convrot_groupsize}" if self.format.convrot_groupsize else ""
        return f"{self.format.kind}{group}, in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"

    def dequantized_weight(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The float weight `[out, in]`, exactly as the dequantizing load computes it."""
        if self.format.kind == NVFP4:  # the one-pass decode on CUDA: the same values, a tenth of the traffic
            return nvfp4_triton.dequantize(self.weight, self.weight_scale, self.weight_scale_2, dtype)
        tensors = {f"w.{name}": t for name, t in self._stored().items()}
        return quant.dequantize_layer(QuantLayer("w", self.format), tensors, dtype)

    def _stored(self) -> dict[str, torch.Tensor]:
        stored = {"weight": self.weight, "weight_scale": self.weight_scale}
        if self.format.kind == NVFP4:
            stored["weight_scale_2"] = self.weight_scale_2
        return stored

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        kind = self.format.kind
        if kind == FP8 and not self.format.full_precision_mm:
            mode = fp8_gemm_mode(x.device, x.dtype, self.weight, self.weight_scale)
            if mode is not None:
                return fp8_linear(x, self.weight, self.weight_scale, bias, rowwise=mode == "rowwise")
        if kind == INT8:
            group = self.format.convrot_groupsize
            weight = torch.mul(self.weight, quant._per_row(self.weight_scale)).to(x.dtype)
            return nn.functional.linear(quant.rotate_groups(x, group) if group else x, weight, bias)
        return nn.functional.linear(x, self.dequantized_weight(x.dtype), bias)

    def _apply(self, fn: Callable, recurse: bool = True) -> "QuantizedLinear":
        before = {name: t.detach() for name, t in self._stored().items()}
        super()._apply(fn, recurse)
        for name, original in before.items():
            now = getattr(self, name)
            if now.dtype != original.dtype:  # a cast of the model's dtype: keep the format, take the new device
                moved = original.to(now.device)
                if name in self._parameters:
                    self._parameters[name] = nn.Parameter(moved, requires_grad=False)
                else:
                    self._buffers[name] = moved
        return self


# ---------------------------------------------------------------------------------------------------- FP8 GEMM
def fp8_gemm_mode(device: torch.device, activation_dtype: torch.dtype, weight: torch.Tensor,
                  weight_scale: torch.Tensor) -> str | None:
    """'rowwise' (sm_90+), 'tensorwise' (sm_89, per-tensor weight scale) or None (weight-only dequantize): FP8
    tensor cores need a CUDA GPU of capability ≥ 8.9, bf16 activations, an E4M3 weight and K, N multiples of 16."""
    if device.type != "cuda" or activation_dtype != torch.bfloat16 or weight.dtype != torch.float8_e4m3fn:
        return None
    if weight.shape[0] % 16 or weight.shape[1] % 16:
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability >= (9, 0):
        return "rowwise"
    return "tensorwise" if capability >= (8, 9) and weight_scale.numel() == 1 else None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
               rowwise: bool = True) -> torch.Tensor:
    """x `[..., K]` → `[..., N]` in x's dtype through `torch._scaled_mm`: x scaled into E4M3 by its amax (per row,
    or one for the whole tensor), the weight with its own scale(s)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    amax = x2.abs().amax(dim=-1, keepdim=True) if rowwise else x2.abs().amax().reshape(1, 1)
    x_scale = (amax.float() / quant.E4M3_MAX).clamp_(min=torch.finfo(torch.float32).tiny)
    xq = (x2 / x_scale).to(torch.float8_e4m3fn)  # in float32 (type promotion); amax / scale rounds to ≤ 448
    if rowwise:
        w_scale = weight_scale.float().reshape(1, -1).expand(1, weight.shape[0]).contiguous()
    else:
        x_scale, w_scale = x_scale.reshape(()), weight_scale.float().reshape(())
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=x.dtype)
    return y.reshape(*shape[:-1], weight.shape[0])


# ---------------------------------------------------------------------------------------------------- FP8 compute
def fp8_compute_(root: nn.Module) -> int:
    """The opt-in FP8 compute mode of a float model: every `nn.Linear` under `root` whose in and out features are
    multiples of 16 (what the FP8 GEMM takes) becomes an FP8 `QuantizedLinear`, its weight quantized in place on its
    own device to E4M3 with one scale per output row (`quant.quantize_fp8_rows`); the bias stays as it was. Its
    forward on a GPU of capability ≥ 9.0 with bf16 activations is `fp8_linear` (activations scaled per row from
    their own amax, `torch._scaled_mm`); elsewhere the weight is dequantized for a plain GEMM. Attention itself
    (softmax(q·kᵀ)·v) is no Linear and stays in the activation dtype. Halves the Linears' memory. → the number of
    layers replaced."""
    names = [name for name, m in root.named_modules() if name and type(m) is nn.Linear
             and m.in_features % 16 == 0 and m.out_features % 16 == 0]
    for name in names:  # by name, holding one layer at a time: each float weight is freed once replaced
        linear = root.get_submodule(name)
        stored = quant.quantize_fp8_rows(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        layer = QuantizedLinear(LayerFormat(FP8), linear.in_features, linear.out_features, stored["weight"],
                                stored["weight_scale"], None, bias).eval()
        parent, _, child = name.rpartition(".")
        del linear
        setattr(root.get_submodule(parent) if parent else root, child, layer)
    return len(names)


# ---------------------------------------------------------------------------------------------------- loading
def _placeholder(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


def quantized_like(where: str, layer: QuantLayer, linear: nn.Linear,
                   state: Mapping[str, torch.Tensor]) -> QuantizedLinear:
    """A meta QuantizedLinear in place of `linear`, shaped like the file's tensors; a weight that does not fit the
    Linear raises LTX25Error naming the file and key."""
    weight = state[layer.weight_key]
    cols = weight.shape[1] * (2 if layer.format.kind == NVFP4 else 1)
    if (weight.shape[0], cols) != (linear.out_features, linear.in_features):
        raise LTX25Error(where, f"tensor {layer.weight_key}", f"{tuple(weight.shape)} ({layer.format.kind})",
                         f"a [{linear.out_features}, {linear.in_features}] weight "
                         f"({'[out, in/2] packed' if layer.format.kind == NVFP4 else '[out, in]'})",
                         "The file's config and its tensors disagree.")
    extra = [state[layer.name + ".weight_scale_2"]] if layer.format.kind == NVFP4 else []
    bias = None if linear.bias is None else _placeholder(linear.bias)
    return QuantizedLinear(layer.format, linear.in_features, linear.out_features, _placeholder(weight),
                           _placeholder(state[layer.name + ".weight_scale"]), *map(_placeholder, extra), bias=bias)


def _module_key(where: str, key_map: KeyMap, layer: QuantLayer) -> str | None:
    """The module name of a layer's weight (None when the key map drops it)."""
    mapped, dropped = key_map.apply({layer.weight_key: torch.empty(0)})
    if dropped:
        return None
    if len(mapped) != 1:
        raise LTX25Error(where, f"tensor {layer.weight_key}", f"quantized and split by {key_map.name}",
                         "a quantized weight that maps to one module", "Fused quantized tensors are not supported.")
    return next(iter(mapped))[: -len(".weight")]


def load_keeping_quantized(where: str, build: Callable[[], nn.Module], native: Mapping[str, torch.Tensor],
                           metadata: Mapping, key_map: KeyMap,
                           init_buffers: Callable[[nn.Module], None] | None = None,
                           keep_float: tuple[str, ...] = ()) -> nn.Module:
    """'As stored': `load_strict`, with the file's quantized Linears kept quantized (QuantizedLinear) and every
    other tensor in bf16. Quantized weights of other modules (an embedding table) or of the modules named in
    `keep_float` (their weight is read by callers for the compute dtype) are dequantized here.

    1. plan the quantized layers (records, dtypes, scale shapes checked);
    2. build the model on meta and swap each planned nn.Linear for a meta QuantizedLinear of the file's shapes;
    3. set aside each kept layer's format record and static input scale, cast the float tensors;
    4. `load_strict` on the prebuilt model: every module tensor filled, every file key used or dropped."""
    layers = quant.plan(where, native, metadata)
    state = dict(native)
    with torch.device("meta"):
        model = build()
    kept: set[str] = set()
    for layer in layers.values():
        module_key = _module_key(where, key_map, layer)
        if module_key is None:
            continue  # dropped with the rest of its module
        try:
            target = model.get_submodule(module_key)
        except AttributeError as e:
            raise LTX25Error(where, f"tensor {layer.weight_key}", f"for a module {module_key} the model lacks",
                             "a quantized weight of an existing layer", "The file is from another model.") from e
        if isinstance(target, nn.Linear) and module_key not in keep_float:
            parent, _, child = module_key.rpartition(".")
            setattr(model.get_submodule(parent), child, quantized_like(where, layer, target, state))
            kept.update(layer.stored_keys())
            for key in layer.consumed_keys(state):
                del state[key]
        else:
            weight = quant.dequantize_layer(layer, state, AS_STORED_FLOAT_DTYPE)
            for key in (*layer.stored_keys(), *layer.consumed_keys(state)):
                del state[key]
            state[layer.weight_key] = weight
    state = {k: v.to(AS_STORED_FLOAT_DTYPE) if v.is_floating_point() and k not in kept else v
             for k, v in state.items()}
    return load_strict(where, lambda: model, state, key_map, None, init_buffers)


# ---------------------------------------------------------------------------------------------------- benchmarks
def random_quantized_linear(kind: str, in_features: int, out_features: int, bias: bool = False,
                            device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                            convrot_groupsize: int = 256, seed: int = 0) -> QuantizedLinear:
    """A real-shape QuantizedLinear ('nvfp4', 'fp8', 'int8' or 'int8-convrot') from random weights (N(0, 1/in),
    quantized on `device`) with a `dtype` bias: for timing the formats against a bf16 nn.Linear."""
    g = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g, device=device) * in_features ** -0.5
    fmt = LayerFormat(INT8 if kind.startswith(INT8) else kind, convrot_groupsize if kind == "int8-convrot" else 0)
    if fmt.kind not in (NVFP4, FP8, INT8):
        raise LTX25Error("random_quantized_linear", "kind", repr(kind), "nvfp4, fp8, int8 or int8-convrot")
    stored = quant.quantize(fmt, weight)
    b = torch.randn(out_features, generator=g, device=device).to(dtype) * 0.1 if bias else None
    return QuantizedLinear(fmt, in_features, out_features, stored["weight"], stored["weight_scale"],
                           stored.get("weight_scale_2"), b).eval()
