"""Headless runner: execute a workflow with the pack's node classes, no ComfyUI needed.

    python -m nodes.tools.run WORKFLOW.json --models DIR --out DIR [--set NODE.INPUT=VALUE ...]

WORKFLOW is API format or UI format (converted like the canvas does). Bad input (the workflow file, the
arguments, a node's inputs) is one `error:` line naming it and exit status 2, found before anything is computed
where it can be; progress goes to stderr; the UI outputs of output nodes are printed as JSON on stdout.
Ctrl-C (or SIGTERM) stops the run at the next interrupt check, as ComfyUI's cancel button does: the node being
computed stops at its next step, a save being written removes its partial file, and the run ends with status 130;
a second Ctrl-C stops at once. The A/B viewer's preview frames are deleted at the end: no viewer will show them.
It exists for tests and the demo — inside ComfyUI the real executor runs the same graphs.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from ..comfy import bridge as comfy_bridge
from ..comfy import previews
from ..registry import NODE_CLASS_MAPPINGS
from . import core_standins
from .graph import GraphError, check_classes, execution_order, input_specs, is_link, ui_to_api, validate
from ..ltx.errors import LTX25Error


def read_workflow(path: str, classes: Mapping[str, type] | None = None) -> tuple[dict[str, dict], dict | None]:
    """(API prompt, the UI workflow it came from or None): the canvas's workflow goes into the saved files. A file
    that is missing, not JSON, or not a workflow is an LTX25Error naming it."""
    expected = "a workflow JSON file (API format, or the canvas's UI format)"
    try:
        with open(path, encoding="utf-8") as f:
            workflow = json.load(f)
    except OSError as e:
        raise LTX25Error(path, "the workflow file", f"unreadable ({e.strerror or e})", expected) from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LTX25Error(path, "the workflow file", f"not JSON ({e})", expected) from e
    if isinstance(workflow, dict) and "nodes" in workflow and "links" in workflow:
        try:
            return ui_to_api(workflow, classes or NODE_CLASS_MAPPINGS), workflow
        except (KeyError, TypeError, IndexError, AttributeError) as e:  # GraphError (a known kind of bad) passes
            raise LTX25Error(path, "the UI workflow", f"malformed ({type(e).__name__}: {e})", expected) from e
    if not isinstance(workflow, dict) or not all(isinstance(node, dict) and "class_type" in node
                                                 for node in workflow.values()):
        raise LTX25Error(path, "the workflow file", "JSON but not a workflow", expected + ": {node id: "
                         "{class_type, inputs}} or {nodes, links, …}")
    return workflow, None


def load_prompt(path: str, classes: Mapping[str, type] | None = None) -> dict[str, dict]:
    return read_workflow(path, classes)[0]


def apply_overrides(prompt: dict[str, dict], overrides: list[str], classes: Mapping[str, type] | None = None) -> None:
    """`NODE.INPUT=VALUE`; VALUE is JSON when it parses (numbers, true, lists), else a plain string; for a text
    input (STRING, or a list of names) it is the text as given (`prompt=2024`, `video_stg_blocks=5`), a JSON string
    (`"5"`) unquoted, so a text input cannot be given a link this way. INPUT must be one of the node class's inputs
    (a typo would otherwise reach the node as an unexpected argument)."""
    classes = classes or NODE_CLASS_MAPPINGS
    for item in overrides:
        target, sep, raw = item.partition("=")
        node_id, dot, name = target.partition(".")
        if not sep or not dot or node_id not in prompt:
            raise GraphError(node_id, prompt.get(node_id, {}).get("class_type", "?"), name or None,
                             f"cannot apply --set {item!r} (expected NODE.INPUT=VALUE for an existing node)")
        class_type = prompt[node_id].get("class_type")
        specs = input_specs(classes[class_type]) if class_type in classes else None
        if specs is not None and name not in specs:
            raise GraphError(node_id, class_type, name, f"cannot apply --set {item!r}: {class_type} has no such "
                             f"input (it has {', '.join(specs)})")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        kind = specs[name][0] if specs is not None else None
        if (kind == "STRING" or isinstance(kind, (list, tuple))) and not isinstance(value, str):
            value = raw
        prompt[node_id]["inputs"][name] = value


def is_async(node_class: type) -> bool:
    """A node whose FUNCTION is a coroutine; ComfyUI's executor (0.3.4x+) runs those as tasks, others in line."""
    return inspect.iscoroutinefunction(getattr(node_class, node_class.FUNCTION))


def is_output(node_class: type) -> bool:
    """An output node (OUTPUT_NODE): what a run executes, with what it depends on."""
    return bool(getattr(node_class, "OUTPUT_NODE", False))


def _sources(node: Mapping[str, Any]) -> set[str]:
    return {value[0] for value in node.get("inputs", {}).values() if is_link(value)}


def _pick(ready: list[str], prompt: Mapping[str, dict], classes: Mapping[str, type]) -> str:
    """ComfyUI's rule among ready nodes (`ux_friendly_pick_node`): an output or async node first, then a node an
    output node waits on, then one two steps before an output node, else the first in dependency order."""
    def class_of(node_id: str) -> type:
        return classes[prompt[node_id]["class_type"]]

    outputs = {o for o in prompt if is_output(class_of(o))}
    for node_id in ready:
        if is_output(class_of(node_id)) or is_async(class_of(node_id)):
            return node_id
    feeds_output = {source for o in outputs for source in _sources(prompt[o])}
    for node_id in ready:
        if node_id in feeds_output:
            return node_id
    for node_id in ready:
        if any(node_id in _sources(prompt[n]) for n in feeds_output):
            return node_id
    return ready[0]


def needed(prompt: Mapping[str, dict], classes: Mapping[str, type], targets: Iterable[str] | None = None) -> set[str]:
    """The nodes a run executes: `targets` (default: the output nodes, as ComfyUI) and every node they depend on."""
    if targets is None:
        targets = [n for n, node in prompt.items() if is_output(classes[node["class_type"]])]
        if not targets:
            raise GraphError("-", "prompt", None, "has no output node (ComfyUI refuses such a prompt)")
    seen: set[str] = set()
    stack = list(targets)
    while stack:
        node_id = stack.pop()
        if node_id not in seen and node_id in prompt:  # a link to a missing node is `validate`'s to name
            seen.add(node_id)
            stack.extend(_sources(prompt[node_id]))
    return seen


def execute(prompt: Mapping[str, dict], classes: Mapping[str, type] | None = None,
            preset: Mapping[str, tuple] | None = None, on_start: Callable[[str], None] | None = None,
            on_end: Callable[[str, Any, float], None] | None = None,
            targets: Iterable[str] | None = None, extra_pnginfo: dict | None = None) -> dict[str, Any]:
    """Validate, then run the nodes inside inference mode the way ComfyUI's executor does: the output nodes (or
    `targets`) and what they depend on (only their inputs are validated, as ComfyUI's; a node of an unknown class
    anywhere is refused), one at a time in dependency order, ready async/output nodes first, async
    nodes (the saves) as tasks that run on while later nodes go on. `preset` gives outputs of nodes not to run (a
    benchmark's prebuilt loaders); `on_start(node_id)` and `on_end(node_id, raw result, seconds)` watch each node
    (an async node ends when the runner collects its finished task: the event loop, like ComfyUI's, resumes it
    only between plain nodes, so its seconds may include the end of the plain node that ran beside it). Nodes get
    the hidden inputs they declare as in ComfyUI: PROMPT (this `prompt`, the same dict for every node), EXTRA_PNGINFO
    (`extra_pnginfo`: {"workflow": the UI workflow} when there is one), UNIQUE_ID.
    Returns {"outputs": {node_id: output tuple}, "ui": {node_id: ui dict}, "seconds": {node_id: s}, "wall_s": s}."""
    classes = classes or NODE_CLASS_MAPPINGS
    check_classes(prompt, classes)
    run_ids = needed(prompt, classes, targets)
    validate(prompt, classes, only=run_ids)
    start = time.perf_counter()

    def run() -> dict[str, Any]:
        with torch.inference_mode(), comfy_bridge.interrupt_scope(), _stop_on_ctrl_c():
            return asyncio.run(_execute(prompt, classes, dict(preset or {}), on_start, on_end, run_ids,
                                        extra_pnginfo))

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no event loop in this thread
        result = run()
    else:  # called from async code (a notebook, an async test): the graph gets a loop of its own on a thread
        with ThreadPoolExecutor(max_workers=1) as pool:
            result = pool.submit(run).result()
    result["wall_s"] = time.perf_counter() - start
    return result


def _hidden(node_class: type, node_id: str, prompt: Mapping[str, dict], extra_pnginfo: dict | None) -> dict:
    """The hidden inputs `node_class` declares, with the values ComfyUI's executor gives them."""
    values = {"PROMPT": prompt, "EXTRA_PNGINFO": extra_pnginfo, "UNIQUE_ID": node_id}
    declared = node_class.INPUT_TYPES().get("hidden", {})
    return {name: values[kind] for name, kind in declared.items() if kind in values}


async def _execute(prompt, classes, preset, on_start, on_end, run: set[str], extra_pnginfo) -> dict[str, Any]:
    outputs: dict[str, tuple] = dict(preset)
    ui: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    waiting = [n for n in execution_order({n: prompt[n] for n in run}) if n not in preset]
    running: dict[asyncio.Task, tuple[str, float]] = {}

    def finish(node_id: str, result: Any, started: float, ended: float) -> None:
        seconds[node_id] = ended - started
        if on_end is not None:
            on_end(node_id, result, seconds[node_id])
        if isinstance(result, dict):
            ui[node_id] = result.get("ui", {})
            result = result.get("result", ())
        outputs[node_id] = tuple(result)

    async def harvest(block: bool) -> None:
        if not running:
            return
        done, _ = await asyncio.wait(running, timeout=None if block else 0, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            node_id, started = running.pop(task)
            try:
                finish(node_id, task.result(), started, time.perf_counter())
            except BaseException as error:
                for other in running:  # the graph stops at its first failure, as ComfyUI's does
                    other.cancel()
                stopped = isinstance(error, (KeyboardInterrupt, asyncio.CancelledError, comfy_bridge.InterruptError))
                print(f"[run] {node_id} {'stopped' if stopped else 'failed'}", file=sys.stderr, flush=True)
                raise

    while waiting or running:
        await harvest(block=False)
        ready = [n for n in waiting if _sources(prompt[n]) <= outputs.keys()]
        if not ready:
            await harvest(block=True)
            continue
        node_id = _pick(ready, prompt, classes)
        waiting.remove(node_id)
        node, cls = prompt[node_id], classes[prompt[node_id]["class_type"]]
        kwargs = {name: outputs[value[0]][value[1]] if is_link(value) else value
                  for name, value in node["inputs"].items()} | _hidden(cls, node_id, prompt, extra_pnginfo)
        print(f"[run] {node_id} {node.get('_meta', {}).get('title', node['class_type'])}", file=sys.stderr, flush=True)
        comfy_bridge.check_interrupt()  # before each node, as ComfyUI's executor (nodes.before_node_execution)
        if on_start is not None:
            on_start(node_id)
        started = time.perf_counter()
        call = getattr(cls(), cls.FUNCTION)(**kwargs)
        if inspect.iscoroutine(call):
            running[asyncio.ensure_future(call)] = (node_id, started)
            await asyncio.sleep(0)  # let it start (as ComfyUI does) before the next node takes the thread
        else:
            finish(node_id, call, started, time.perf_counter())
    return {"outputs": outputs, "ui": ui, "seconds": seconds}


_stops_requested: int | None = None  # Ctrl-C / SIGTERM received during the current run; None: no run


def request_stop(signum: int | None = None, frame: object = None) -> None:
    """Ctrl-C or SIGTERM: during a run the first asks it to stop at its next interrupt check (the bridge's, as
    ComfyUI's cancel button: a sampler between steps, a decode between tiles, a save between frames, the runner
    before each node); a second, or one outside a run, stops at once (KeyboardInterrupt). Left to asyncio, Ctrl-C
    only cancelled the run at its next await, after all the compute before the next async node."""
    global _stops_requested
    if _stops_requested is None or _stops_requested >= 1:
        raise KeyboardInterrupt
    _stops_requested += 1
    print("[run] stopping at the next step (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
    comfy_bridge.request_interrupt()


@contextlib.contextmanager
def _stop_on_ctrl_c() -> Iterator[None]:
    """`request_stop` handles Ctrl-C for the run (on the main thread, where signals arrive, unless SIGINT is
    ignored, as in a background job)."""
    global _stops_requested
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    if on_main and previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, request_stop)
    _stops_requested = 0
    try:
        yield
    finally:
        _stops_requested = None
        if on_main and previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)


def check_folders(models: str, out: str) -> None:
    """Before anything runs: `--models` is a folder, and `--out` is one this process can write to (created if
    missing) — found only at the first save, after all the compute, it wasted the run."""
    if not os.path.isdir(models):
        found = "a file, not a folder" if os.path.exists(models) else "missing"
        raise LTX25Error("--models", "the models folder", f"{models!r} ({found})",
                         "a ComfyUI-style models folder (diffusion_models/, text_encoders/, vae/, …)",
                         "Point --models at the folder that holds them (make demo writes the tiny set to "
                         ".cache/tiny-models).")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise LTX25Error("--out", "the output folder", f"{out!r}, which cannot be written ({e.strerror or e})",
                         "a folder this user can create files in", "Pick another --out.") from e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.tools.run", description=__doc__.splitlines()[0])
    parser.add_argument("workflow")
    parser.add_argument("--models", required=True, help="ComfyUI-style models folder")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--input", default=None, help="folder Load Image / Load Audio read (default ./input)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NODE.INPUT=VALUE")
    parser.add_argument("--vram-budget-gb", type=float, default=None,
                        help="device memory the models may use (default: what is free); what does not fit streams")
    args = parser.parse_args(argv)
    on_sigterm = signal.signal(signal.SIGTERM, request_stop)
    try:
        check_folders(args.models, args.out)
        if args.input:
            core_standins.set_input_dir(args.input)
        classes = {**core_standins.CLASSES, **NODE_CLASS_MAPPINGS}  # core loaders the templates start from
        prompt, workflow = read_workflow(args.workflow, classes)
        apply_overrides(prompt, args.overrides, classes)
        comfy_bridge.set_models_dir(args.models)
        comfy_bridge.set_output_dir(args.out)
        comfy_bridge.set_vram_budget_gb(args.vram_budget_gb)
        with previews.removed_afterwards():
            result = execute(prompt, classes, extra_pnginfo={"workflow": workflow} if workflow is not None else None)
    except (GraphError, LTX25Error) as e:  # the failing node: the last "[run]" line above, or "[run] N failed"
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, comfy_bridge.InterruptError):
        print("[run] stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, on_sigterm)
    summary = {"ui": result["ui"], "seconds": result["seconds"], "wall_s": result["wall_s"]}
    print(json.dumps(summary, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
