"""The five loader nodes on the tiny set: each official file loads through its node (strict coverage inside), the
video-VAE loader reports the kind, and a file in the wrong slot names what it is and what the slot wants."""
from __future__ import annotations

import pytest

from nodes.comfy import bridge as comfy_bridge
from nodes.comfy.loaders import (LTX25AudioVAELoader, LTX25TextEncoderLoader, LTX25TransformerLoader, LTX25UpsamplerLoader,
                           LTX25VideoVAELoader)
from nodes.ltx.errors import LTX25Error
from nodes.ltx.release import OFFICIAL_FILES

NAME = {component: name for component, (_folder, name) in OFFICIAL_FILES.items()}


def test_every_tiny_file_loads_through_its_loader_node(tiny_models):
    transformer = LTX25TransformerLoader().load(NAME["transformer"], "fp32")[0]
    assert transformer.info.kind.value == "transformer" and transformer.module.model_version == "2.5.0"
    spec = LTX25TextEncoderLoader().load(NAME["text_encoder"], "fp32")[0]
    assert spec.info.gemma_version == transformer.info.gemma_version
    conv, conv_kind = LTX25VideoVAELoader().load(NAME["conv_vae"], "fp32")
    diffusion, diffusion_kind = LTX25VideoVAELoader().load(NAME["diffusion_vae"], "fp32")
    assert (conv_kind, diffusion_kind) == ("conv", "diffusion")
    assert conv.module.latents_mean.equal(diffusion.module.latents_mean), "both VAEs share one latent space"
    assert LTX25AudioVAELoader().load(NAME["audio_vae"], "fp32")[0].info.kind.value == "audio VAE"
    assert LTX25UpsamplerLoader().load(NAME["upsampler"], "fp32")[0].info.kind.value == "latent upsampler"


def test_loader_widgets_list_the_official_names_of_their_own_kind(tiny_models):
    """The shared vae/ folder is listed by kind: both video VAEs in the video loader, the audio VAE in the audio
    loader only. Fails when a loader offers a file its kind check would refuse."""
    listed = LTX25VideoVAELoader.INPUT_TYPES()["required"]["vae_file"][0]
    assert {NAME["conv_vae"], NAME["diffusion_vae"]} <= set(listed) and NAME["audio_vae"] not in listed
    assert LTX25AudioVAELoader.INPUT_TYPES()["required"]["audio_vae_file"][0] == [NAME["audio_vae"]]


@pytest.mark.parametrize("loader, folder, component, expected", [
    (LTX25UpsamplerLoader, "latent_upscale_models", "conv_vae", "conv video VAE"),
    (LTX25AudioVAELoader, "vae", "conv_vae", "conv video VAE"),
    (LTX25VideoVAELoader, "vae", "audio_vae", "is an audio VAE, expected a diffusion video VAE or a conv video VAE"),
])
def test_a_file_in_the_wrong_slot_is_refused_by_the_node(tiny_models, tmp_path, loader, folder, component, expected):
    import os
    import shutil
    models = tmp_path / "models"
    os.makedirs(models / folder)
    shutil.copy(os.path.join(tiny_models, OFFICIAL_FILES[component][0], NAME[component]), models / folder / "x.safetensors")
    comfy_bridge.set_models_dir(str(models))
    try:
        with pytest.raises(LTX25Error, match=expected):
            getattr(loader(), loader.FUNCTION)("x.safetensors", "fp32")
    finally:
        comfy_bridge.set_models_dir(tiny_models)


def test_a_missing_file_names_the_folder(tiny_models):
    with pytest.raises(LTX25Error, match="latent_upscale_models"):
        LTX25UpsamplerLoader().load("nope.safetensors", "bf16")
