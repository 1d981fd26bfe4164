"""The headless runner's graph handling: UI→API conversion, ComfyUI-like validation errors that name the node and
input, dependency order and execution — on small stand-in node classes so the rules are pinned without models."""
from __future__ import annotations

import json
import os

import pytest

from nodes.tools import run
from nodes.tools.graph import GraphError, execution_order, ui_to_api, validate


class MakeNumber:
    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1, "min": 0, "max": 10}),
                             "seed": ("INT", {"default": 0, "control_after_generate": True}),
                             "mode": (["add", "mul"],)}}

    def make(self, value, seed, mode):
        return (value + seed if mode == "add" else value * seed,)


class Show:
    RETURN_TYPES = ("STRING",)
    OUTPUT_NODE = True
    FUNCTION = "show"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",)}, "optional": {"suffix": ("STRING", {"default": ""})}}

    def show(self, number, suffix=""):
        return {"ui": {"text": [f"{number}{suffix}"]}, "result": (f"{number}{suffix}",)}


CLASSES = {"MakeNumber": MakeNumber, "Show": Show}

UI = {"version": 0.4, "last_node_id": 3, "last_link_id": 1, "links": [[1, 1, 0, 2, 0, "NUMBER"]], "nodes": [
    {"id": 1, "type": "MakeNumber", "mode": 0, "inputs": [], "outputs": [{"name": "NUMBER", "type": "NUMBER", "links": [1]}],
     "widgets_values": [3, 4, "fixed", "mul"], "title": "numbers"},
    {"id": 2, "type": "Show", "mode": 0, "inputs": [{"name": "number", "type": "NUMBER", "link": 1}],
     "widgets_values": ["!"]},
    {"id": 3, "type": "Note", "mode": 0, "widgets_values": ["a note for the user"]},
]}
API = {"1": {"class_type": "MakeNumber", "inputs": {"value": 3, "seed": 4, "mode": "mul"}, "_meta": {"title": "numbers"}},
       "2": {"class_type": "Show", "inputs": {"number": ["1", 0], "suffix": "!"}}}


def test_ui_to_api_maps_widgets_skips_control_values_and_notes():
    """The 'fixed' after a seed is UI-only; notes never reach the prompt."""
    assert ui_to_api(UI, CLASSES) == API


def test_runner_executes_in_dependency_order_and_collects_ui():
    result = run.execute(API, CLASSES)
    assert result["outputs"]["2"] == ("12!",) and result["ui"]["2"] == {"text": ["12!"]}
    assert execution_order({"b": API["2"] | {"inputs": {"number": ["a", 0]}}, "a": API["1"]}) == ["a", "b"]


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["1"].update(class_type="Nope"), "node 1 (Nope): unknown node class"),
    (lambda p: p["1"]["inputs"].pop("mode"), "node 1 (MakeNumber) input 'mode': required input missing"),
    (lambda p: p["1"]["inputs"].update(mode="div"), "input 'mode': value 'div' not in the list"),
    (lambda p: p["1"]["inputs"].update(value=11), "input 'value': value 11 above the maximum 10"),
    (lambda p: p["1"]["inputs"].update(value="3"), "input 'value': value '3' is not INT"),
    (lambda p: p["2"]["inputs"].update(number=["9", 0]), "input 'number': linked to missing node 9"),
    (lambda p: p["2"]["inputs"].update(number=["2", 0]), "return type mismatch: node 2 gives STRING"),
    (lambda p: p["2"]["inputs"].update(number=5), "takes a link of type NUMBER"),
])
def test_validation_errors_name_node_and_input(mutate, message):
    prompt = json.loads(json.dumps(API))
    mutate(prompt)
    with pytest.raises(GraphError) as e:
        validate(prompt, CLASSES)
    assert message in str(e.value)


def test_cycle_is_refused():
    prompt = {"1": {"class_type": "Show", "inputs": {"number": ["2", 0]}},
              "2": {"class_type": "Show", "inputs": {"number": ["1", 0]}}}
    with pytest.raises(GraphError, match="cycle"):
        execution_order(prompt)


def test_cli_exits_nonzero_with_the_error_on_stderr(tmp_path, capsys, monkeypatch):
    from nodes.comfy import bridge
    monkeypatch.setattr(run, "NODE_CLASS_MAPPINGS", CLASSES)
    # run.main points the bridge at --models and --out: restored afterwards, or later tests lose the tiny set
    monkeypatch.setattr(bridge.folders, "_models_dir_override", bridge.folders._models_dir_override)
    monkeypatch.setattr(bridge.folders, "_output_dir_override", bridge.folders._output_dir_override)
    bad = json.loads(json.dumps(API))
    del bad["2"]["inputs"]["number"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert run.main([str(path), "--models", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "required input missing" in capsys.readouterr().err


def test_cli_input_errors_are_one_line_and_status_2_before_anything_runs(tmp_path, capsys, monkeypatch):
    """A missing, non-JSON or non-workflow file, a --set of an input the node lacks, a missing --models folder and
    an --out that cannot be written are each one `error:` line naming what is wrong, status 2, no traceback — and
    no node has run (an unwritable --out used to be found at the first save, after all the compute)."""
    from nodes.comfy import bridge
    ran = []

    class Counted(MakeNumber):
        def make(self, *args, **kwargs):
            ran.append(1)
            return super().make(*args, **kwargs)

    monkeypatch.setattr(run, "NODE_CLASS_MAPPINGS", {**CLASSES, "MakeNumber": Counted})
    monkeypatch.setattr(bridge.folders, "_models_dir_override", bridge.folders._models_dir_override)
    monkeypatch.setattr(bridge.folders, "_output_dir_override", bridge.folders._output_dir_override)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(API))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "a_file").write_text("")
    models, out = ["--models", str(tmp_path)], ["--out", str(tmp_path / "out")]
    cases = {
        "the workflow file is unreadable": [str(tmp_path / "missing.json"), *models, *out],
        "the workflow file is not JSON": [str(tmp_path / "broken.json"), *models, *out],
        "the workflow file is JSON but not a workflow": [str(tmp_path / "list.json"), *models, *out],
        "MakeNumber has no such input (it has value, seed, mode)": [str(good), *models, *out, "--set", "1.valeu=2"],
        "--models: the models folder is": [str(good), "--models", str(tmp_path / "nowhere"), *out],
        "--out: the output folder is": [str(good), *models, "--out", str(tmp_path / "a_file" / "out")],
        "--vram-budget-gb: the budget is -3.0, expected a number of GiB above 0": [str(good), *models, *out,
                                                                                   "--vram-budget-gb", "-3"],
        "--vram-budget-gb: the budget is inf": [str(good), *models, *out, "--vram-budget-gb", "inf"],
    }
    if os.path.isdir("/proc/self"):  # a folder that exists and that nobody, root included, can create files in
        cases["--out: the output folder is '/proc/self'"] = [str(good), *models, "--out", "/proc/self"]
    for expected, argv in cases.items():
        assert run.main(argv) == 2, expected
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], (expected, err)
    assert ran == [] and run.main([str(good), *models, *out]) == 0 and ran == [1]


def test_set_overrides_parse_json_and_strings():
    prompt = json.loads(json.dumps(API))
    run.apply_overrides(prompt, ["1.value=7", "2.suffix=hello world"])
    assert prompt["1"]["inputs"]["value"] == 7 and prompt["2"]["inputs"]["suffix"] == "hello world"
    with pytest.raises(GraphError):
        run.apply_overrides(prompt, ["9.value=1"])


def test_set_keeps_text_inputs_as_text():
    """A text input takes the text as given, even where it reads as JSON (a prompt '2024', STG blocks '5', a combo
    value), a JSON string unquoted; other inputs stay JSON. Fails when every value is parsed as JSON: the STRING
    input then got the number 2024 and validation refused it."""
    prompt = json.loads(json.dumps(API))
    run.apply_overrides(prompt, ["2.suffix=2024", "1.mode=2", "1.value=7"], CLASSES)
    assert prompt["2"]["inputs"]["suffix"] == "2024" and prompt["1"]["inputs"]["value"] == 7
    assert prompt["1"]["inputs"]["mode"] == "2"  # a combo's choices are names
    run.apply_overrides(prompt, ['2.suffix="5"', "2.number=[\"1\", 0]"], CLASSES)
    assert prompt["2"]["inputs"]["suffix"] == "5" and prompt["2"]["inputs"]["number"] == ["1", 0]


def test_an_int_named_seed_gets_the_canvas_control_value_unless_the_node_opts_out():
    """The frontend adds a control widget to any INT named seed; the saved value after it must be skipped, or every
    later widget shifts by one (this once broke the diffusion decode node in the canvas)."""
    from nodes.tools.graph import has_control_value
    assert has_control_value("seed", "INT", {}) and has_control_value("noise_seed", "INT", {})
    assert not has_control_value("seed", "INT", {"control_after_generate": False})
    assert not has_control_value("steps", "INT", {}) and has_control_value("x", "INT", {"control_after_generate": True})


class SlowSave:
    """An async output node, like LTX25SaveVideo: its work runs on a thread while later nodes go on."""
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"
    events: list = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",), "fail": ("BOOLEAN", {"default": False})}}

    async def save(self, number, fail):
        import asyncio
        import time
        SlowSave.events.append(("save starts", number))
        await asyncio.to_thread(time.sleep, 0.3)
        if fail:
            raise RuntimeError(f"save of {number} failed")
        SlowSave.events.append(("save ends", number))
        return {"ui": {"saved": [number]}, "result": ()}


class Work:
    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "work"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",)}}

    def work(self, number):
        SlowSave.events.append(("work", number))
        return (number + 1,)


ASYNC_CLASSES = {"MakeNumber": MakeNumber, "SlowSave": SlowSave, "Work": Work, "Show": Show}
# 1 → 2 (work) → 3 (work) → 4 (show); saves of 1's and 2's numbers; the saves' ids sort last, so plain dependency
# order would run both works first and the saves at the end.
ASYNC_API = {"1": {"class_type": "MakeNumber", "inputs": {"value": 3, "seed": 4, "mode": "add"}},
             "2": {"class_type": "Work", "inputs": {"number": ["1", 0]}},
             "3": {"class_type": "Work", "inputs": {"number": ["2", 0]}},
             "4": {"class_type": "Show", "inputs": {"number": ["3", 0]}},
             "8": {"class_type": "SlowSave", "inputs": {"number": ["1", 0], "fail": False}},
             "9": {"class_type": "SlowSave", "inputs": {"number": ["2", 0], "fail": False}}}


def test_async_output_nodes_start_first_and_run_while_later_nodes_go_on():
    """As in ComfyUI's executor: a ready output/async node is picked before other ready nodes, and an async node's
    task runs on while the next nodes execute; the run ends when every task has. Both saves start before the last
    work node runs and end after it, so the two saves overlapped the rest of the graph."""
    SlowSave.events = []
    result = run.execute(ASYNC_API, ASYNC_CLASSES)
    events = SlowSave.events
    assert events[:3] == [("save starts", 7), ("work", 7), ("save starts", 8)], events
    assert events[3] == ("work", 8) and {e for e in events[4:]} == {("save ends", 7), ("save ends", 8)}, events
    assert result["ui"]["8"] == {"saved": [7]} and result["ui"]["9"] == {"saved": [8]}
    assert result["wall_s"] < 0.55 < result["seconds"]["8"] + result["seconds"]["9"]  # 0.3 s each, overlapped


def test_only_output_nodes_and_their_inputs_run():
    """As in ComfyUI: a node no output depends on is not run (here one that would fail), and a prompt without an
    output node is refused."""
    class Broken(Work):
        def work(self, number):
            raise RuntimeError("an unconnected node ran")

    prompt = {**API, "7": {"class_type": "Broken", "inputs": {"number": ["1", 0]}}}
    assert run.execute(prompt, {**CLASSES, "Broken": Broken})["outputs"]["2"] == ("12!",)
    with pytest.raises(GraphError, match="no output node"):
        run.execute({"1": API["1"]}, CLASSES)


def test_only_the_inputs_of_what_runs_are_validated_as_in_comfyui():
    """ComfyUI's validate_prompt checks the inputs of the outputs and what they depend on, so a prompt runs with an
    unconnected node that would not validate (a loader whose file this machine lacks, a half-wired node); a node of
    an unknown class is refused wherever it is."""
    loose = {**API, "7": {"class_type": "MakeNumber", "inputs": {"value": 99, "seed": 0, "mode": "add"}}}
    assert run.execute(loose, CLASSES)["outputs"]["2"] == ("12!",)
    with pytest.raises(GraphError, match="out of range|max"):
        validate(loose, CLASSES)
    with pytest.raises(GraphError, match="unknown node class"):
        run.execute({**API, "7": {"class_type": "Nowhere", "inputs": {}}}, CLASSES)
    unconnected = {**API, "7": {"class_type": "Work", "inputs": {"number": ["8", 0]}},  # a cycle
                   "8": {"class_type": "Work", "inputs": {"number": ["7", 0]}},
                   "9": {"class_type": "Work", "inputs": {"number": ["99", 0]}}}  # a link to no node
    assert run.execute(unconnected, {**CLASSES, "Work": Work})["outputs"]["2"] == ("12!",)


def test_a_link_to_a_missing_node_is_named():
    dangling = {**API, "2": {"class_type": "Show", "inputs": {"number": ["99", 0]}}}
    with pytest.raises(GraphError, match="linked to missing node 99"):
        run.execute(dangling, CLASSES)


def test_a_failing_async_node_fails_the_run():
    SlowSave.events = []
    broken = json.loads(json.dumps(ASYNC_API))
    broken["9"]["inputs"]["fail"] = True
    with pytest.raises(RuntimeError, match="save of 8 failed"):
        run.execute(broken, ASYNC_CLASSES)


def test_ready_nodes_are_picked_by_comfyuis_rule():
    """ComfyUI's `ux_friendly_pick_node`, no more: a ready output or async node first (the first of them, with no
    preference between the two kinds), then a node an output node waits on, then one two steps before an output
    node, else the first ready node. A rule of the runner's own would time the graph differently from ComfyUI."""
    chain = {**{n: ASYNC_API[n] for n in ("1", "2", "3", "4")},  # 1 → 2 → 3 → 4 (show); 5 → 6 (show)
             "5": {"class_type": "MakeNumber", "inputs": {"value": 1, "seed": 0, "mode": "add"}},
             "6": {"class_type": "Show", "inputs": {"number": ["5", 0]}}}
    outputs = {"1": ASYNC_API["1"], "7": {"class_type": "Show", "inputs": {"number": ["1", 0]}}, "8": ASYNC_API["8"]}
    picks = {ready: run._pick(list(ready), prompt, ASYNC_CLASSES)
             for prompt, cases in ((chain, (("1", "5"), ("1", "2"), ("2", "5"))), (outputs, (("7", "8"), ("1", "8"))))
             for ready in cases}
    assert picks == {("1", "5"): "5", ("1", "2"): "2", ("2", "5"): "5", ("7", "8"): "7", ("1", "8"): "8"}, picks


def test_the_runner_can_be_called_from_async_code():
    """From inside a running event loop (a notebook, an async test) `execute` still runs the graph."""
    import asyncio

    async def inside():
        return run.execute(API, CLASSES)

    assert asyncio.run(inside())["outputs"]["2"] == ("12!",)


def _run_order(prompt: dict, classes, monkeypatch, slow: tuple[str, ...] = ()) -> list[str]:
    """The node classes of `prompt` replaced by stand-ins that only record when they start (async where the
    pack's are), run by the runner: the order it starts the nodes in. An async stand-in of a class in `slow` then
    waits a little, as the work on its thread would, and records "end <node id>". (Not validated: the loaders'
    lists of files are empty here.)"""
    import asyncio
    monkeypatch.setattr(run, "validate", lambda prompt, classes, only=None: None)
    started: list[str] = []

    def stand_in(node_class: type) -> type:
        def call(self, **inputs):
            started.append(inputs["unique_id"])
            return (None,) * len(node_class.RETURN_TYPES)

        async def call_async(self, **inputs):
            result = call(self, **inputs)
            if node_class.__name__ in slow:
                await asyncio.sleep(0.05)
                started.append(f"end {inputs['unique_id']}")
            return result

        hidden = {"hidden": {"unique_id": "UNIQUE_ID"}}
        return type(node_class.__name__, (), {
            "RETURN_TYPES": node_class.RETURN_TYPES, "OUTPUT_NODE": getattr(node_class, "OUTPUT_NODE", False),
            "FUNCTION": "call", "INPUT_TYPES": classmethod(lambda cls: {**node_class.INPUT_TYPES(), **hidden}),
            "call": call_async if run.is_async(node_class) else call})

    run.execute(prompt, {name: stand_in(node_class) for name, node_class in classes.items()})
    return started


API_WORKFLOWS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workflows", "api")
def _class_types(name: str) -> set[str]:
    with open(os.path.join(API_WORKFLOWS, name), encoding="utf-8") as f:
        return {node["class_type"] for node in json.load(f).values()}


# every API template but A2V's, which saves the audio it was given
WITH_AUDIO_DECODE = sorted(f for f in os.listdir(API_WORKFLOWS)
                           if f.endswith(".json") and "LTX25AudioDecode" in _class_types(f))


def test_the_shipped_templates_decode_audio():
    assert "ltx25_t2v_distilled_decoder_ab.json" in WITH_AUDIO_DECODE and \
        [f for f in os.listdir(API_WORKFLOWS) if f.endswith(".json") and f not in WITH_AUDIO_DECODE] == \
        ["ltx25_a2v_distilled.json"], WITH_AUDIO_DECODE


@pytest.mark.parametrize("name", WITH_AUDIO_DECODE)
def test_the_audio_is_decoded_before_the_video_so_each_save_starts_when_its_frames_are_decoded(name, monkeypatch):
    """Every save takes the decoded audio. The audio decode is a coroutine, so the runner, following ComfyUI's pick
    (a ready async node first), decodes it as soon as its latent is sampled, before any video decode. Decoded last
    (the runner's dependency order; in ComfyUI, whenever the hash seed lists the compare first among the outputs),
    it held every save of the A/B graph until after the compare. Fails if the audio decode becomes a plain
    function."""
    classes = {**run.core_standins.CLASSES, **run.NODE_CLASS_MAPPINGS}  # as the runner's command line has them
    prompt = run.load_prompt(os.path.join(API_WORKFLOWS, name), classes)
    order = _run_order(prompt, classes, monkeypatch)  # the nodes an output needs (extend's has one unused decode)
    kinds = {node_id: prompt[node_id]["class_type"] for node_id in order}
    audio = [order.index(n) for n, kind in kinds.items() if kind == "LTX25AudioDecode"]
    video = [order.index(n) for n, kind in kinds.items() if kind.endswith("VAEDecode")]
    assert audio and video, f"{name}: {kinds}"
    assert all(a < v for a in audio for v in video), [(order[p], kinds[order[p]]) for p in sorted(audio + video)]


def test_the_saves_of_both_decodes_start_while_the_compare_computes(monkeypatch):
    """The compare is an output node, which the runner, as ComfyUI, starts first once both decodes are done; it is
    a coroutine whose work runs on a thread, so the saves of both decodes start beside it instead of waiting for it
    (in ComfyUI at 1920×1088 the conv save waited 0.8 s for it). Fails if the compare becomes a plain function."""
    classes = {**run.core_standins.CLASSES, **run.NODE_CLASS_MAPPINGS}
    prompt = run.load_prompt(os.path.join(API_WORKFLOWS, "ltx25_t2v_distilled_decoder_ab.json"), classes)
    events = _run_order(prompt, classes, monkeypatch, slow=("LTX25DecoderCompare",))
    compare = next(n for n, node in prompt.items() if node["class_type"] == "LTX25DecoderCompare")
    saves = [n for n, node in prompt.items() if node["class_type"] == "LTX25SaveVideo"
             and compare not in {value[0] for value in node["inputs"].values() if run.is_link(value)}]
    assert len(saves) == 2 and events.index(compare) < events.index(f"end {compare}"), events
    assert all(events.index(save) < events.index(f"end {compare}") for save in saves), events


def test_an_empty_file_list_names_both_folders_a_node_may_list():
    """A file pick from an empty list: a loader lists its models folder, core Load Image / Audio / Video (headless
    stand-ins) the input folder; the error names both, so a missing input image is not sent to the models folder."""
    class PickFile:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"image": ([],)}}
    prompt = {"1": {"class_type": "PickFile", "inputs": {"image": "first.png"}}}
    with pytest.raises(GraphError, match="models folder.*input folder"):
        validate(prompt, {"PickFile": PickFile})


class PassNumber:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",)}}

    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"


class MakeText:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"


def _ui(modes: dict[int, int], pass_links: dict[int, int | None], suffix_link: bool = False) -> dict:
    """MakeNumber 1 → PassNumber 4 → PassNumber 5 → Show 2 (link ids 1, 2, 3), MakeText 6 → Show's suffix
    (link 4) with `suffix_link`; `pass_links` overrides the Pass nodes' input links; `modes` sets node modes."""
    links = [[1, 1, 0, 4, 0, "NUMBER"], [2, 4, 0, 5, 0, "NUMBER"], [3, 5, 0, 2, 0, "NUMBER"],
             [4, 6, 0, 2, 1, "STRING"], [5, 5, 0, 4, 0, "NUMBER"]]
    show_inputs = [{"name": "number", "type": "NUMBER", "link": 3}]
    if suffix_link:
        show_inputs.append({"name": "suffix", "type": "STRING", "link": 4, "widget": {"name": "suffix"}})
    number_out = [{"name": "NUMBER", "type": "NUMBER", "links": []}]
    nodes = [
        {"id": 1, "type": "MakeNumber", "inputs": [], "outputs": number_out, "widgets_values": [3, 4, "fixed", "mul"]},
        {"id": 4, "type": "PassNumber", "inputs": [{"name": "number", "type": "NUMBER", "link": pass_links.get(4, 1)}],
         "outputs": number_out},
        {"id": 5, "type": "PassNumber", "inputs": [{"name": "number", "type": "NUMBER", "link": pass_links.get(5, 2)}],
         "outputs": number_out},
        {"id": 2, "type": "Show", "inputs": show_inputs, "outputs": [], "widgets_values": ["!"]},
        {"id": 6, "type": "MakeText", "inputs": [], "outputs": [{"name": "STRING", "type": "STRING", "links": []}]},
    ]
    for node in nodes:
        node["mode"] = modes.get(node["id"], 0)
    return {"version": 0.4, "links": links, "nodes": nodes}


BYPASS_CLASSES = {**CLASSES, "PassNumber": PassNumber, "MakeText": MakeText}


@pytest.mark.parametrize("modes, pass_links, suffix_link, expected", [
    ({4: 4, 5: 4}, {}, False, {"number": ["1", 0], "suffix": "!"}),           # a chain of two bypassed nodes
    ({1: 2, 4: 4, 5: 4}, {}, False, {"suffix": "!"}),                           # muted behind bypassed: gone
    ({4: 4, 5: 4}, {4: None}, False, {"suffix": "!"}),                         # bypassed onto an unlinked input
    ({6: 2}, {}, True, {"number": ["5", 0]}),                                   # a widget fed by a muted node: gone
    ({}, {}, True, {"number": ["5", 0], "suffix": ["6", 0]}),                  # a widget fed by a link
], ids=["bypass-chain", "muted-source", "bypass-unlinked", "muted-widget", "linked-widget"])
def test_ui_to_api_resolves_muted_and_bypassed_nodes_as_the_canvas_does(modes, pass_links, suffix_link, expected):
    """Bypassed nodes pass their matching input through, chained; a muted source removes the input it feeds, a
    widget's included (the canvas's prompt then lacks it and ComfyUI refuses a required one); bypassed or muted
    nodes never reach the prompt."""
    api = ui_to_api(_ui(modes, pass_links, suffix_link), BYPASS_CLASSES)
    assert api["2"]["inputs"] == expected
    assert not {str(n) for n, mode in modes.items() if mode in (2, 4)} & set(api)


def test_ui_to_api_refuses_bypassed_nodes_that_feed_each_other():
    with pytest.raises(GraphError, match="loop"):
        ui_to_api(_ui({4: 4, 5: 4}, {4: 5}), BYPASS_CLASSES)
