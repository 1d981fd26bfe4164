"""The templates' canvas layout without a browser: every template has a card title and a thumbnail, its groups hold
its nodes with the room they take after a run and nothing overlaps, and it opens whole and in full detail. These
check the layout against its own size estimates; tests/test_web_browser.py checks the real boxes in ComfyUI's
frontend after a run."""
from __future__ import annotations

import json
import os
import re

import pytest

from nodes.tools import canvas_layout, workflow_specs

ROOT = workflow_specs.ROOT
NAMES = sorted(workflow_specs.WORKFLOWS)
# ComfyUI 0.33's frontend draws nodes as plain boxes, without widgets or text, below zoom 8 px / 14 px.
DETAIL_ZOOM = 8 / 14
# What any file system and a URL path take as is, besides letters and digits; a card shows about 35 characters.
TITLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ,.()+-]{2,31}$")


def ui(name: str) -> dict:
    with open(os.path.join(ROOT, "workflows", f"{workflow_specs.ui_name(name)}.json"), encoding="utf-8") as f:
        return json.load(f)


def box(node: dict) -> list[float]:
    """[x, y, w, h] with the title bar, which LiteGraph draws above node.pos."""
    return [node["pos"][0], node["pos"][1] - canvas_layout.TITLE_H, node["size"][0],
            node["size"][1] + canvas_layout.TITLE_H]


def overlaps(a: list[float], b: list[float]) -> bool:
    return min(a[0] + a[2], b[0] + b[2]) > max(a[0], b[0]) and min(a[1] + a[3], b[1] + b[3]) > max(a[1], b[1])


def inside(inner: list[float], outer: list[float]) -> bool:
    return (inner[0] >= outer[0] and inner[1] >= outer[1] and inner[0] + inner[2] <= outer[0] + outer[2]
            and inner[1] + inner[3] <= outer[1] + outer[3])


def test_every_template_has_a_card_title_and_a_thumbnail():
    """ComfyUI 0.33's template browser shows a pack's template by its file name and `<name>.jpg` as its
    thumbnail: each UI file is named after a short title, and its JPEG (under 60 KB) lies beside it. Fails for a
    template without a title (its card would show the raw name) or a thumbnail (the card asks for it and gets 404),
    and for files no spec writes any more."""
    folder = os.path.join(ROOT, "workflows")
    titles = [workflow_specs.ui_name(n) for n in NAMES]
    assert len(set(titles)) == len(titles), titles
    for name, title in zip(NAMES, titles):
        assert title != name and TITLE.match(title), f"{name}: title {title!r}"
        with open(os.path.join(folder, f"{title}.jpg"), "rb") as f:
            data = f.read()
        assert data[:3] == b"\xff\xd8\xff" and len(data) < 60 * 1024, f"{title}.jpg: {len(data)} bytes"
    on_disk = {f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f))}
    assert on_disk == {f"{t}{ext}" for t in titles for ext in (".json", ".jpg")}, sorted(on_disk)


@pytest.mark.parametrize("name", NAMES)
def test_nodes_sit_in_groups_without_overlap_with_notes_above_what_they_explain(name):
    """Each node (notes included), sized for what it shows after a run, lies inside one phase group; no two nodes
    overlap; each note sits directly above the node it explains, as wide as it. Fails when a size, a gap or the
    packing changes so that something would cover a neighbour (a note over the conv decode's tiling widgets)."""
    workflow = ui(name)
    nodes, groups = workflow["nodes"], [g["bounding"] for g in workflow["groups"]]
    for node in nodes:
        assert sum(inside(box(node), g) for g in groups) == 1, f"{node['id']} {node['title']} in {groups}"
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            assert not overlaps(box(a), box(b)), f"{a['id']} {a['title']} {box(a)} / {b['id']} {b['title']} {box(b)}"
    notes = [n for n in nodes if n["type"] == "Note"]
    assert len(notes) == len(workflow_specs.WORKFLOWS[name]["notes"])
    for note in notes:
        below = [n for n in nodes if n["pos"][0] == note["pos"][0] and n["size"][0] == note["size"][0]
                 and 0 < box(n)[1] - (note["pos"][1] + note["size"][1]) <= canvas_layout.NODE_GAP]
        assert below and below[0]["type"] != "Note", f"note {note['id']} is above no node"


@pytest.mark.parametrize("name", NAMES)
def test_template_opens_whole_and_in_full_detail_on_a_1920x1080_screen(name):
    """The frontend opens a template fitted to its nodes' bounds (75 % of the page); the file's `extra.ds` is that
    same view, so a file opened by hand looks the same. On a 1920×1080 page that view must stay above the zoom where
    the frontend stops drawing widgets, and leave the minimap's corner free. Fails when a template grows too large
    for its nodes to be read when it opens."""
    workflow = ui(name)
    boxes = [box(n) for n in workflow["nodes"]]
    ds = canvas_layout.fit_view(boxes, (1920, 1080))
    assert workflow["extra"]["ds"] == ds
    assert ds["scale"] > DETAIL_ZOOM, f"opens at zoom {ds['scale']:.3f}"
    assert canvas_layout.clear_of_minimap(boxes, ds, (1920, 1080))


def test_phases_follow_the_graph():
    """Phases come from the graph, so new templates get groups for free: a loader without inputs loads models, a
    sampler after the latent upsample is stage 2 (before it, stage 1; after an extend, the extend window), a save of
    the compare output sits under the viewer, a node of a class the rules do not know joins what it feeds (an image
    loader its guide's stage, an audio loader the guides), and an override wins. Fails when a rule
    is lost, so a template puts a node in the wrong group."""
    prompt = {
        "1": {"class_type": "LTX25TransformerLoader", "inputs": {}},
        "2": {"class_type": "LoadImage", "inputs": {}},
        "3": {"class_type": "SomeGuide", "inputs": {"image": ["2", 0]}},
        "4": {"class_type": "LTX25DistilledSampler", "inputs": {"model": ["1", 0], "video_latent": ["3", 0]}},
        "5": {"class_type": "LTX25LatentUpsample", "inputs": {"video_latent": ["4", 0]}},
        "6": {"class_type": "LTX25DistilledSampler", "inputs": {"model": ["1", 0], "video_latent": ["5", 0]}},
        "7": {"class_type": "LTX25ConvVAEDecode", "inputs": {"latent": ["6", 0]}},
        "8": {"class_type": "LTX25DecoderCompare", "inputs": {"images_a": ["7", 0], "images_b": ["7", 0]}},
        "9": {"class_type": "LTX25SaveVideo", "inputs": {"images": ["8", 0]}},
        "10": {"class_type": "LTX25SaveVideo", "inputs": {"images": ["7", 0]}},
        "11": {"class_type": "LoadAudio", "inputs": {}},
        "12": {"class_type": "LTX25AudioGuide", "inputs": {"audio": ["11", 0]}},
        "13": {"class_type": "LTX25ExtendClip", "inputs": {"video_latent": ["6", 0]}},
        "14": {"class_type": "LTX25DistilledSampler", "inputs": {"video_latent": ["13", 0], "guides": ["13", 2]}},
    }
    phase = canvas_layout.phases_of(prompt)
    assert phase == {"1": "Load models", "2": "Stage 1: half size", "3": "Stage 1: half size",
                     "4": "Stage 1: half size", "5": "Stage 2: full size", "6": "Stage 2: full size",
                     "7": "Decode A: conv VAE", "8": "Compare A/B", "9": "Compare A/B", "10": "Save",
                     "11": "Guides", "12": "Guides", "13": "Extend", "14": "Extend"}, phase
    assert canvas_layout.phases_of(prompt, {10: "Decode A: conv VAE"})["10"] == "Decode A: conv VAE"
