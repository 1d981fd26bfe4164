"""Asset inspection: header parsing, component detection (metadata first, key probes second), version checks and
the bad-input errors of the foundation issue. Synthetic files keep these tests independent of the model writers."""
from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from nodes.ltx.files import assets
from nodes.ltx.files.assets import Kind
from nodes.ltx.errors import LTX25Error


FILES = {
    Kind.TRANSFORMER: ({"model.diffusion_model.patchify_proj.weight": torch.zeros(2, 2)},
                       {"config": {"transformer": {"num_layers": 2}}, "model_version": "2.5.0",
                        "gemma_source_checkpoint": {"gemma_version": "gemma4-12b-ltx-v1"}}),
    Kind.TEXT_ENCODER: ({"tokenizer_json": torch.zeros(4, dtype=torch.uint8), "model.embed_tokens.weight": torch.zeros(2, 2)},
                        {"gemma_config": {"model_type": "gemma4_unified", "gemma_version": "gemma4-12b-ltx-v1"}}),
    Kind.DIFFUSION_VAE: ({"decoder.conv_in_x_t.weight": torch.zeros(2, 2)},
                         {"config": {"vae": {"_class_name": "CausalDiffusionVAE"}}}),
    Kind.CONV_VAE: ({"decoder.conv_in.conv.weight": torch.zeros(2, 2)},
                    {"config": {"vae": {"_class_name": "CausalVideoAutoencoder"}}}),
    Kind.AUDIO_VAE: ({"audio_vae.decoder.conv_in.conv.weight": torch.zeros(2, 2)}, {"config": {"audio_vae": {}, "vocoder": {}}}),
    Kind.UPSAMPLER: ({"initial_conv.weight": torch.zeros(2, 2)}, {"config": {"_class_name": "LatentUpsampler"}}),
}


def write(path, tensors, metadata=None) -> str:
    save_file(tensors, str(path), metadata={k: json.dumps(v) if not isinstance(v, str) else v
                                            for k, v in (metadata or {}).items()} or None)
    return str(path)


@pytest.mark.parametrize("kind", list(Kind))
def test_each_kind_is_identified_by_metadata_and_by_keys_alone(tmp_path, kind):
    """Detection must work from metadata and, for repacks that strip it, from key probes alone."""
    tensors, metadata = FILES[kind]
    assert assets.inspect_asset(write(tmp_path / "with_meta.safetensors", tensors, metadata)).kind is kind
    assert assets.identify(assets.read_header(write(tmp_path / "bare.safetensors", tensors))) is kind


def test_wrong_component_in_a_slot_names_what_it_is_and_what_the_slot_wants(tmp_path):
    """The conv VAE given to the upsampler loader must say 'conv video VAE' and 'latent upsampler'."""
    path = write(tmp_path / "ltx-2.5-video-vae-conv-bf16.safetensors", *FILES[Kind.CONV_VAE])
    with pytest.raises(LTX25Error) as e:
        assets.expect_kind(path, Kind.UPSAMPLER)
    assert "conv video VAE" in str(e.value) and "latent upsampler" in str(e.value) and path in str(e.value)


def test_a_slot_of_several_kinds_names_them_all_with_their_articles(tmp_path):
    """The video-VAE slot takes both video VAEs: an audio VAE there is "an audio VAE", and the slot wants "a
    diffusion video VAE or a conv video VAE" (not only the conv one)."""
    path = write(tmp_path / "audio.safetensors", *FILES[Kind.AUDIO_VAE])
    with pytest.raises(LTX25Error, match="this file is an audio VAE, expected a diffusion video VAE or a conv "
                                         "video VAE for this slot"):
        assets.expect_kind(path, (Kind.DIFFUSION_VAE, Kind.CONV_VAE))
    assert assets.expect_kind(path, (Kind.AUDIO_VAE, Kind.UPSAMPLER)).kind is Kind.AUDIO_VAE


@pytest.mark.parametrize("zip_format", [True, False], ids=["torch.save zip", "legacy pickle"])
def test_a_pickle_checkpoint_is_refused_saying_only_safetensors_are_read(tmp_path, zip_format):
    """A .ckpt/.pt renamed to .safetensors is refused before anything unpickles it, and the message says why:
    the pack reads safetensors files only. A real safetensors file whose header length starts with the pickle
    opcode byte (0x80) is still read."""
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(3)}, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(LTX25Error, match="pickle") as error:
        assets.read_header(path)
    assert "safetensors files only" in str(error.value), error.value
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (0x280 - len(header))  # length 640: the first byte is 0x80
    (tmp_path / "real.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    assert assets.read_header(tmp_path / "real.safetensors").tensors["w"].shape == (1,)


def test_truncated_file_is_refused_with_its_path(tmp_path):
    """A download cut short leaves tensors pointing past the end of the file."""
    path = write(tmp_path / "cut.safetensors", {"initial_conv.weight": torch.zeros(64, 64)})
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(LTX25Error, match="truncated"):
        assets.read_header(path)


def test_corrupt_header_is_refused(tmp_path):
    """A header length that points past the file, and a non-JSON header, both give LTX25Error."""
    bad_len = tmp_path / "bad_len.safetensors"
    bad_len.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(LTX25Error, match="header length"):
        assets.read_header(bad_len)
    bad_json = tmp_path / "bad_json.safetensors"
    bad_json.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(LTX25Error, match="header"):
        assets.read_header(bad_json)


def test_ambiguous_stripped_file_is_an_error_not_a_guess(tmp_path):
    """A stripped file whose keys match two kinds must not be guessed."""
    tensors = {**FILES[Kind.UPSAMPLER][0], **FILES[Kind.TRANSFORMER][0]}
    with pytest.raises(LTX25Error, match="ambiguous"):
        assets.identify(assets.read_header(write(tmp_path / "both.safetensors", tensors)))


def test_unrecognized_file_is_an_error(tmp_path):
    with pytest.raises(LTX25Error, match="unrecognized"):
        assets.inspect_asset(write(tmp_path / "x.safetensors", {"foo.weight": torch.zeros(2, 2)}))


def test_unsupported_model_version_is_refused(tmp_path):
    """An LTX-2.3 file in a 2.5 slot is a different model: refuse it by its model_version."""
    tensors, metadata = FILES[Kind.TRANSFORMER]
    path = write(tmp_path / "t.safetensors", tensors, {**metadata, "model_version": "2.3.0"})
    with pytest.raises(LTX25Error, match="model_version is 2.3.0"):
        assets.expect_kind(path, Kind.TRANSFORMER)


def test_gemma_version_mismatch_between_transformer_and_encoder_is_refused(tmp_path):
    """The transformer was trained on one Gemma fine-tune; another one gives wrong conditioning."""
    t = assets.inspect_asset(write(tmp_path / "t.safetensors", *FILES[Kind.TRANSFORMER]))
    te_tensors, te_meta = FILES[Kind.TEXT_ENCODER]
    good = assets.inspect_asset(write(tmp_path / "good.safetensors", te_tensors, te_meta))
    assets.check_gemma_pairing(t, good)
    other = {**te_meta, "gemma_config": {**te_meta["gemma_config"], "gemma_version": "gemma4-12b-other"}}
    bad = assets.inspect_asset(write(tmp_path / "bad.safetensors", te_tensors, other))
    with pytest.raises(LTX25Error, match="gemma4-12b-other"):
        assets.check_gemma_pairing(t, bad)


def test_metadata_values_are_json_decoded_and_versions_parse(tmp_path):
    info = assets.inspect_asset(write(tmp_path / "t.safetensors", *FILES[Kind.TRANSFORMER]))
    assert info.header.metadata["config"]["transformer"]["num_layers"] == 2
    assert info.model_version == "2.5.0" and info.gemma_version == "gemma4-12b-ltx-v1"
    assert assets.model_version_tuple("2.5.0-rc1") == (2, 5, 0) >= (2, 5)
    assert "transformer" in info.summary()


def test_quantization_is_read_from_the_header(tmp_path):
    """NVFP4 = U8 weight + E4M3 weight_scale + fp32 weight_scale_2; FP8 = F8 weight + weight_scale."""
    base = FILES[Kind.TRANSFORMER][0]
    nvfp4 = {**base, "x.weight": torch.zeros(4, 8, dtype=torch.uint8),
             "x.weight_scale": torch.zeros(128, 4).to(torch.float8_e4m3fn), "x.weight_scale_2": torch.ones(())}
    fp8 = {**base, "x.weight": torch.zeros(4, 8).to(torch.float8_e4m3fn), "x.weight_scale": torch.ones(())}
    assert assets.inspect_asset(write(tmp_path / "n.safetensors", nvfp4)).quantization == "nvfp4"
    assert assets.inspect_asset(write(tmp_path / "f.safetensors", fp8)).quantization == "fp8"
    assert assets.inspect_asset(write(tmp_path / "b.safetensors", base)).quantization is None
