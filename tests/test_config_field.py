"""The one reader of `__metadata__["config"]` every component's config parsing uses (nodes/ltx/files/config.py)."""
from __future__ import annotations

from typing import Mapping

import pytest

from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.config import config_field

METADATA = {"config": {"vae": {"patch_size": 4, "causal": True, "decoder": {"depths": [1, 2]}, "name": "x"}},
            "model_version": "2.5"}


def refusal(*args, **kwargs) -> LTX25Error:
    with pytest.raises(LTX25Error) as info:
        config_field("file.safetensors", *args, **kwargs)
    return info.value


def test_values_and_defaults_are_read_by_dotted_path():
    """A nested value by its path under config, the default when the key (or a section above it) is absent, the
    whole config block for the empty path."""
    assert config_field("f", METADATA, "vae.decoder.depths", kind=list) == [1, 2]
    assert config_field("f", METADATA, "vae.patch_size", 8, kind=int) == 4
    assert config_field("f", METADATA, "vae.stride", 2) == 2
    assert config_field("f", METADATA, "vae.name.inner", None) is None  # under a value that is not a section
    assert config_field("f", METADATA, "", kind=Mapping) is METADATA["config"]


def test_refusals_name_the_file_and_the_key():
    """Absent without a default, the wrong type (a bool is no number), a value the pack cannot run, and an absent
    key whose default it cannot run: each names the file and config.<path>."""
    absent = refusal(METADATA, "vae.decoder.kernels")
    assert (absent.where, absent.what, absent.found) == ("file.safetensors", "config.vae.decoder.kernels", "absent")
    assert refusal(METADATA, "vae.causal", kind=int).what == "config.vae.causal"
    assert "expected 8" in str(refusal(METADATA, "vae.patch_size", allowed=(8,)))
    default = refusal(METADATA, "vae.timestep_conditioning", True, allowed=(False,))
    assert default.what == "config.vae.timestep_conditioning" and "default True" in str(default.found)
    assert refusal({}, "vae").what == "config.vae"
