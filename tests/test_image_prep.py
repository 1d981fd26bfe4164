"""Preparing conditioning images (docs/MODEL.md §17.4): the reference's cover-and-centre-crop resize, its CRF rule
per model version, and the H.264 pre-compression (torch-free, in nodes/media)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nodes.ltx.encode.image_prep import image_crf, resize_crop
from nodes.ltx.errors import LTX25Error
from nodes.media.crf import compress_frame, precompress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------------- resize and crop
def test_resize_covers_the_target_then_crops_the_centre():
    """A 100×50 image to 64×64: scaled ×1.28 so the image covers the target (128×64), then the middle 64 columns
    kept (32 cut on each side). On a linear ramp bilinear interpolation is exact, so every output pixel must hold
    the source coordinate it samples: x ↦ (x + 32 + ½)·100/128 − ½ across, y ↦ (y + ½)·50/64 − ½ down. Fitting
    inside instead, cropping from a corner or another scale moves these by whole pixels."""
    ys, xs = torch.meshgrid(torch.arange(50.0), torch.arange(100.0), indexing="ij")
    image = torch.stack([xs, ys, xs + ys], dim=-1)[None]                        # [1, 50, 100, 3]
    out = resize_crop(image, 64, 64)
    assert out.shape == (1, 64, 64, 3) and out.dtype == torch.float32
    expected_x = (torch.arange(64.0) + 32 + 0.5) * 100 / 128 - 0.5
    expected_y = (torch.arange(64.0) + 0.5) * 50 / 64 - 0.5
    assert torch.allclose(out[0, :, :, 0], expected_x.expand(64, 64), atol=1e-4)
    assert torch.allclose(out[0, 1:-1, :, 1], expected_y[1:-1, None].expand(62, 64), atol=1e-4)


def test_resize_keeps_the_references_sizes_and_leading_axes():
    """103 px to 512: 103·(512/103) is 511.99999999999994 in floating point, so the scaled side is rounded UP (the
    reference's ceil) and the crop still has its 512 rows; frame and batch axes are kept; the same size comes back
    unchanged."""
    assert resize_crop(torch.rand(2, 3, 103, 103, 3), 512, 512).shape == (2, 3, 512, 512, 3)
    same = torch.rand(5, 64, 96, 3)
    assert torch.equal(resize_crop(same, 96, 64), same)


@pytest.mark.parametrize("width, height, field", [(100, 64, "width"), (64, 0, "height"), (64.5, 64, "width")])
def test_resize_refuses_sizes_off_the_latent_grid(width, height, field):
    """Targets must be positive multiples of 32 (one latent cell), named by field."""
    with pytest.raises(LTX25Error, match=f"resize_crop.{field}"):
        resize_crop(torch.rand(1, 64, 64, 3), width, height)


# ------------------------------------------------------------------------------------------------- CRF rule
@pytest.mark.parametrize("version, crf", [("2.5.0", 18), ("2.5.0-rc1", 18), ("2.4.0", 18), ("2.3.0", 33),
                                          ("2.0.0", 33), (None, 33)])
def test_the_crf_comes_from_the_model_version(version, crf):
    """The reference's rule: 18 from 2.4 on — every LTX-2.5 file — and 33 for older or unversioned checkpoints."""
    assert image_crf(version) == crf


# ------------------------------------------------------------------------------------------------- compression
def _photo(height: int = 64, width: int = 96) -> np.ndarray:
    """Smooth gradients with grain: something H.264 keeps most of and still changes."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    grain = np.random.default_rng(0).normal(0, 12, base.shape)
    return np.clip(base + grain, 0, 255).astype(np.uint8)


def test_compression_changes_the_image_more_at_a_higher_crf():
    """A round trip through H.264 changes the pixels (it is not a no-op), by more at CRF 33 than at 18, while
    staying the same picture; CRF 0 returns the image untouched."""
    image = _photo()
    errors = {}
    for crf in (18, 33):
        out = compress_frame(image, crf)
        assert out.shape == image.shape and out.dtype == np.uint8
        errors[crf] = float(np.abs(out.astype(float) - image).mean())
    assert 0.5 < errors[18] < errors[33] < 20, errors
    assert compress_frame(image, 0) is image


def test_odd_sizes_lose_their_last_row_and_column():
    """4:2:0 needs even sizes: a 63×95 image comes back 62×94 (cut, not scaled), as the reference does."""
    image = _photo(63, 95)
    out = compress_frame(image, 18)
    assert out.shape == (62, 94, 3)
    assert float(np.abs(out.astype(float) - image[:62, :94]).mean()) < 12


def test_precompress_takes_comfyui_image_values():
    """IMAGE values in [0, 1] are rounded to 8 bits and compressed frame by frame; CRF 0 passes them through."""
    frames = np.stack([_photo(), _photo()[::-1]]).astype(np.float32) / 255.0
    out = precompress(frames, 18)
    assert out.shape == frames.shape and out.dtype == np.float32 and 0 <= out.min() and out.max() <= 1
    expected = compress_frame(np.round(frames[1] * 255).astype(np.uint8), 18).astype(np.float32) / 255
    assert np.array_equal(out[1], expected)
    assert np.array_equal(precompress(frames, 0), frames)


@pytest.mark.parametrize("crf", [-1, 52, True, 18.5])
def test_precompress_refuses_crfs_libx264_does_not_take(crf):
    with pytest.raises(LTX25Error, match="precompress.crf"):
        precompress(np.zeros((1, 8, 8, 3), np.float32), crf)


def test_the_compression_module_does_not_import_torch():
    """nodes/media stays importable without torch, like mp4.py."""
    code = "import sys, nodes.media.crf; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", out
