"""Render the template browser's thumbnails, `workflows/<title>.jpg`, from the real canvas: ComfyUI with the pack and
the tiny set, each template opened and run from headless chromium (as tests/test_web_browser.py does), its groups
photographed after the run and scaled to 512 px wide.

    COMFYUI_PATH=/path/to/ComfyUI COMFYUI_PYTHON=/path/to/its/python \
        .venv/bin/python tests/render_thumbnails.py [TITLE …]

Run it after `python -m nodes.tools.workflow_specs` changes a template's layout (name the changed templates' titles
to leave the other thumbnails as they are); it needs what the browser test
needs (docs/COMFYUI_TESTS.md). The files are committed (each well under 60 KB).
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the harness modules beside this file
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the pack, for the tiny writers

import browser_harness as browser  # noqa: E402
import comfyui_harness as harness  # noqa: E402

MAX_BYTES = 60 * 1024


def main() -> int:
    if not os.environ.get(harness.ENV_PATH, "").strip():
        print(harness.SKIP_REASON, file=sys.stderr)
        return 2
    try:
        tools = browser.browser_tools()
    except browser.Unavailable as missing:
        print(missing, file=sys.stderr)
        return 2
    titles = sys.argv[1:] or browser.template_titles()
    unknown = sorted(set(titles) - set(browser.template_titles()))
    if unknown:
        print(f"no such template: {unknown}; the titles are {browser.template_titles()}", file=sys.stderr)
        return 2
    folder = os.path.join(harness.PACK_ROOT, "workflows")
    with tempfile.TemporaryDirectory(prefix="ltx25_thumbnails_") as work:
        result = browser.run_templates(work, titles, tools, thumbnails=folder)
    failed = {t: e["error"] for t, e in result["templates"].items() if "error" in e}
    for title in titles:
        path = os.path.join(folder, f"{title}.jpg")
        size = os.path.getsize(path) if os.path.exists(path) else 0
        print(f"{path}: {size} bytes" + (" (over 60 KB)" if size > MAX_BYTES else ""))
    for title, error in failed.items():
        print(f"{title}: {error}", file=sys.stderr)
    return 1 if failed or any(os.path.getsize(os.path.join(folder, f"{t}.jpg")) > MAX_BYTES for t in titles
                              if os.path.exists(os.path.join(folder, f"{t}.jpg"))) else 0


if __name__ == "__main__":
    sys.exit(main())
