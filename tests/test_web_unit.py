"""The canvas extension's pure JS, run by node's built-in test runner, and its reading of the Python reports."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from nodes.ltx.decode.stats import DecodeStats
from nodes.ltx.decode.compare import compare_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEB = os.path.join(ROOT, "web")
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node (Node.js >= 20) is not on PATH: the web unit tests need it")


def run_js(body: str, payload: object) -> object:
    """Run an ES module snippet in web/ with `payload` parsed from stdin as `data`; it prints one JSON value."""
    script = "import { readFileSync } from 'node:fs';\nconst data = JSON.parse(readFileSync(0, 'utf8'));\n" + body
    done = subprocess.run([NODE, "--input-type=module", "-e", script], cwd=WEB, input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_node
def test_web_unit_tests_pass():
    """`node --test web/tests/` passes: the report formatting, wipe geometry and frame scrubber the viewer draws
    with. If this fails, the viewer shows wrong figures or a wipe that does not line up."""
    done = subprocess.run([NODE, "--test", "web/tests/"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    summary = [line for line in done.stdout.splitlines() if line.startswith(("# pass", "# fail", "not ok"))]
    assert done.returncode == 0, f"{summary}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert any(line.startswith("# pass") and int(line.split()[-1]) > 0 for line in summary), summary


@needs_node
def test_report_table_reads_the_python_compare_report():
    """The JS table reads the exact report `compare_report` writes (label-keyed decoders, "inf" PSNR, GiB).
    If a key is renamed on either side, the table shows dashes instead of figures and this fails."""
    a = torch.rand(2, 16, 24, 3, generator=torch.Generator().manual_seed(0))
    conv = DecodeStats("conv", 0.25, 3 * 2**30, 2, ((9, 16, 16), (9, 16, 8)))
    diffusion = DecodeStats("diffusion", 4.5, 2**29, 3, (), processor="natten", steps=4)  # count without sizes
    report = compare_report(a, a.clone(), ("conv VAE", "diffusion VAE"), {"a": conv, "b": diffusion})
    table = run_js("import { reportTable } from './lib/format.js';\n"
                   "console.log(JSON.stringify(reportTable(data, 'conv VAE', 'diffusion VAE')));", report)
    rows = {row[0]: row[1:] for row in table["rows"]}
    assert rows["PSNR, mean (B vs A)"] == ["∞ dB (identical)"], rows
    assert rows["SSIM, mean (B vs A)"] == ["1.0000"], rows
    assert rows["decoder"] == ["conv", "diffusion"], rows
    assert rows["time"] == ["250 ms", "4.50 s"], rows
    assert rows["peak memory"] == ["3.00 GiB", "512.0 MiB"], rows
    assert rows["processor"] == ["—", "natten"], rows
    assert rows["tiles"] == ["2 tiles: 1 × 9×16×16, 1 × 9×16×8", "3 tiles"], rows


@needs_node
def test_decode_panel_reads_the_python_decode_stats():
    """The decode nodes' panel reads `DecodeStats.as_dict()` as the nodes emit it in `ui.ltx25_decode_stats`.
    If a field is renamed, the panel shows dashes and this fails."""
    stats = DecodeStats("diffusion", 12.345, 5 * 2**30, 4, ((9, 32, 32),) * 4, processor="natten", steps=3)
    script_rows = ("import { decodeStatsRows } from './lib/format.js';\n"
                   "console.log(JSON.stringify(Object.fromEntries(decodeStatsRows(data))));")
    rows = run_js(script_rows, stats.as_dict())
    assert rows == {"decoder": "diffusion", "time": "12.35 s", "peak memory": "5.00 GiB", "processor": "natten",
                    "steps": "3", "tiles (f×h×w)": "4 tiles: 4 × 9×32×32"}, rows
    # a decoder that records no sizes still shows its tile count, read from `tile_count`
    rows = run_js(script_rows, DecodeStats("conv", 0.5, 0, 3).as_dict())
    assert rows["tiles (f×h×w)"] == "3 tiles" and rows["peak memory"] == "0 (not measured)", rows
