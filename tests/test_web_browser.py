"""The templates and the canvas extension in the real frontend: ComfyUI with the pack and the tiny set, every
shipped template opened from headless Debian chromium in a 1920×960 page (a maximised browser on a 1920×1080
screen), run, and measured: what is on screen when it opens, every node's box after the run (what the decode
figures, the A/B viewer and the video previews add included), the template browser's cards, and the A/B viewer's
wipe, scrubber and decoder panels.

Runs only when `COMFYUI_PATH` is set (see tests/comfyui_harness.py), `/usr/bin/chromium` exists
(`apt-get install chromium`) and `node` is on PATH; playwright-core is installed on first use with npm into
`.cache/web-browser`. No browser is downloaded. See docs/COMFYUI_TESTS.md.
"""
from __future__ import annotations

import os

import pytest

import browser_harness as browser
import comfyui_harness as harness

TITLES = browser.template_titles()
AB_TITLES = [t for t in TITLES if "LTX25DecoderCompare" in browser.template_classes(t)]
# Boxes touching by less than this (graph units) do not overlap: LiteGraph rounds sizes to fractions of a pixel.
TOUCH = 0.5


@pytest.fixture(scope="module")
def page_run(tmp_path_factory) -> dict:
    """Every template opened and run from one page; the driver's findings."""
    harness.comfyui_path()  # skips when COMFYUI_PATH is unset
    try:
        tools = browser.browser_tools()
    except browser.Unavailable as missing:
        pytest.skip(str(missing))
    assert TITLES, "no UI template in workflows/"
    return browser.run_templates(str(tmp_path_factory.mktemp("web_browser")), TITLES, tools)


def template(page_run: dict, title: str) -> dict:
    entry = page_run["templates"][title]
    if "error" in entry:
        pytest.fail(f"{title}: {entry['error']}\n{page_run['log_tail']}")
    return entry


def overlap(a: list[float], b: list[float]) -> float:
    """Area two [x, y, w, h] boxes share beyond a touch."""
    dx = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    dy = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    return dx * dy if dx > TOUCH and dy > TOUCH else 0.0


def inside(inner: list[float], outer: list[float]) -> bool:
    return (inner[0] >= outer[0] - TOUCH and inner[1] >= outer[1] - TOUCH
            and inner[0] + inner[2] <= outer[0] + outer[2] + TOUCH
            and inner[1] + inner[3] <= outer[1] + outer[3] + TOUCH)


def union(boxes: list[list[float]]) -> list[float]:
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    return [x0, y0, max(b[0] + b[2] for b in boxes) - x0, max(b[1] + b[3] for b in boxes) - y0]


def jpeg_width(title: str) -> int:
    """The width in a JPEG's start-of-frame header."""
    with open(os.path.join(harness.PACK_ROOT, "workflows", f"{title}.jpg"), "rb") as f:
        data = f.read()
    i = 2
    while i < len(data):
        marker, length = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            return int.from_bytes(data[i + 7:i + 9], "big")
        i += 2 + length
    raise ValueError(f"{title}.jpg has no frame header")


def name(node: dict) -> str:
    return f"{node['id']} {node['type']} {node['title']!r}"


@pytest.mark.parametrize("title", TITLES)
def test_extension_loads_and_every_template_runs_from_the_page(page_run, title):
    """The frontend imports web/ltx25_ab_viewer.js, every node of the template is known, and the run queued from
    the page succeeds with every output node executed. If this fails, the extension or the template is broken
    for a person opening ComfyUI."""
    entry = template(page_run, title)
    run = entry["run"]
    assert page_run["extension_loaded"], page_run
    assert run["missing_types"] == [], run["missing_types"]
    assert run["status"]["status"] == "success" and not run["node_errors"], run
    assert set(run["output_ids"]) <= set(run["executed_nodes"]), run
    # only errors raised in the pack's extension count: the frontend logs its own on a fresh user
    ours = [e for e in page_run["page_errors"] if f"/extensions/{harness.PACK_FOLDER}/" in e]
    assert not ours, ours


@pytest.mark.parametrize("title", TITLES)
def test_template_opens_whole_and_in_full_detail(page_run, title):
    """Opened from the template browser, every node, notes included, is on screen, clear of the side bar, the tabs
    and the minimap, at a zoom where the frontend draws widgets and text (not its low-quality boxes). Fails when a
    template opens with a note above the screen's top or zoomed out to unreadable boxes."""
    opened = template(page_run, title)["opened"]
    assert not opened["low_quality"], f"opens at zoom {opened['ds']['scale']}: nodes drawn without their widgets"
    width, height = opened["viewport"]
    left = max([r[0] + r[2] for r in opened["side_bar"]], default=0)
    top = max([r[1] + r[3] for r in opened["tabs"]], default=0)
    free = [left, top, width - left, height - top]
    off = [f"{n['id']} {n['title']!r} {[round(v) for v in n['box']]}" for n in opened["screen"]
           if not inside(n["box"], free)]
    assert not off, f"off screen (free area {free}, zoom {opened['ds']['scale']}): {off}"
    if opened["minimap"]:
        hidden = [f"{n['id']} {n['title']!r}" for n in opened["screen"] if overlap(n["box"], opened["minimap"])]
        assert not hidden, f"under the minimap {opened['minimap']}: {hidden}"


@pytest.mark.parametrize("title", TITLES)
def test_no_two_nodes_overlap_after_a_run(page_run, title):
    """After a run no two nodes' boxes overlap (title bar, body, and every DOM widget or preview it shows), no
    DOM widget reaches outside its own node, and no Note lies over a node's widgets. If this fails, something grew
    over a neighbour: decode figures over Audio Decode, the compare viewer over the saves, a note over widgets."""
    nodes = template(page_run, title)["nodes"]
    # what grows must have grown, or the check below proves nothing
    grown = browser.GROWN
    bare = [name(n) for n in nodes if n["type"] in grown and not any(grown[n["type"]] in d["name"] for d in n["dom"])]
    assert not bare, f"shows nothing of its run: {bare}"
    outside = [f"{name(n)}: {d['name']} {[round(v) for v in d['box']]} outside {[round(v) for v in n['box']]}"
               for n in nodes for d in n["dom"] if not inside(d["box"], n["box"])]
    boxes = {n["id"]: union([n["box"], *(d["box"] for d in n["dom"])]) for n in nodes}
    clashes = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            shared = overlap(boxes[a["id"]], boxes[b["id"]])
            if shared:
                what = "a Note covers" if "Note" in (a["type"], b["type"]) else "overlap"
                clashes.append(f"{what}: {name(a)} {[round(v) for v in boxes[a['id']]]} and {name(b)} "
                               f"{[round(v) for v in boxes[b['id']]]} ({shared:.0f} px²)")
    assert not outside and not clashes, "\n".join(outside + clashes)


@pytest.mark.parametrize("title", TITLES)
def test_every_node_stays_inside_its_group_after_a_run(page_run, title):
    """Each node, grown by its run, still lies inside one of the template's phase groups, so the groups have the
    room the nodes need and moving a group moves its nodes. Fails when a group was laid out too small."""
    entry = template(page_run, title)
    groups = [g["box"] for g in entry["groups"]]
    assert groups, "the template has no groups"
    loose = [f"{name(n)} {[round(v) for v in n['box']]}" for n in entry["nodes"]
             if not any(inside(union([n["box"], *(d["box"] for d in n["dom"])]), g) for g in groups)]
    assert not loose, f"outside every group {[[round(v) for v in g] for g in groups]}: {loose}"


@pytest.mark.parametrize("title", TITLES)
def test_template_card_shows_its_title_and_thumbnail(page_run, title):
    """The template browser's card shows the template's title uncut and its thumbnail (`<title>.jpg` beside the
    template, as wide as the committed file; the frontend's placeholder is 224 px). Fails on a 404 thumbnail or a
    title too long for the card."""
    assert "cards_error" not in page_run, page_run.get("cards_error")
    cards = {c["testid"]: c for c in page_run["cards"]}
    card = cards.get(f"template-workflow-{title}")
    assert card, f"no card for {title!r}: {sorted(cards)}"
    assert card["title"] == title and not card["title_cut"], card
    route = f"/api/workflow_templates/{harness.PACK_FOLDER}/{title}.jpg"
    assert page_run["thumbnails"].get(route) == 200, f"{route}: {page_run['thumbnails']}"
    assert card["thumbnail"] and card["thumbnail"]["width"] == jpeg_width(title), card


@pytest.mark.parametrize("title", AB_TITLES)
def test_viewer_is_not_covered_before_anything_is_clicked(page_run, title):
    """Right after the run, at the view the template opened with and before any click, every part of the A/B viewer
    is the viewer (no video preview of a save drawn over it). Fails when a neighbour's DOM preview lies on top."""
    entry = template(page_run, title)
    assert entry["viewer_covered"] == [], entry["viewer_covered"]
    assert entry["viewer"]["covered_at_zoom_1"] == [], entry["viewer"]["covered_at_zoom_1"]


@pytest.mark.parametrize("title", AB_TITLES)
def test_viewer_draws_frames_and_shows_the_report_table(page_run, title):
    """After the run the compare node holds the viewer: frames painted on its canvas, and the table with PSNR,
    SSIM, time and peak memory. If this fails, the A/B shows nothing or no figures."""
    viewer = template(page_run, title)["viewer"]
    assert viewer["before"]["painted_fraction"] > 0.2, viewer["before"]
    labels = [row[0] for row in viewer["table_rows"]]
    for label in ("PSNR, mean (B vs A)", "SSIM, mean (B vs A)", "time", "peak memory"):
        assert label in labels, f"{label!r} missing from {labels}"
    time_row = next(row for row in viewer["table_rows"] if row[0] == "time")
    assert all(cell != "—" for cell in time_row[1:]), f"a decoder has no time: {time_row}"


@pytest.mark.parametrize("title", AB_TITLES)
def test_wipe_follows_the_drag(page_run, title):
    """Dragging the wipe left then right moves the split and the handle with the pointer. If this fails, the
    viewer is a still picture and A/B cannot be judged."""
    viewer = template(page_run, title)["viewer"]
    before, left, right = viewer["before"], viewer["after_left"], viewer["after_right"]
    assert left["split"] < before["split"] - 0.1, (before, left)
    assert left["handle_x"] < before["handle_x"] - 10, (before, left)
    assert right["split"] > before["split"] + 0.1, (before, right)
    assert right["handle_x"] > left["handle_x"] + 20, (left, right)
    assert os.path.getsize(viewer["screenshot"]) > 0


@pytest.mark.parametrize("title", AB_TITLES)
def test_scrubber_steps_to_the_next_frame(page_run, title):
    """One ArrowRight on the scrubber shows frame 2 (when there is more than one frame). If this fails, only the
    first frame of the A/B can ever be seen."""
    viewer = template(page_run, title)["viewer"]
    if viewer["scrub_max"] < 1:
        pytest.skip(f"the template decodes a single frame ({viewer['before']['caption']})")
    assert viewer["before"]["caption"].startswith("frame 1 /"), viewer["before"]
    assert viewer["after_scrub"]["caption"].startswith("frame 2 /"), viewer["after_scrub"]


@pytest.mark.parametrize("title", AB_TITLES)
def test_decode_nodes_show_their_figures_and_their_path(page_run, title):
    """Both decode nodes show the last run's time, peak memory, processor and tiles; each path has its own colour
    and badge; the panel stays out of the saved widget values. If this fails, the two decoder paths look alike
    or their costs are invisible."""
    by_class = {d["comfy_class"]: d for d in template(page_run, title)["viewer"]["decoders"]}
    assert set(by_class) == {"LTX25ConvVAEDecode", "LTX25DiffusionVAEDecode"}, list(by_class)
    for d in by_class.values():
        assert d["panel"] and all(k in d["panel"] for k in ("time", "peak memory", "processor", "tiles")), d
        assert not d["panel_serializes"], d
    conv, diffusion = by_class["LTX25ConvVAEDecode"], by_class["LTX25DiffusionVAEDecode"]
    assert conv["bgcolor"] != diffusion["bgcolor"], (conv, diffusion)
    assert "conv VAE" in conv["badges"] and "diffusion VAE" in diffusion["badges"], (conv, diffusion)


@pytest.mark.parametrize("title", TITLES)
def test_bypassing_stage_2_in_the_frontend_passes_each_latent_through(page_run, title):
    """The real frontend's prompt with 'Upsample x2' and 'Stage 2' bypassed (the templates' two_stage note): what
    read stage 2's video and audio latents reads stage 1's, and the headless runner's `ui_to_api` resolves the same
    links. Fails with the samplers' latents after `model` and `conditioning`: both then came from the video latent."""
    from nodes.tools import workflow_specs
    from nodes.tools.graph import ui_to_api
    entry = template(page_run, title)["bypass"]
    before, after = entry["before"], entry["after"]
    assert entry["bypassed"] == ["11", "12"] and not {"11", "12"} & set(after)
    rewired = 0
    for node_id, node in before.items():
        for name, value in node["inputs"].items():
            if isinstance(value, list) and value[0] == "12":
                assert after[node_id]["inputs"][name] == ["10", value[1]], (node_id, name, after[node_id])
                rewired += 1
    assert rewired >= 2
    workflow = harness.load_json(os.path.join(harness.PACK_ROOT, "workflows", f"{title}.json"))
    for node in workflow["nodes"]:
        if node["id"] in (11, 12):
            node["mode"] = 4
    ours = ui_to_api(workflow, workflow_specs.CLASSES)
    links = lambda prompt: {(i, n): v for i, node in prompt.items() for n, v in node["inputs"].items()  # noqa: E731
                            if isinstance(v, list)}
    assert links(ours) == links(after)
