"""Where a template's nodes sit on ComfyUI's canvas.

Every node belongs to a phase (load, prompt, guides, stage 1, stage 2, extend, decode A, decode B, audio, compare,
save), drawn as a LiteGraph group. Inside its group a node keeps the room it takes *after* a run (the decode
figures, the A/B viewer, the video previews), and a note sits right above the node it explains, so nothing grows
over or hides anything else. Groups stack into columns, packed so that the graph opens as large as possible.

How it opens: ComfyUI 0.33's frontend (1.49) ignores a template's `extra.ds` when the template browser opens it and
fits the view to the nodes' bounds instead, at 75 % of the page in the tighter direction, centred; a workflow opened
as a file gets its `extra.ds`. So the layout is judged by that fit, and `extra.ds` is set to the same view: either
way the whole graph shows, clear of the minimap, and, as long as the zoom stays above the frontend's level-of-detail
threshold (8 px over its 14 px node font: 0.571), with every widget drawn.

Sizes follow that frontend's LiteGraph: a node's `pos` is the top-left of its body and its title bar (30 px) sits
above it; body height = slot rows × 20 + widgets × 24 (+8) + 6, a multiline text widget 30 more.
`tests/test_web_browser.py` measures the real boxes after a run and fails on any overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .graph import execution_order, has_control_value, input_specs, is_widget

TITLE_H = 30             # LiteGraph.NODE_TITLE_HEIGHT: drawn above node.pos
SLOT_H, WIDGET_H = 20, 24
MULTILINE_EXTRA = 30     # a multiline text widget's minimum over a one-line widget
GROUP_HEADER = 34        # a group's title bar: font_size 24 × 1.4
GROUP_FONT = 24
GROUP_PAD, NODE_GAP, COLUMN_GAP = 10, 20, 24
GROUP_TOP = GROUP_HEADER + NODE_GAP  # the gap above a node holds its badges (pack name, decoder path)
NODE_WIDTH = 280
# Room a node takes after a run, beyond its widgets (what web/ltx25_ab_viewer.js and the frontend add):
# the decode figures panel holds at most 6 rows of 18 px (+12); the compare viewer asks for 420 px (+4) and at
# least 460 px of width; a save shows its video under its widgets at the node's width.
DECODE_PANEL = 124
WIDTHS = {"LTX25EncodePrompt": 320, "LTX25DecoderCompare": 470}
COMPARE_VIEWER = 424
# ComfyUI's core loaders the conditioning templates start from: an upload button under the file widget, then the
# image at the node's width (sized here for an image of the clip's aspect, which the guide crops to; measured: 29 px
# of margins around it) or an audio player.
UPLOAD_BUTTON, IMAGE_MARGIN, AUDIO_PLAYER = 24, 40, 60
# A line of text a node sends during its run (bridge.show_on_node, ComfyUI's progress text) is shown under its
# widgets in a box of about 40 px: the conv decode's and the video encode's tile plans on every run, a sampler's
# note on compiling, or on how much of the transformer streams from host memory when ComfyUI loads it in part.
PROGRESS_TEXT = 44
SHOWS_PROGRESS_TEXT = ("LTX25ConvVAEDecode", "LTX25EncodeVideo", "LTX25DistilledSampler", "LTX25GuidedSampler")
VIDEO_PREVIEW_MARGIN = 18  # the preview spans the node's width less its margins, at the clip's aspect ratio
# The page a template opens in: a 1920×1080 screen.
VIEWPORT = (1920, 1080)
FIT_ZOOM, FIT_PAD = 0.75, 10  # the frontend's fitView: 75 % of the page, around the nodes' bounds padded by 10
MINIMAP = (264, 266)  # the bottom-right corner the frontend's minimap and zoom buttons cover (width, height)

# (phase, group colour) in reading order; a phase is laid out only when a node belongs to it.
PHASES = (
    ("Load models", "#3f789e"),
    ("Prompt", "#b58b2a"),
    ("Guides", "#8AA"),
    ("Stage 1: half size", "#88A"),
    ("Stage 2: full size", "#88A"),
    ("Extend", "#b06634"),
    ("Decode A: conv VAE", "#2a4d6e"),
    ("Decode B: diffusion VAE", "#6e3a2a"),
    ("Audio", "#a1309b"),
    ("Compare A/B", "#8A8"),
    ("Save", "#8A8"),
)
OTHER_COLOR = "#444"
PHASE_OF_CLASS = {
    "LTX25EncodePrompt": "Prompt", "LTX25Connector": "Prompt", "LTX25MultimodalGuider": "Prompt",
    "LTX25EmptyLatent": "Stage 1: half size", "LTX25LatentUpsample": "Stage 2: full size",
    "LTX25ConvVAEDecode": "Decode A: conv VAE", "LTX25DiffusionVAEDecode": "Decode B: diffusion VAE",
    "LTX25AudioDecode": "Audio", "LTX25DecoderCompare": "Compare A/B", "LTX25SaveVideo": "Save",
    "LTX25ImageGuide": "Guides", "LTX25AudioGuide": "Guides", "LTX25ReferenceVideoGuide": "Guides",
    "LTX25ExtendClip": "Extend", "LTX25JoinExtension": "Extend",
}
SAMPLERS = ("LTX25DistilledSampler", "LTX25GuidedSampler")


def phases_of(prompt: Mapping[str, dict], overrides: Mapping[int, str] | None = None) -> dict[str, str]:
    """node id → phase. By class; a sampler downstream of the latent upsample is stage 2; a loader without linked
    inputs loads models; any other node joins its first consumer's phase (else its first source's), so new node
    kinds land next to what they feed. `overrides` ({node id: phase}) wins over all of it."""
    order = execution_order(prompt)
    sources = {i: [v[0] for v in prompt[i]["inputs"].values() if isinstance(v, list)] for i in order}
    consumers: dict[str, list[str]] = {i: [] for i in order}
    for node_id in order:
        for source in sources[node_id]:
            consumers[source].append(node_id)

    def upstream(node_id: str, seen: set[str]) -> set[str]:
        for source in sources[node_id]:
            if source not in seen:
                seen.add(source)
                upstream(source, seen)
        return seen

    phase: dict[str, str] = {str(k): v for k, v in (overrides or {}).items()}
    for node_id in order:
        cls = prompt[node_id]["class_type"]
        if node_id in phase:
            continue
        if cls in SAMPLERS and any(prompt[s]["class_type"] == "LTX25ExtendClip" for s in sources[node_id]):
            phase[node_id] = "Extend"  # the window's sampler
        elif cls in SAMPLERS:
            after_upsample = any(prompt[s]["class_type"] == "LTX25LatentUpsample" for s in upstream(node_id, set()))
            phase[node_id] = "Stage 2: full size" if after_upsample else "Stage 1: half size"
        elif cls == "LTX25SaveVideo" and any(prompt[s]["class_type"] == "LTX25DecoderCompare"
                                             for s in sources[node_id]):
            phase[node_id] = "Compare A/B"  # the side-by-side save sits under the viewer it saves
        elif cls in PHASE_OF_CLASS:
            phase[node_id] = PHASE_OF_CLASS[cls]
        elif cls.endswith("Loader") and not sources[node_id]:
            phase[node_id] = "Load models"
    for node_id in reversed(order):  # consumers first, so a chain of unknown nodes follows what it feeds
        if node_id not in phase:
            known = [phase[c] for c in consumers[node_id] if c in phase]
            if known:
                phase[node_id] = known[0]
    for node_id in order:
        if node_id not in phase:
            known = [phase[s] for s in sources[node_id] if s in phase]
            phase[node_id] = known[0] if known else "Other"
    return phase


def text_lines(text: str, width: int) -> int:
    """Lines a multiline text widget (or a Note) needs for `text` in a node `width` wide: the frontend's text area
    fits about one character per 5.6 px of the node's width less 24 px of margins."""
    per_line = max(20, int((width - 24) / 5.6))
    return sum(max(1, math.ceil(len(part) / per_line)) for part in text.split("\n"))


def title_width(title: str) -> int:
    """The width the frontend widens a node to for its title: about 6.5 px a character at its 14 px font, plus the
    collapse dot and margins."""
    return math.ceil(6.5 * len(title)) + 40


def node_size(class_type: str, node_class: type, preview_aspect: float,
              values: Mapping[str, Any] | None = None, title: str = "") -> tuple[int, int]:
    """[width, height] of a node's body with the room it takes after a run; `preview_aspect` is height/width of
    the clip a save node previews; `values` (the node's inputs) size multiline text to show all of it."""
    specs = input_specs(node_class)
    width = max(WIDTHS.get(class_type, NODE_WIDTH), title_width(title))
    sockets = sum(not is_widget(kind) for kind, _o, _r in specs.values())
    widgets = sum(1 + has_control_value(name, kind, options)
                  for name, (kind, options, _r) in specs.items() if is_widget(kind))
    texts = [(values or {}).get(name, "") for name, (kind, options, _r) in specs.items()
             if kind == "STRING" and options.get("multiline")]
    rows = max(1, sockets, len(node_class.RETURN_TYPES))
    height = 6 + SLOT_H * rows + (WIDGET_H * widgets + 8 if widgets else 0)
    height += sum(max(MULTILINE_EXTRA, 14 * text_lines(t, width) + 16 - WIDGET_H) if isinstance(t, str)
                  else MULTILINE_EXTRA for t in texts)
    if class_type in SHOWS_PROGRESS_TEXT:
        height += PROGRESS_TEXT
    if class_type in ("LTX25ConvVAEDecode", "LTX25DiffusionVAEDecode"):
        height += DECODE_PANEL
    elif class_type == "LTX25DecoderCompare":
        height += COMPARE_VIEWER
    elif class_type == "LTX25SaveVideo":
        height += math.ceil((width - VIDEO_PREVIEW_MARGIN) * preview_aspect) + 8
    elif class_type == "LoadImage":
        height += UPLOAD_BUTTON + math.ceil((width - VIDEO_PREVIEW_MARGIN) * preview_aspect) + IMAGE_MARGIN
    elif class_type == "LoadVideo":  # its video plays under the upload button, like Load Image's picture
        height += UPLOAD_BUTTON + math.ceil((width - VIDEO_PREVIEW_MARGIN) * preview_aspect) + IMAGE_MARGIN
    elif class_type == "LoadAudio":
        height += UPLOAD_BUTTON + AUDIO_PLAYER
    return width, height


def note_height(text: str, width: int) -> int:
    """A Note tall enough to show all its text, in lines of 14 px below 26 px and above 22 px of padding."""
    return max(88, 26 + 14 * text_lines(text, width) + 22)


@dataclass(frozen=True)
class Box:
    """One thing to place: a node or a note, with its body size as LiteGraph stores it (the title bar is above)."""
    key: str
    width: int
    height: int


Block = tuple[Box, ...]  # a node with the note above it: never split across columns


@dataclass(frozen=True)
class Placed:
    positions: dict[str, tuple[int, int]]       # key → node.pos (top-left of the body)
    groups: list[dict]                          # v0.4 group entries
    ds: dict[str, Any]                          # extra.ds: the view the workflow opens with


def _block_height(block: Block) -> int:
    return sum(TITLE_H + box.height for box in block) + NODE_GAP * (len(block) - 1)


def _wrap(heights: Sequence[int], limit: int) -> list[list[int]]:
    """Indices split into runs whose stacked height (with gaps) stays within `limit`; one item at least per run."""
    runs: list[list[int]] = []
    used = 0
    for index, height in enumerate(heights):
        if runs and used + NODE_GAP + height <= limit:
            runs[-1].append(index)
            used += NODE_GAP + height
        else:
            runs.append([index])
            used = height
    return runs


@dataclass(frozen=True)
class _Group:
    title: str
    color: str
    columns: tuple[tuple[int, tuple[Block, ...]], ...]  # sub-columns: (width, blocks stacked top to bottom)
    width: int
    height: int


def _group(title: str, color: str, blocks: Sequence[Block], limit: int) -> _Group:
    """A phase's group, its blocks wrapped into sub-columns so that the group stays within `limit` in height."""
    runs = _wrap([_block_height(b) for b in blocks], limit - GROUP_TOP - GROUP_PAD)
    columns = tuple((max(box.width for i in run for box in blocks[i]), tuple(blocks[i] for i in run)) for run in runs)
    width = 2 * GROUP_PAD + sum(w for w, _ in columns) + NODE_GAP * (len(columns) - 1)
    height = GROUP_TOP + GROUP_PAD + max(
        sum(_block_height(b) for b in bs) + NODE_GAP * (len(bs) - 1) for _, bs in columns)
    return _Group(title, color, columns, width, height)


def _pack(groups: Sequence[_Group], limit: int) -> list[list[int]]:
    """Groups (in order) cut into consecutive columns of at most `limit` in height with the least total width."""
    n = len(groups)
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        height = -NODE_GAP
        for start in range(end - 1, -1, -1):
            height += groups[start].height + NODE_GAP
            if height > limit and start < end - 1:
                break
            width = best[start] + max(g.width for g in groups[start:end]) + COLUMN_GAP
            if width < best[end]:
                best[end], cut[end] = width, start
    runs, end = [], n
    while end:
        runs.insert(0, list(range(cut[end], end)))
        end = cut[end]
    return runs


def _place_columns(groups: Sequence[_Group], runs: Sequence[Sequence[int]]) -> tuple[dict, list[dict]]:
    positions: dict[str, tuple[int, int]] = {}
    entries: list[dict] = []
    x = 0
    for run in runs:
        y = 0
        for index in run:
            group = groups[index]
            entries.append({"id": len(entries) + 1, "title": group.title, "bounding": [x, y, group.width, group.height],
                            "color": group.color, "font_size": GROUP_FONT, "flags": {}})
            cx = x + GROUP_PAD
            for column_width, blocks in group.columns:
                cy = y + GROUP_TOP
                for block in blocks:
                    for box in block:
                        positions[box.key] = (cx, cy + TITLE_H)
                        cy += TITLE_H + box.height + NODE_GAP
                cx += column_width + NODE_GAP
            y += group.height + NODE_GAP
        x += max(groups[i].width for i in run) + COLUMN_GAP
    return positions, entries


def fit_view(boxes: Sequence[Sequence[float]], viewport: tuple[int, int] = VIEWPORT) -> dict[str, Any]:
    """The view the frontend's fitView gives nodes whose boxes ([x, y, w, h], title bar included) these are:
    their bounds padded by FIT_PAD, zoomed to FIT_ZOOM of the page in the tighter direction, centred.
    LiteGraph draws graph point p at screen (p + offset) × scale."""
    x0, y0 = min(b[0] for b in boxes) - FIT_PAD, min(b[1] for b in boxes) - FIT_PAD
    w = max(b[0] + b[2] for b in boxes) + FIT_PAD - x0
    h = max(b[1] + b[3] for b in boxes) + FIT_PAD - y0
    scale = min(FIT_ZOOM * viewport[0] / max(w, 300), FIT_ZOOM * viewport[1] / max(h, 300))
    return {"scale": round(scale, 4), "offset": [round(-x0 - w / 2 + viewport[0] / scale / 2, 1),
                                                 round(-y0 - h / 2 + viewport[1] / scale / 2, 1)]}


def clear_of_minimap(boxes: Sequence[Sequence[float]], ds: Mapping[str, Any],
                     viewport: tuple[int, int] = VIEWPORT) -> bool:
    scale, (ox, oy) = ds["scale"], ds["offset"]
    left, top = viewport[0] - MINIMAP[0], viewport[1] - MINIMAP[1]
    return all((x + w + ox) * scale <= left or (y + h + oy) * scale <= top for x, y, w, h in boxes)


def place(phases: Sequence[tuple[str, str, Sequence[Block]]]) -> Placed:
    """Lay the phases (title, group colour, blocks in order) out in the columns that open the largest in VIEWPORT
    clear of the minimap: every column height limit is tried, the last column (next to the minimap) with its own."""
    sizes = {b.key: b for _t, _c, blocks in phases for block in blocks for b in block}
    best: tuple | None = None
    for limit in range(600, 2401, 50):
        groups = [_group(title, color, blocks, limit) for title, color, blocks in phases]
        for last_limit in range(400, limit + 1, 100):
            last = [_group(title, color, blocks, last_limit) for title, color, blocks in phases]
            for split in range(len(phases) - 1, -1, -1):  # phases[split:] form the last column
                tail = last[split:]
                if sum(g.height + NODE_GAP for g in tail) - NODE_GAP > last_limit and split < len(phases) - 1:
                    break
                runs = (_pack(groups[:split], limit) if split else []) + [list(range(split, len(phases)))]
                positions, entries = _place_columns(groups[:split] + tail, runs)
                boxes = [(x, y - TITLE_H, sizes[k].width, sizes[k].height + TITLE_H) for k, (x, y) in positions.items()]
                ds = fit_view(boxes)
                score = (clear_of_minimap(boxes, ds), ds["scale"])
                if best is None or score > best[0]:
                    best = (score, Placed(positions, entries, ds))
    return best[1]


def preview_aspect(prompt: Mapping[str, dict], node_id: str) -> float:
    """Height/width of the video a save node previews: the clip's (its Empty Latent's size), halved for the
    compare node's side-by-side picture and doubled for its stacked one."""
    empty = next((n["inputs"] for n in prompt.values() if n["class_type"] == "LTX25EmptyLatent"), {})
    aspect = empty.get("height", 512) / empty.get("width", 768)
    source = prompt[node_id]["inputs"].get("images")
    if isinstance(source, list) and prompt[source[0]]["class_type"] == "LTX25DecoderCompare":
        aspect *= 2 if prompt[source[0]]["inputs"].get("layout") == "stacked" else 0.5
    return aspect


def phase_blocks(prompt: Mapping[str, dict], notes: Mapping[int, str], classes: Mapping[str, type],
                 note_keys: Mapping[int, str], overrides: Mapping[int, str] | None = None
                 ) -> list[tuple[str, str, list[Block]]]:
    """The phases of an API prompt as `place` takes them: each node (execution order) with its note above it;
    `note_keys` names each note's node by the id of the node it explains."""
    phase = phases_of(prompt, overrides)
    colors = dict(PHASES)
    if not any(node["class_type"] == "LTX25DecoderCompare" for node in prompt.values()):
        single = {t: t.replace("Decode A: ", "Decode: ").replace("Decode B: ", "Decode: ") for t, _ in PHASES}
        phase = {k: single.get(v, v) for k, v in phase.items()}  # one decoder: no A and B to tell apart
        colors = {single[t]: c for t, c in PHASES}
    titles = [t for t in colors if t in phase.values()]
    titles += sorted({p for p in phase.values() if p not in colors})
    out = []
    for title in titles:
        blocks = []
        for node_id in execution_order(prompt):
            if phase[node_id] != title:
                continue
            node = prompt[node_id]
            cls = node["class_type"]
            size = node_size(cls, classes[cls], preview_aspect(prompt, node_id), node["inputs"],
                             node.get("_meta", {}).get("title", ""))
            text = notes.get(int(node_id))
            boxes = (Box(note_keys[int(node_id)], size[0], note_height(text, size[0])),) if text else ()
            blocks.append((*boxes, Box(node_id, *size)))
        out.append((title, colors.get(title, OTHER_COLOR), blocks))
    return out
