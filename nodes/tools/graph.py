"""Workflow graphs without ComfyUI: UI-format (v0.4) → API-format conversion, ComfyUI-like validation, and
dependency order. Used by the headless runner and the tests; inside ComfyUI the real executor does this.

API format: `{node_id: {"class_type": str, "inputs": {name: value | [source_id, output_index]}, "_meta": {...}}}`.
"""
from __future__ import annotations

import inspect
from typing import Any, Collection, Mapping

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")


class GraphError(ValueError):
    """A graph ComfyUI would refuse: names the node, its class and the input."""

    def __init__(self, node_id: str, class_type: str, input_name: str | None, message: str) -> None:
        where = f"node {node_id} ({class_type})" + (f" input {input_name!r}" if input_name else "")
        super().__init__(f"{where}: {message}")
        self.node_id, self.class_type, self.input_name = node_id, class_type, input_name


def input_specs(node_class: type) -> dict[str, tuple[Any, dict, bool]]:
    """name → (type or combo list, options, required) in INPUT_TYPES order (required first)."""
    types = node_class.INPUT_TYPES()
    specs = {}
    for section, required in (("required", True), ("optional", False)):
        for name, spec in types.get(section, {}).items():
            specs[name] = (spec[0], spec[1] if len(spec) > 1 else {}, required)
    return specs


def is_widget(kind: Any) -> bool:
    return isinstance(kind, list) or kind in WIDGET_TYPES


def has_control_value(name: str, kind: Any, options: Mapping[str, Any]) -> bool:
    """Whether the canvas saves a "control after generate" value after this widget: asked for by the option, and
    given by the frontend to any INT named seed/noise_seed that does not set the option to False."""
    return bool(options.get("control_after_generate", kind == "INT" and name in ("seed", "noise_seed")))


def ui_to_api(workflow: Mapping[str, Any], classes: Mapping[str, type]) -> dict[str, dict]:
    """Convert a UI workflow (what the canvas saves) to the API prompt the canvas would queue.

    Widgets map positionally onto the widget inputs in INPUT_TYPES order; the UI-only value that follows a
    `control_after_generate` INT (e.g. "fixed") is skipped; a widget fed by a link keeps a saved value, which the
    link overrides (as the canvas saves it); links become [source_id, slot], followed through bypassed (mode 4)
    nodes as the canvas does (`_bypassed_source`); muted (mode 2) nodes and notes are left out, and so is an input
    whose value would come from a muted node.
    """
    links = {link[0]: link for link in workflow.get("links", [])}
    nodes = {str(node["id"]): node for node in workflow["nodes"]}
    prompt: dict[str, dict] = {}
    for node in workflow["nodes"]:
        class_type = node["type"]
        if node.get("mode", 0) in (2, 4) or class_type in ("Note", "MarkdownNote"):
            continue
        node_id = str(node["id"])
        if class_type not in classes:
            raise GraphError(node_id, class_type, None, "unknown node class (is the pack installed?)")
        inputs: dict[str, Any] = {}
        slots = {i["name"]: i for i in node.get("inputs", [])}
        values = list(node.get("widgets_values", []))
        for name, (kind, options, _required) in input_specs(classes[class_type]).items():
            if is_widget(kind) and values:
                inputs[name] = values.pop(0)
                if has_control_value(name, kind, options) and values and values[0] in ("fixed", "randomize", "increment", "decrement"):
                    values.pop(0)
            link = slots.get(name, {}).get("link")
            if link is not None:
                source = _bypassed_source(links[link], slots[name].get("type", "*"), nodes, links)
                if isinstance(source, list):
                    inputs[name] = source
                elif source is MUTED or not is_widget(kind):  # the canvas drops an input fed by a muted node
                    inputs.pop(name, None)
        entry = {"class_type": class_type, "inputs": inputs}
        if node.get("title"):
            entry["_meta"] = {"title": node["title"]}
        prompt[node_id] = entry
    return prompt


MUTED = object()  # `_bypassed_source`: the value would come from a muted node


def _bypassed_source(link: list, target_type: str, nodes: Mapping[str, dict],
                     links: Mapping[int, list]) -> list | object | None:
    """[source id, slot] of `link` as ComfyUI's frontend resolves it (litegraph's ExecutableNodeDTO.resolveOutput):
    a bypassed node's output i comes from its input i when that input's type fits both the output and the target
    input, else from its first input of exactly the target's type, else from its first input that fits both;
    through any number of bypassed nodes. MUTED when the value would come from a muted node, None from a bypassed
    node's unlinked input (a widget then keeps its saved value, as on the canvas)."""
    seen: set[tuple[str, int]] = set()
    while True:
        origin, slot = str(link[1]), link[2]
        node = nodes.get(origin)
        if node is None or node.get("mode", 0) == 2:
            return MUTED
        if node.get("mode", 0) != 4:
            return [origin, slot]
        if (origin, slot) in seen:
            raise GraphError(origin, node["type"], None, "bypassed nodes feed each other in a loop")
        seen.add((origin, slot))
        inputs, outputs = node.get("inputs", []), node.get("outputs", [])
        output_type = outputs[slot]["type"] if slot < len(outputs) else link[5]
        fits = [_fits(i.get("type", "*"), output_type) and _fits(i.get("type", "*"), target_type) for i in inputs]
        if target_type in ("*", ""):
            index = slot if slot < len(inputs) else 0
        elif slot < len(inputs) and fits[slot]:
            index = slot
        else:
            index = next((k for k, i in enumerate(inputs) if i.get("type") == target_type),
                         next((k for k, ok in enumerate(fits) if ok), -1))
        if not 0 <= index < len(inputs) or inputs[index].get("link") is None:
            return None
        target_type = inputs[index].get("type", target_type)  # the next hop matches the input taken, as the canvas
        link = links[inputs[index]["link"]]


def _fits(input_type: str, output_type: str) -> bool:
    """litegraph's isValidConnection: equal types, a wildcard, or comma-separated lists that share a type."""
    if input_type in ("*", "") or output_type in ("*", "") or input_type == output_type:
        return True
    return bool(set(str(input_type).lower().split(",")) & set(str(output_type).lower().split(",")))


def check_classes(prompt: Mapping[str, dict], classes: Mapping[str, type]) -> None:
    """Raise GraphError for a node of an unknown class anywhere in the prompt (ComfyUI refuses such a prompt)."""
    for node_id, node in prompt.items():
        if node.get("class_type") not in classes:
            raise GraphError(node_id, str(node.get("class_type")), None, "unknown node class")


def validate(prompt: Mapping[str, dict], classes: Mapping[str, type], only: Collection[str] | None = None) -> None:
    """Raise GraphError for: unknown class, missing required input, dangling link, wrong link type, bad combo
    value, out-of-range number, wrong widget type, and what a node's own VALIDATE_INPUTS refuses. The inputs are
    checked for the nodes in `only` (default: all); ComfyUI's validate_prompt checks those of the nodes its outputs
    need, and runs a prompt whose unconnected nodes would not validate."""
    check_classes(prompt, classes)
    for node_id in (n for n in prompt if only is None or n in only):  # in the prompt's order, whatever `only` is
        node = prompt[node_id]
        class_type = node["class_type"]
        given = node.get("inputs", {})
        for name, (kind, options, required) in input_specs(classes[class_type]).items():
            if name not in given:
                if required:
                    raise GraphError(node_id, class_type, name, "required input missing")
                continue
            value = given[name]
            if is_link(value):
                _check_link(prompt, classes, node_id, class_type, name, kind, value)
            else:
                _check_widget(node_id, class_type, name, kind, options, value)
        _check_custom(node_id, class_type, classes[class_type], given)


def _check_custom(node_id: str, class_type: str, node_class: type, given: Mapping[str, Any]) -> None:
    """A node's own VALIDATE_INPUTS, called as ComfyUI's validate_prompt calls it when a prompt is queued: with the
    given inputs its signature names, a linked one as None (its value is unknown before the run); anything but
    True refuses the graph. (ComfyUI's `input_types` argument and **kwargs validators are not supported here.)"""
    validate_inputs = getattr(node_class, "VALIDATE_INPUTS", None)
    if validate_inputs is None:
        return
    names = [n for n in inspect.signature(validate_inputs).parameters if n in given]
    verdict = validate_inputs(**{n: None if is_link(given[n]) else given[n] for n in names})
    if verdict is not True:
        raise GraphError(node_id, class_type, names[0] if names else None,
                         verdict if isinstance(verdict, str) else "refused by the node's own checks")


def is_link(value: Any) -> bool:
    """An API-format input that links another node's output: [node_id, output_index]."""
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def _check_link(prompt, classes, node_id, class_type, name, kind, link) -> None:
    source_id, slot = link
    if source_id not in prompt:
        raise GraphError(node_id, class_type, name, f"linked to missing node {source_id}")
    source_class = classes[prompt[source_id]["class_type"]]
    outputs = source_class.RETURN_TYPES
    if not 0 <= slot < len(outputs):
        raise GraphError(node_id, class_type, name, f"linked to output {slot} of node {source_id}, which has {len(outputs)}")
    produced = outputs[slot]
    wanted = "COMBO" if isinstance(kind, list) else kind
    if produced != wanted and "*" not in (produced, wanted):
        raise GraphError(node_id, class_type, name, f"return type mismatch: node {source_id} gives {produced}, "
                                                    f"input takes {wanted}")


def _check_widget(node_id, class_type, name, kind, options, value) -> None:
    if isinstance(kind, list):
        if not kind:  # a list of files: empty when the node's folder holds none of them
            raise GraphError(node_id, class_type, name, f"value {value!r} cannot be picked: the list of choices is "
                             "empty (the node lists the files of a folder: a loader its models folder, Load Image, "
                             "Audio or Video the input folder, --input headless: is the file there?)")
        if value not in kind:
            shown = ", ".join(map(repr, kind[:8])) + (" …" if len(kind) > 8 else "")
            raise GraphError(node_id, class_type, name, f"value {value!r} not in the list [{shown}]")
        return
    python_types = {"INT": (int,), "FLOAT": (int, float), "STRING": (str,), "BOOLEAN": (bool,)}.get(kind)
    if python_types is None:
        raise GraphError(node_id, class_type, name, f"takes a link of type {kind}, got a constant {value!r}")
    if not isinstance(value, python_types) or (kind in ("INT", "FLOAT") and isinstance(value, bool)):
        raise GraphError(node_id, class_type, name, f"value {value!r} is not {kind}")
    if "min" in options and value < options["min"]:
        raise GraphError(node_id, class_type, name, f"value {value} below the minimum {options['min']}")
    if "max" in options and value > options["max"]:
        raise GraphError(node_id, class_type, name, f"value {value} above the maximum {options['max']}")


def execution_order(prompt: Mapping[str, dict]) -> list[str]:
    """Dependencies first; ties in node-id order (stable, like a user reads the graph)."""
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(node_id: str) -> None:
        if state.get(node_id) == 2:
            return
        if state.get(node_id) == 1:
            raise GraphError(node_id, prompt[node_id]["class_type"], None, "is part of a cycle")
        state[node_id] = 1
        for value in prompt[node_id].get("inputs", {}).values():
            if is_link(value):
                visit(value[0])
        state[node_id] = 2
        order.append(node_id)

    for node_id in sorted(prompt, key=lambda i: (len(i), i)):
        visit(node_id)
    return order
