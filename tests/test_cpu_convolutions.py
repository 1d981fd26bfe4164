"""On the CPU the VAEs' half-precision convolutions compute in float32 (nodes/ltx/cpu_convolutions.py): PyTorch's
bfloat16 convolutions there run a reference kernel on CPUs without native bfloat16, hundreds of times slower, as
ComfyUI core notes when it keeps its VAEs in float32 on the CPU. Each convolution's output is the float32 result
rounded to the input's dtype; the weights stay as loaded; every entry point of a convolutional model runs under
it (the diffusion decoder has no convolutions)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from nodes.ltx.cpu_convolutions import float32_convolutions

CASES = [(F.conv1d, (2, 4, 9), (6, 4, 3)), (F.conv2d, (2, 4, 7, 5), (6, 4, 3, 3)),
         (F.conv3d, (1, 4, 3, 6, 5), (6, 4, 3, 3, 3)), (F.conv_transpose2d, (2, 4, 5, 5), (4, 6, 2, 2)),
         (F.conv_transpose3d, (1, 4, 2, 3, 3), (4, 6, 2, 2, 2))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("conv, x_shape, w_shape", CASES)
def test_a_half_precision_convolution_is_the_float32_one_rounded(conv, x_shape, w_shape, dtype):
    """Each kind of convolution, bf16 and fp16: the float32 result rounded once to the input's dtype, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(x_shape, generator=g).to(dtype), torch.randn(w_shape, generator=g).to(dtype)
    bias = torch.randn(w_shape[1] if "transpose" in conv.__name__ else w_shape[0], generator=g).to(dtype)
    with float32_convolutions(torch.device("cpu")):
        out = conv(x, w, bias, padding=1) if "transpose" not in conv.__name__ else conv(x, w, bias)
    expected = (conv(x.float(), w.float(), bias.float(), padding=1) if "transpose" not in conv.__name__
                else conv(x.float(), w.float(), bias.float())).to(dtype)
    assert out.dtype == dtype and torch.equal(out, expected)
    assert w.dtype == dtype and x.dtype == dtype, "the operands are left as they were"


def test_float32_inputs_are_left_alone():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with float32_convolutions(torch.device("cpu")):
        assert torch.equal(F.conv2d(x, w), torch.conv2d(x, w)), "float32 inputs: the plain call"


class _ConvDtypes(TorchFunctionMode):
    """Records the input dtype of every convolution that reaches torch (entered outside the pack's mode, it sees
    the calls that mode makes)."""

    def __init__(self):
        super().__init__()
        self.seen: list[torch.dtype] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                    torch.conv_transpose3d, torch.convolution):  # the last: a model calling it directly would slip
            self.seen.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def _encode_video(tiny_file):
    from nodes.ltx.encode.video_encoder import encode_video, load_video_encoder
    encoder = load_video_encoder(tiny_file("conv_vae"), torch.bfloat16)
    return lambda: encode_video(encoder, torch.rand(1, 9, 64, 64, 3, generator=torch.Generator().manual_seed(1))), \
        encoder


def _decode_conv(tiny_file):
    from nodes.ltx.decode.conv_vae import decode_conv, load_conv_vae
    vae = load_conv_vae(tiny_file("conv_vae"), torch.bfloat16)
    return lambda: decode_conv(vae, torch.randn(1, 128, 2, 2, 2)), vae


def _audio(tiny_file):
    from nodes.ltx.audio_vae import decode_audio, load_audio_vae
    vae = load_audio_vae(tiny_file("audio_vae"), torch.bfloat16)
    return lambda: decode_audio(vae, torch.randn(1, 8, 4, 16)), vae


def _encode_audio(tiny_file):
    from nodes.ltx.encode.audio_encoder import encode_audio, load_audio_encoder
    encoder = load_audio_encoder(tiny_file("audio_vae"), torch.bfloat16)
    return lambda: encode_audio(encoder, torch.randn(1, 2, 16000, generator=torch.Generator().manual_seed(2)),
                                16000), encoder


def _upsample(tiny_file):
    from nodes.ltx.upsampler import load_upsampler, upsample_latent
    upsampler = load_upsampler(tiny_file("upsampler"), torch.bfloat16)
    return lambda: upsample_latent(upsampler, torch.randn(1, 128, 2, 2, 2), torch.zeros(128), torch.ones(128)), \
        upsampler


@pytest.mark.parametrize("make", [_encode_video, _decode_conv, _audio, _encode_audio, _upsample],
                         ids=lambda make: make.__name__.strip("_"))
def test_every_vae_entry_point_convolves_in_float32_on_the_cpu(tiny_file, make):
    """A bfloat16 model on the CPU: every convolution reaching torch gets float32 inputs, the weights stay bf16."""
    run, model = make(tiny_file)
    with _ConvDtypes() as recorder:
        run()
    assert recorder.seen, "the model convolves"
    assert set(recorder.seen) == {torch.float32}, f"half-precision convolutions reached torch: {set(recorder.seen)}"
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} <= {torch.bfloat16, torch.float32}
    assert any(p.dtype == torch.bfloat16 for p in model.parameters()), "the weights stay as loaded"
