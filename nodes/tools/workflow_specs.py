"""The bundled workflows, declared once as data and written in both formats:

    python -m nodes.tools.workflow_specs        # rewrites workflows/*.json (UI, v0.4) and workflows/api/*.json

A spec lists nodes as (id, class, title, {input: value or (source_id, output_index)}); inputs left out take the
node's declared default; "notes" puts a Note above a node; "phases" ({node id: group title}) overrides where
canvas_layout puts a node. The UI file is named after the template's title (TITLES): ComfyUI 0.33's template browser
shows a custom node pack's template by its file name, and `<title>.jpg` beside it as its thumbnail
(`tests/render_thumbnails.py` renders them from the canvas). The API twin keeps the short name.
`tests/test_workflows.py` checks that converting each UI file back gives its API twin.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ..ltx.release import OFFICIAL_FILES
from ..registry import NODE_CLASS_MAPPINGS
from .core_standins import CLASSES as CORE_STANDINS
from . import canvas_layout
from .graph import execution_order, has_control_value, input_specs, is_widget
from .tiny.lora import DEV_FILES, IC_LORA_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = {component: name for component, (_folder, name) in OFFICIAL_FILES.items()}
HF = "https://huggingface.co/Lightricks/LTX-2.5/resolve/main/"
PROMPT = ("A red fox trots through fresh snow at dawn, breath steaming, soft golden light through pine trees; "
          "the crunch of snow and distant birdsong.")
NEGATIVE_PROMPT = ("blurry, out of focus, low contrast, washed-out colors, heavy noise, flicker, jittery motion, "
                   "distorted proportions, deformed faces or hands, subtitles, watermark, muted or distorted audio, "
                   "robotic voice, audio out of sync")
DECODER_COLORS = {"conv": ("#2a4d6e", "#1d3a55"), "diffusion": ("#6e3a2a", "#55291d")}
DEV_NAMES = {component: name for component, (_folder, name) in DEV_FILES.items()}

Spec = list[tuple[int, str, str, dict[str, Any]]]


def _common(stats_vae: int, seed: int = 42) -> Spec:
    """Loaders → encode → connector → half-size stage 1 → upsample → stage 2 (shared by all three graphs).
    `stats_vae` is the video-VAE loader whose per-channel statistics the upsampler uses (both VAEs share them)."""
    return [
        (1, "LTX25TransformerLoader", "Transformer (DiT + connectors)", {"transformer_file": FILES["transformer"]}),
        (2, "LTX25TextEncoderLoader", "Gemma-4 text encoder", {"text_encoder_file": FILES["text_encoder"]}),
        (3, "LTX25EncodePrompt", "Prompt", {"text_encoder": (2, 0), "prompt": PROMPT}),
        (4, "LTX25Connector", "Embeddings connectors", {"model": (1, 0), "text_features": (3, 0)}),
        (5, "LTX25EmptyLatent", "Size (final; stage 1 runs at half)", {"width": 768, "height": 512, "frames": 121}),
        (6, "LTX25UpsamplerLoader", "Latent upsampler x2", {"upsampler_file": FILES["upsampler"]}),
        (9, "LTX25AudioVAELoader", "Audio VAE + vocoder", {"audio_vae_file": FILES["audio_vae"]}),
        (10, "LTX25DistilledSampler", "Stage 1 (8 steps, half size)",
         {"model": (1, 0), "conditioning": (4, 0), "video_latent": (5, 0), "audio_latent": (5, 1), "seed": seed,
          "stage": "1"}),
        (11, "LTX25LatentUpsample", "Upsample x2",
         {"upsampler": (6, 0), "video_vae": (stats_vae, 0), "video_latent": (10, 0)}),
        (12, "LTX25DistilledSampler", "Stage 2 (3 steps, full size)",
         {"model": (1, 0), "conditioning": (4, 0), "video_latent": (11, 0), "audio_latent": (10, 1), "seed": seed,
          "stage": "2"}),
        (15, "LTX25AudioDecode", "Audio decode", {"audio_vae": (9, 0), "audio_latent": (12, 1)}),
    ]


def _dev_two_stage(stats_vae: int, seed: int = 42) -> Spec:
    """The reference's dev two-stage pipeline: the dev transformer guided at half size (negative prompt, the 2.5
    guidance defaults, 30 Euler steps of the dev schedule), upsample, then stage 2 with the distilled LoRA on the same
    transformer; the audio is stage 1's, as the reference decodes it."""
    return [
        (1, "LTX25TransformerLoader", "Transformer (dev: the full model)",
         {"transformer_file": DEV_NAMES["dev_transformer"]}),
        (2, "LTX25TextEncoderLoader", "Gemma-4 text encoder", {"text_encoder_file": FILES["text_encoder"]}),
        (3, "LTX25EncodePrompt", "Prompt", {"text_encoder": (2, 0), "prompt": PROMPT}),
        (4, "LTX25Connector", "Embeddings connectors (prompt)", {"model": (1, 0), "text_features": (3, 0)}),
        (20, "LTX25EncodePrompt", "Negative prompt", {"text_encoder": (2, 0), "prompt": NEGATIVE_PROMPT}),
        (21, "LTX25Connector", "Embeddings connectors (negative)", {"model": (1, 0), "text_features": (20, 0)}),
        (22, "LTX25MultimodalGuider", "Guidance (the reference's 2.5 defaults)",
         {"positive": (4, 0), "negative": (21, 0)}),
        (5, "LTX25EmptyLatent", "Size (final; stage 1 runs at half)", {"width": 768, "height": 512, "frames": 121}),
        (6, "LTX25UpsamplerLoader", "Latent upsampler x2", {"upsampler_file": FILES["upsampler"]}),
        (9, "LTX25AudioVAELoader", "Audio VAE + vocoder", {"audio_vae_file": FILES["audio_vae"]}),
        (10, "LTX25GuidedSampler", "Stage 1 (dev, 30 guided steps)",
         {"model": (1, 0), "guider": (22, 0), "video_latent": (5, 0), "audio_latent": (5, 1), "seed": seed}),
        (23, "LTX25LoraLoader", "Distilled LoRA (stage 2)",
         {"model": (1, 0), "lora_file": DEV_NAMES["distilled_lora"], "strength": 1.0}),
        (11, "LTX25LatentUpsample", "Upsample x2",
         {"upsampler": (6, 0), "video_vae": (stats_vae, 0), "video_latent": (10, 0)}),
        (12, "LTX25DistilledSampler", "Stage 2 (3 steps, distilled LoRA)",
         {"model": (23, 0), "conditioning": (4, 0), "video_latent": (11, 0), "audio_latent": (10, 1), "seed": seed,
          "stage": "2"}),
        (15, "LTX25AudioDecode", "Audio decode (stage 1's audio)", {"audio_vae": (9, 0), "audio_latent": (10, 1)}),
    ]


def _conv_decode() -> Spec:
    return [(7, "LTX25VideoVAELoader", "Conv video VAE", {"vae_file": FILES["conv_vae"]}),
            (13, "LTX25ConvVAEDecode", "Conv VAE decode", {"video_vae": (7, 0), "latent": (12, 0)})]


def _diffusion_decode() -> Spec:
    return [(8, "LTX25VideoVAELoader", "Diffusion video VAE", {"vae_file": FILES["diffusion_vae"]}),
            (14, "LTX25DiffusionVAEDecode", "Diffusion VAE decode", {"video_vae": (8, 0), "latent": (12, 0)})]


def _save(node_id: int, images: tuple[int, int], prefix: str, title: str, **extra: Any) -> tuple:
    """A save at the frame rate of the stage-2 latent (fps 0), with the decoded audio."""
    return (node_id, "LTX25SaveVideo", title, {"images": images, "audio": (15, 0), "latent": (12, 0),
                                               "filename_prefix": prefix, **extra})


WORKFLOWS: dict[str, dict[str, Any]] = {
    "ltx25_t2v_distilled_decoder_ab": {
        "nodes": _common(stats_vae=7) + _conv_decode() + _diffusion_decode() + [
            (16, "LTX25DecoderCompare", "A/B: conv vs diffusion",
             {"images_a": (13, 0), "images_b": (14, 0), "stats_a": (13, 1), "stats_b": (14, 1)}),
            _save(17, (13, 0), "ltx25_ab_conv", "Save conv"),
            _save(18, (14, 0), "ltx25_ab_diffusion", "Save diffusion"),
            _save(19, (16, 0), "ltx25_ab_side_by_side", "Save side by side", metadata=(16, 1))],
        "notes": {
            1: "Put the six official LTX-2.5 files in ComfyUI's model folders (README). Pick each file here.",
            14: "Processor: auto picks the fastest measured neighborhood attention (CUDA: the pack's triton kernel; CPU: "
                "sdpa); sdpa, comfy_kitchen, natten and triton are selectable. "
                "Tiling auto plans tiles from free memory; set memory_budget_gb to cap it.",
            16: "Both decoders get the SAME stage-2 latent: this node reports PSNR/SSIM between them and each one's "
                "seconds, peak memory and tiles.",
        },
    },
    "ltx25_t2v_distilled_conv": {
        "nodes": _common(stats_vae=7) + _conv_decode() + [_save(17, (13, 0), "ltx25_conv", "Save video")],
        "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README). Pick each file here.",
                  13: "Tiling auto tiles only when the decode would not fit in free memory."},
    },
    "ltx25_t2v_distilled_diffusion_vae": {
        "nodes": _common(stats_vae=8) + _diffusion_decode() + [_save(18, (14, 0), "ltx25_diffusion_vae", "Save video")],
        "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README). Pick each file here.",
                  14: "Processor: auto picks the fastest neighborhood attention available; steps 0 = the checkpoint's "
                      "default (1)."},
    },
    "ltx25_t2v_dev_two_stage": {
        "nodes": _dev_two_stage(stats_vae=7) + _conv_decode() + _diffusion_decode() + [
            (16, "LTX25DecoderCompare", "A/B: conv vs diffusion",
             {"images_a": (13, 0), "images_b": (14, 0), "stats_a": (13, 1), "stats_b": (14, 1)}),
            _save(17, (13, 0), "ltx25_dev_conv", "Save conv"),
            _save(18, (14, 0), "ltx25_dev_diffusion", "Save diffusion"),
            _save(19, (16, 0), "ltx25_dev_side_by_side", "Save side by side", metadata=(16, 1))],
        "notes": {
            1: "The full (dev) model: ltx-2.5-22b-dev-transformer-bf16 in diffusion_models/, and "
               "ltx-2.5-22b-distilled-lora-450-bf16 in loras/ (README). The LoRA applies on the fly to the "
               "transformer as stored, quantized or not; only its 'merged' mode needs float weights.",
            22: "The reference's 2.5 defaults: video cfg 3, audio cfg 7, STG 1 on block 28, a2v/v2a 3, rescale 0.7. "
                "Each kind not at its neutral value (cfg 1, stg 0, a2v/v2a 1) adds one forward per step.",
            10: "30 Euler steps of the dev schedule, four forwards each (prompt, negative, STG, no audio-video "
                "cross-attention). pass_batching batched runs them as one forward. The reference's HQ variant: "
                "res_2s, 15 steps, schedule_shift 'latent tokens'.",
            23: "Stage 2 runs the same transformer with the distilled LoRA at strength 1.0 (the reference's default; "
                "its README examples use 0.8): 3 distilled steps, no guidance.",
            15: "The audio is stage 1's, as the reference's dev pipeline decodes it (stage 2's audio pass only feeds "
                "the video's cross-attention).",
        },
    },
}

# Every template is two-stage: with two_stage off, Latent Upsample refuses the full-size latent instead of doubling
# the output, and the note on the Empty Latent says what to bypass.
TWO_STAGE_NOTE = ("two_stage off (one stage at width×height): also bypass 'Upsample x2' and 'Stage 2' (Ctrl+B); the "
                  "upsampler refuses a full-size latent rather than doubling the output.")
for _workflow in WORKFLOWS.values():
    _workflow["notes"].setdefault(5, TWO_STAGE_NOTE)

# ---------------------------------------------------------------------------------------------------- conditioning
# The image and audio come from ComfyUI's core Load Image / Load Audio (headless: nodes/tools/core_standins.py); put
# files of these names in ComfyUI's input folder, or pick your own on the node.
EXAMPLE_FILES = {"first": "ltx25_first_frame.png", "last": "ltx25_last_frame.png", "audio": "ltx25_audio.wav",
                 "reference": "ltx25_reference.mp4"}


def _guided(spec: Spec, guides: int) -> Spec:
    """`spec` with both samplers (nodes 10 and 12) conditioned on the guides of node `guides`."""
    return [(i, c, t, {**v, "guides": (guides, 0)} if i in (10, 12) else v) for i, c, t, v in spec]


def _image_guide(load_id: int, guide_id: int, which: str, frame: int, chain: int | None = None) -> Spec:
    inputs = {"image": (load_id, 0), "video_encoder": (24, 0), "frame_index": frame, "strength": 1.0}
    return [(load_id, "LoadImage", f"{which.capitalize()} frame", {"image": EXAMPLE_FILES[which]}),
            (guide_id, "LTX25ImageGuide", f"Image guide (frame {frame})",
             inputs if chain is None else {**inputs, "guides": (chain, 0)})]


def _ab_outputs(prefix: str) -> Spec:
    return _conv_decode() + _diffusion_decode() + [
        (16, "LTX25DecoderCompare", "A/B: conv vs diffusion",
         {"images_a": (13, 0), "images_b": (14, 0), "stats_a": (13, 1), "stats_b": (14, 1)}),
        _save(17, (13, 0), f"{prefix}_conv", "Save conv"),
        _save(18, (14, 0), f"{prefix}_diffusion", "Save diffusion"),
        _save(19, (16, 0), f"{prefix}_side_by_side", "Save side by side", metadata=(16, 1))]


ENCODER = (24, "LTX25VideoEncoderLoader", "Video encoder (in the conv VAE file)", {"vae_file": FILES["conv_vae"]})
GUIDE_NOTE = ("The same guides go to both stages: each stage encodes the image at its own size (stage 1 at half, "
              "stage 2 at full), pre-compressed with H.264 at the model's CRF first, as the reference does.")
WORKFLOWS["ltx25_i2v_distilled"] = {
    "nodes": _guided(_common(stats_vae=7), 26) + [ENCODER, *_image_guide(25, 26, "first", 0)]
    + _ab_outputs("ltx25_i2v"),
    "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README); the image in ComfyUI's input "
                 "folder. It is scaled to cover the clip and centre-cropped.", 26: GUIDE_NOTE},
}
WORKFLOWS["ltx25_flf2v_distilled"] = {
    "nodes": _guided(_common(stats_vae=7), 28) + [ENCODER, *_image_guide(25, 26, "first", 0),
                                                  *_image_guide(27, 28, "last", -1, chain=26)]
    + _ab_outputs("ltx25_flf2v"),
    "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README); both images in ComfyUI's input "
                 "folder.", 28: "frame_index −1 is the clip's last frame; chained guides add up. " + GUIDE_NOTE},
}
WORKFLOWS["ltx25_a2v_distilled"] = {
    "nodes": [(i, c, t, {**v, "frames": (31, 1)} if i == 5 else v)
              for i, c, t, v in _guided(_common(stats_vae=7), 31) if i not in (9, 15)]
    + [(29, "LoadAudio", "Audio", {"audio": EXAMPLE_FILES["audio"]}),
       (30, "LTX25AudioEncoderLoader", "Audio encoder (in the audio VAE file)", {"audio_vae_file": FILES["audio_vae"]}),
       (31, "LTX25AudioGuide", "Audio guide (held)", {"audio": (29, 0), "audio_encoder": (30, 0), "fps": 24.0}),
       *_conv_decode(),
       (17, "LTX25SaveVideo", "Save video (the given audio)",
        {"images": (13, 0), "audio": (29, 0), "latent": (12, 0), "filename_prefix": "ltx25_a2v"})],
    "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README); the audio in ComfyUI's input "
                 "folder.",
              31: "The audio is held bit for bit in both stages; frames (the 8k+1 frames it covers at fps) sets the "
                  "clip's length: keep fps equal to Empty Latent's. Audio longer than the clip is refused at "
                  "sampling.",
              17: "The save muxes the given audio, not a decode of its latent."},
}
WORKFLOWS["ltx25_extend"] = {
    "nodes": _common(stats_vae=7) + [
        (7, "LTX25VideoVAELoader", "Conv video VAE", {"vae_file": FILES["conv_vae"]}),
        (32, "LTX25ExtendClip", "Extend the clip", {"video_latent": (12, 0), "audio_latent": (12, 1),
                                                    "new_frames": 48, "overlap": 2}),
        (33, "LTX25DistilledSampler", "Window (full size, one stage)",
         {"model": (1, 0), "conditioning": (4, 0), "video_latent": (32, 0), "audio_latent": (32, 1), "seed": 43,
          "stage": "1", "guides": (32, 2)}),
        (34, "LTX25JoinExtension", "Join", {"video_latent": (12, 0), "audio_latent": (12, 1),
                                            "window_video": (33, 0), "window_audio": (33, 1), "overlap": 2}),
        (35, "LTX25ConvVAEDecode", "Conv VAE decode (joined)", {"video_vae": (7, 0), "latent": (34, 0)}),
        (36, "LTX25AudioDecode", "Audio decode (joined)", {"audio_vae": (9, 0), "audio_latent": (34, 1)}),
        (37, "LTX25SaveVideo", "Save extended video", {"images": (35, 0), "audio": (36, 0), "latent": (34, 0),
                                                       "filename_prefix": "ltx25_extend"})],
    "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README). The first two stages make the "
                 "source clip; a LoadLatent pair can replace them.",
              32: "The window starts with the source's last `overlap` latent frames held bit for bit, in the joined "
                  "clip's positions; Join keeps the source and adds the window's new frames. Keep both overlaps "
                  "equal."},
}
# IC-LoRA (Lightricks' ICLoraPipeline): stage 1 runs the transformer with the IC-LoRA and the reference video appended;
# stage 2 the plain transformer with no reference, as the reference pipeline does. The clip's length comes from the
# video (the guide's frames output), its frame rate too: the IC-LoRA follows the control video frame by frame.
WORKFLOWS["ltx25_ic_lora"] = {
    "nodes": [(i, c, t, {**v, "model": (40, 0), "guides": (41, 0)} if i == 10 else
               {**v, "frames": (41, 1), "fps": (39, 2)} if i == 5 else v) for i, c, t, v in _common(stats_vae=7)]
    + [ENCODER,
       (38, "LoadVideo", "Reference video", {"file": EXAMPLE_FILES["reference"]}),
       (39, "GetVideoComponents", "Reference frames", {"video": (38, 0)}),
       (40, "LTX25LoraLoader", "IC-LoRA (stage 1 only)", {"model": (1, 0), "lora_file": IC_LORA_FILE[1],
                                                          "strength": 1.0}),
       (41, "LTX25ReferenceVideoGuide", "Reference video guide (stage 1)",
        {"model": (40, 0), "images": (39, 0), "video_encoder": (24, 0), "strength": 1.0,
         "attention_strength": 1.0})]
    + _ab_outputs("ltx25_ic_lora"),
    "notes": {1: "Put the official LTX-2.5 files in ComfyUI's model folders (README), your IC-LoRA in loras/ and the "
                 "reference (control) video in ComfyUI's input folder.",
              40: "Pick your IC-LoRA. Its file's metadata says at what size and frame spacing it was trained on "
                  "reference videos; stage 2 runs the plain transformer, as the reference pipeline does.",
              41: "The video is fitted to 1/s of stage 1's size (cover and centre-crop; an aspect far from the "
                  "clip's is refused) and its tokens are appended clean, at positions stretched back onto the "
                  "clip's by the IC-LoRA's factors. frames sets the clip's length to what the video covers. "
                  "attention_strength (and an optional attention_mask video) lowers how much the clip attends to "
                  "the reference."},
    "phases": {40: "Guides"},
}
for _workflow in WORKFLOWS.values():
    _workflow["notes"].setdefault(5, TWO_STAGE_NOTE)

# The template browser's card titles (the UI files' names): short enough for one line of a card, and only
# characters every file system and URL path takes.
TITLES = {
    "ltx25_t2v_distilled_decoder_ab": "LTX-2.5 T2V, A-B decoders",
    "ltx25_t2v_distilled_conv": "LTX-2.5 T2V, conv VAE",
    "ltx25_t2v_distilled_diffusion_vae": "LTX-2.5 T2V, diffusion VAE",
    "ltx25_t2v_dev_two_stage": "LTX-2.5 T2V dev, A-B decoders",
    "ltx25_i2v_distilled": "LTX-2.5 I2V, A-B decoders",
    "ltx25_flf2v_distilled": "LTX-2.5 FLF2V, A-B decoders",
    "ltx25_a2v_distilled": "LTX-2.5 A2V, conv VAE",
    "ltx25_extend": "LTX-2.5 extend, conv VAE",
    "ltx25_ic_lora": "LTX-2.5 IC-LoRA, A-B decoders",
}


def ui_name(name: str) -> str:
    """The UI file's name without .json (the card title); a template without a title keeps its short name."""
    return WORKFLOWS[name].get("title") or TITLES.get(name, name)

MODEL_FOLDERS = {name: folder for folder, name in (*OFFICIAL_FILES.values(), *DEV_FILES.values())}


CLASSES = {**CORE_STANDINS, **NODE_CLASS_MAPPINGS}  # what the specs name: the pack's nodes and two core loaders


def to_api(spec: Spec, classes: Mapping[str, type] = CLASSES) -> dict[str, dict]:
    """API prompt with every widget filled: the spec's value, else the node's declared default."""
    prompt: dict[str, dict] = {}
    for node_id, class_type, title, given in spec:
        inputs: dict[str, Any] = {}
        for name, (kind, options, required) in input_specs(classes[class_type]).items():
            if name in given:
                value = given[name]
                inputs[name] = [str(value[0]), value[1]] if isinstance(value, tuple) else value
            elif is_widget(kind) and required:
                inputs[name] = options["default"] if "default" in options else kind[0]
        unknown = set(given) - set(input_specs(classes[class_type]))
        if unknown:
            raise KeyError(f"{class_type} has no input(s) {sorted(unknown)}")
        prompt[str(node_id)] = {"class_type": class_type, "inputs": inputs, "_meta": {"title": title}}
    return prompt


def to_ui(prompt: Mapping[str, dict], notes: Mapping[int, str], classes: Mapping[str, type] = CLASSES,
          phases: Mapping[int, str] | None = None) -> dict:
    """A v0.4 UI workflow the canvas opens, laid out in groups by canvas_layout; converting it back with
    graph.ui_to_api gives `prompt`."""
    order = execution_order(prompt)
    next_id = max(int(i) for i in prompt) + 1
    note_ids = {target: next_id + i for i, target in enumerate(notes)}
    groups = canvas_layout.phase_blocks(prompt, notes, classes, {t: str(i) for t, i in note_ids.items()}, phases)
    layout = canvas_layout.place(groups)
    boxes = {box.key: box for _title, _color, blocks in groups for block in blocks for box in block}
    links: list[list] = []
    node_inputs: dict[str, list[dict]] = {}
    node_widgets: dict[str, list] = {}
    for node_id in order:  # links first, so each output knows its link ids
        node = prompt[node_id]
        inputs, widgets = node_inputs.setdefault(node_id, []), node_widgets.setdefault(node_id, [])
        for name, (kind, options, _required) in input_specs(classes[node["class_type"]]).items():
            value = node["inputs"].get(name)
            if isinstance(value, list):
                links.append([len(links) + 1, int(value[0]), value[1], int(node_id), len(inputs), kind])
                inputs.append({"name": name, "type": kind, "link": len(links)})
                if is_widget(kind):  # a widget fed by a link: marked as such, its saved value is the default
                    inputs[-1]["widget"] = {"name": name}
                    widgets.append(options.get("default", ""))
            elif not is_widget(kind):
                inputs.append({"name": name, "type": kind, "link": None})
            elif name in node["inputs"]:
                widgets.append(value)
                if has_control_value(name, kind, options):
                    widgets.append("fixed")  # the UI-only "control after generate" value
    nodes = []
    for order_index, node_id in enumerate(order):
        node = prompt[node_id]
        cls = classes[node["class_type"]]
        inputs, widgets = node_inputs[node_id], node_widgets[node_id]
        out_links = {slot: [l[0] for l in links if l[1] == int(node_id) and l[2] == slot]
                     for slot in range(len(cls.RETURN_TYPES))}
        names = getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)
        ui_node = {
            "id": int(node_id), "type": node["class_type"], "title": node["_meta"]["title"],
            "pos": list(layout.positions[node_id]), "size": [boxes[node_id].width, boxes[node_id].height],
            "flags": {}, "order": order_index,
            "mode": 0, "inputs": inputs,
            "outputs": [{"name": n, "type": t, "links": out_links[i], "slot_index": i}
                        for i, (n, t) in enumerate(zip(names, cls.RETURN_TYPES))],
            "properties": {"Node name for S&R": node["class_type"]},
            "widgets_values": widgets,
        }
        models = [{"name": v, "url": HF + v, "directory": MODEL_FOLDERS[v]}
                  for v in node["inputs"].values() if isinstance(v, str) and v in MODEL_FOLDERS]
        if models:
            ui_node["properties"]["models"] = models
        for decoder, (color, bgcolor) in DECODER_COLORS.items():
            if decoder in node["class_type"].lower() or decoder in node["_meta"]["title"].lower():
                ui_node |= {"color": color, "bgcolor": bgcolor}
        nodes.append(ui_node)
    for target, text in notes.items():
        key = str(note_ids[target])
        nodes.append({"id": note_ids[target], "type": "Note", "title": "Note", "pos": list(layout.positions[key]),
                      "size": [boxes[key].width, boxes[key].height], "flags": {}, "order": len(nodes), "mode": 0,
                      "inputs": [], "outputs": [], "properties": {}, "widgets_values": [text],
                      "color": "#432", "bgcolor": "#653"})
    return {"id": "00000000-0000-4000-8000-00000000ab25", "revision": 0,
            "last_node_id": max(n["id"] for n in nodes), "last_link_id": len(links), "nodes": nodes,
            "links": links, "groups": layout.groups, "config": {}, "extra": {"ds": layout.ds}, "version": 0.4}


def write_all(root: str = ROOT) -> list[str]:
    written = []
    for name, workflow in WORKFLOWS.items():
        api = to_api(workflow["nodes"])
        ui = to_ui(api, workflow["notes"], phases=workflow.get("phases"))
        for path, data in ((os.path.join(root, "workflows", "api", f"{name}.json"), api),
                           (os.path.join(root, "workflows", f"{ui_name(name)}.json"), ui)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.write("\n")
            written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all():
        print(path)
