"""The audio decode node: LTX-2.5 audio latent → stereo 48 kHz waveform."""
from __future__ import annotations

from . import bridge

NODE = "LTX25AudioDecode"


class LTX25AudioDecode:
    DESCRIPTION = "Decodes an LTX-2.5 audio latent to a 48 kHz stereo waveform (audio VAE + vocoder with BWE)."
    CATEGORY = "LTX-2.5/decode"
    RETURN_TYPES = ("AUDIO",)
    OUTPUT_TOOLTIPS = ("Waveform [B, 2, S] at 48 kHz; S = 480·(4T−3) for T latent frames.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "audio_vae": ("LTX25_AUDIO_VAE", {"tooltip": "The audio VAE + vocoder (ltx-2.5-audio-vae-bf16)."}),
            "audio_latent": ("LATENT", {"tooltip": "Audio latent [B, 8, T, 16] from the sampler."})}}

    async def decode(self, audio_vae, audio_latent):
        """A coroutine that never awaits: it runs to its end at once, on the graph's thread, as a plain node would.
        Being async wins it ComfyUI's pick among ready nodes (`ux_friendly_pick_node` runs a ready async node
        before any other), so the audio is decoded right after the sampler, before the video decoders: every save
        takes this waveform, so no save waits for it (one may still wait for another output node ComfyUI picks
        first, such as the A/B compare). Otherwise the order of the ready decoders follows ComfyUI's set of output
        nodes, which the hash seed orders; when the audio came last, all the saves waited for the compare. Tests:
        test_graph's and test_comfyui_inprocess's audio-before-video tests."""
        from ..ltx.audio_vae import check_audio_latent, decode_audio, working_memory
        from ..ltx.latents import AUDIO_STREAM, unbind_av
        latent = audio_latent if isinstance(audio_latent, dict) else {"samples": audio_latent}
        # core ComfyUI's joint audio+video latent gives its audio stream, as core's own audio decode takes it
        samples = unbind_av(latent.get("samples"), AUDIO_STREAM, f"{NODE}.audio_latent")
        samples = check_audio_latent(samples, f"{NODE}.audio_latent")
        vae = audio_vae.ready(working_memory(audio_vae.module, tuple(samples.shape)))
        # The LATENT carries the clip's frame rate; with it the decode checks that the audio spans the video.
        audio = decode_audio(vae, samples, fps=latent.get("frame_rate"), where=NODE, check=bridge.check_interrupt)
        audio["waveform"] = audio["waveform"].to(bridge.intermediate_device())
        return (audio,)


NODE_CLASS_MAPPINGS = {NODE: LTX25AudioDecode}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Audio Decode"}
