"""A line of text for the user under the running node."""
from __future__ import annotations

import logging
import os
import sys

from .comfyui import HAS_COMFY

log = logging.getLogger("ltx25")


def show_on_node(text: str) -> None:
    """A line for the user under the running node (ComfyUI's progress text, where the version has it) and in the
    log; headless, on stderr."""
    log.info(text)
    if not HAS_COMFY:
        if os.environ.get("LTX25_QUIET") != "1":
            print(f"[ltx25] {text}", file=sys.stderr, flush=True)
        return
    try:  # both exist from ComfyUI 0.3.4x; older versions show the log line only
        from comfy_execution.utils import get_executing_context
        from server import PromptServer
    except ImportError:
        return
    context = get_executing_context()
    if context is not None and getattr(PromptServer, "instance", None) is not None:
        PromptServer.instance.send_progress_text(text, context.node_id)

