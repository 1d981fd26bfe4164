"""Headless runner: execute a workflow with the pack's node classes, no ComfyUI needed.

    python -m nodes.run WORKFLOW.json --models DIR --out DIR [--set NODE.INPUT=VALUE ...]

WORKFLOW is API format or UI format (converted like the canvas does). Validation errors name the node and input
and exit with status 2; progress goes to stderr; the UI outputs of output nodes are printed as JSON on stdout.
It exists for tests and the demo — inside ComfyUI the real executor runs the same graphs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Mapping

import torch

from . import NODE_CLASS_MAPPINGS, comfy_bridge
from .graph import GraphError, execution_order, ui_to_api, validate
from .ltx.errors import LTX25Error


def load_prompt(path: str, classes: Mapping[str, type] | None = None) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        workflow = json.load(f)
    return ui_to_api(workflow, classes or NODE_CLASS_MAPPINGS) if "nodes" in workflow and "links" in workflow else workflow


def apply_overrides(prompt: dict[str, dict], overrides: list[str]) -> None:
    """`NODE.INPUT=VALUE`; VALUE is JSON when it parses (numbers, true, lists), else a plain string."""
    for item in overrides:
        target, sep, raw = item.partition("=")
        node_id, dot, name = target.partition(".")
        if not sep or not dot or node_id not in prompt:
            raise GraphError(node_id, prompt.get(node_id, {}).get("class_type", "?"), name or None,
                             f"cannot apply --set {item!r} (expected NODE.INPUT=VALUE for an existing node)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        prompt[node_id]["inputs"][name] = value


def execute(prompt: Mapping[str, dict], classes: Mapping[str, type] | None = None) -> dict[str, Any]:
    """Validate, then run every node in dependency order inside inference mode (as ComfyUI's executor does).
    Returns {"outputs": {node_id: raw output tuple}, "ui": {node_id: ui dict}, "seconds": {node_id: s}}."""
    classes = classes or NODE_CLASS_MAPPINGS
    validate(prompt, classes)
    outputs: dict[str, tuple] = {}
    ui: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    with torch.inference_mode():
        for node_id in execution_order(prompt):
            node = prompt[node_id]
            cls = classes[node["class_type"]]
            kwargs = {name: outputs[value[0]][value[1]]
                      if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) else value
                      for name, value in node["inputs"].items()}
            title = node.get("_meta", {}).get("title", node["class_type"])
            print(f"[run] {node_id} {title}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            result = getattr(cls(), cls.FUNCTION)(**kwargs)
            seconds[node_id] = time.perf_counter() - start
            if isinstance(result, dict):
                ui[node_id] = result.get("ui", {})
                result = result.get("result", ())
            outputs[node_id] = tuple(result)
    return {"outputs": outputs, "ui": ui, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.run", description=__doc__.splitlines()[0])
    parser.add_argument("workflow")
    parser.add_argument("--models", required=True, help="ComfyUI-style models folder")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NODE.INPUT=VALUE")
    args = parser.parse_args(argv)
    comfy_bridge.set_models_dir(args.models)
    comfy_bridge.set_output_dir(args.out)
    try:
        prompt = load_prompt(args.workflow)
        apply_overrides(prompt, args.overrides)
        result = execute(prompt)
    except (GraphError, LTX25Error) as e:  # the node that failed is the last "[run]" line above
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"ui": result["ui"], "seconds": result["seconds"]}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
