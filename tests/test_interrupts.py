"""Stopping a run (issue 20, item 3): the engine's long single forwards check between blocks (conv decode, upsample,
audio decode) and the compare between chunks of frames; the headless runner checks before each node, forgets an
interrupt left from before a run, holds one for the whole run (a save on its thread cannot use it up while a node
computes), turns Ctrl-C into an interrupt at the next step; and an interrupt at any node of the A/B graph leaves the
next run clean and identical."""
from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import av
import pytest
import torch

from nodes.comfy import bridge
from nodes.ltx.decode.tiling import TilingRequest
from nodes.tools import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StopAt:
    """An interrupt check that raises the bridge's InterruptError on its `n`-th call, counting the calls."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls >= self.n:
            raise bridge.InterruptError("stopped by the test")


# ---------------------------------------------------------------------------------------------- engine stop points
def test_an_untiled_conv_decode_stops_between_blocks_not_after_the_clip(tiny_file):
    """Untiled, the whole clip is one tile, so the per-tile check came only at the end (6.3 s to stop in ComfyUI):
    the check before each decoder block stops it inside the tile, before any tile completes."""
    from nodes.ltx.decode.conv_vae import decode_conv, load_conv_vae
    vae = load_conv_vae(tiny_file("conv_vae"), torch.float32)
    tiles, check = [], StopAt(2)
    with pytest.raises(bridge.InterruptError):
        decode_conv(vae, torch.randn(1, 128, 2, 2, 2), TilingRequest("off"), on_step=lambda *a: tiles.append(a),
                    check=check)
    assert check.calls == 2 and tiles == [], (check.calls, tiles)
    images, _ = decode_conv(vae, torch.randn(1, 128, 2, 2, 2), TilingRequest("off"))  # no hooks left behind
    assert images.shape == (9, 64, 64, 3)


def test_an_untiled_diffusion_decode_stops_within_one_block_of_any_stage(tiny_file):
    """Stages 1-3 run once before any tile and an untiled decode is one tile, so the per-tile×step progress check
    came only after the whole clip (68 more leaf forwards in a reviewer's count): the check runs before every block
    of stages 1-4 and of each stage-5 step, once per block forward, so the n-th check stops it wherever that is
    (the first block, stage 4's last, stage 5's first, the last step's last). A check that never raises changes no
    bit; a stopped decode leaves no hook and no tensor behind (with its exception still held, as ComfyUI holds it)
    and the next decode equals one made before."""
    import gc
    from nodes.ltx.decode import diffusion_vae as dv
    vae = dv.load_diffusion_vae(tiny_file("diffusion_vae"), torch.float32)
    latent = torch.randn(1, 128, 2, 2, 3, generator=torch.Generator().manual_seed(0))

    def decode(**kwargs):
        return dv.decode(vae, latent, processor="sdpa", steps=2, seed=1, request=TilingRequest("off"), **kwargs)[0]
    want = decode()
    det, stage5 = sum(vae.config.stage_depths[:4]), vae.config.stage_depths[4]
    every = StopAt(10**9)
    assert torch.equal(decode(check=every), want) and every.calls == det + 2 * stage5, (every.calls, det, stage5)

    def live_bytes(keep):
        gc.collect()
        return sum(t.untyped_storage().nbytes() for t in gc.get_objects()
                   if type(t) in (torch.Tensor, torch.nn.Parameter) and t.untyped_storage().data_ptr() not in keep)
    keep = {t.untyped_storage().data_ptr() for t in [*vae.parameters(), *vae.buffers(), latent, want]}
    for n in (1, det, det + 1, det + 2 * stage5):
        check, ticks, before = StopAt(n), [], live_bytes(keep)
        with pytest.raises(bridge.InterruptError) as stopped:
            decode(check=check, on_step=lambda *a: ticks.append(a))
        leaked = live_bytes(keep) - before
        assert check.calls == n and len(ticks) == (n > det + stage5), (n, check.calls, ticks)
        assert stopped.value is not None and leaked < 64 * 1024, f"{leaked} bytes of tensors survived a stop at {n}"
        assert not any(block.forward.__name__ == "checked_forward" for block in vae.modules()), n  # none left
    assert torch.equal(decode(), want)


def test_a_guided_step_checks_before_each_of_its_passes(transformer):
    """A dev step runs up to four full forwards (cond, uncond, perturbed, isolated; twice that with res_2s) while the
    sampler's progress check comes once per step: the guided denoiser checks before each pass, so the n-th check
    stops it after n − 1 forwards. Batched passes are one forward, one check; neutral scales one forward, one check.
    A check that never raises changes no bit, and a denoise after a stopped one equals one made before (no
    perturbation left in place)."""
    from nodes.ltx.conditioning import Conditioning
    from nodes.ltx.dit import guidance as G
    from nodes.tools.tiny.common import TINY_DIMS
    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(1, 128, 2, 2, 3, generator=g), torch.randn(1, 8, 7, 16, generator=g)
    prompts = [Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                            torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g)) for _ in range(2)]
    full = G.Guidance(*prompts, *(G.ModalityGuidance(m.cfg, m.stg, (1,), m.rescale, m.modality)
                                  for m in (G.DEV_VIDEO, G.DEV_AUDIO)))  # 4 passes; STG on a block the tiny model has
    forwards = []
    hook = transformer.dit.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        want = G.make_guided_denoiser(transformer, full, 24.0, "eager")(video, audio, 0.7)
        every = StopAt(10**9)
        got = G.make_guided_denoiser(transformer, full, 24.0, "eager", check=every)(video, audio, 0.7)
        assert every.calls == 4 and all(torch.equal(a, b) for a, b in zip(got, want)), every.calls
        for guidance, batching, n in ((full, "sequential", 1), (full, "sequential", 3), (full, "batched", 1),
                                      (G.Guidance(prompts[0]), "sequential", 1)):
            forwards.clear()
            check = StopAt(n)
            with pytest.raises(bridge.InterruptError):
                G.make_guided_denoiser(transformer, guidance, 24.0, "eager", batching, check=check)(video, audio, 0.7)
            assert check.calls == n and len(forwards) == n - 1, (batching, n, check.calls, len(forwards))
        again = G.make_guided_denoiser(transformer, full, 24.0, "eager")(video, audio, 0.7)
        assert all(torch.equal(a, b) for a, b in zip(again, want))
    finally:
        hook.remove()


def test_the_upsample_and_the_audio_decode_stop_between_blocks(tiny_file):
    """One forward each, so a check before each block is what can stop them: it raises from inside the forward,
    and the hooks are gone afterwards (a later call runs through)."""
    from nodes.ltx import upsampler as ups
    from nodes.ltx.audio_vae import decode_audio, load_audio_vae
    from nodes.tools.tiny.common import latent_statistics
    upsampler = ups.load_upsampler(tiny_file("upsampler"), torch.float32)
    mean, std = latent_statistics(0)
    check = StopAt(2)
    with pytest.raises(bridge.InterruptError):
        ups.upsample_latent(upsampler, torch.randn(1, 128, 2, 3, 4), mean, std, check=check)
    assert check.calls == 2
    assert ups.upsample_latent(upsampler, torch.randn(1, 128, 2, 3, 4), mean, std).shape == (1, 128, 2, 6, 8)
    vae = load_audio_vae(tiny_file("audio_vae"), torch.float32)
    check = StopAt(3)
    with pytest.raises(bridge.InterruptError):
        decode_audio(vae, torch.randn(1, 8, 18, 16), check=check)
    assert check.calls == 3 and decode_audio(vae, torch.randn(1, 8, 18, 16))["waveform"].shape[1] == 2


def test_the_compare_stops_between_chunks_of_frames():
    """PSNR/SSIM run chunk by chunk over the clip: the check before each chunk stops a long clip's metrics."""
    from nodes.ltx.decode.compare import FRAMES_PER_CHUNK, psnr_and_ssim_per_frame
    frames = torch.rand(3 * FRAMES_PER_CHUNK, 16, 16, 3)
    check = StopAt(2)
    with pytest.raises(bridge.InterruptError):
        psnr_and_ssim_per_frame(frames, frames, check=check)
    assert check.calls == 2


def test_the_nodes_hand_the_bridge_check_to_their_stop_points(tiny_file, monkeypatch):
    """The decode, upsample, audio, compare and guided-sampler nodes pass the bridge's interrupt check down to the
    engine's stop points: more checks than their tiles/steps alone make (one untiled tile; one compare call; two
    sampler steps)."""
    from nodes.comfy.audio import LTX25AudioDecode
    from nodes.comfy.compare import LTX25DecoderCompare
    from nodes.comfy.decode_conv import LTX25ConvVAEDecode
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.comfy.guidance import LTX25GuidedSampler, LTX25MultimodalGuider
    from nodes.comfy.handles import Loaded
    from nodes.comfy.sampling import LTX25EmptyLatent, LTX25LatentUpsample
    from nodes.ltx import upsampler as ups
    from nodes.ltx.audio_vae import load_audio_vae
    from nodes.ltx.conditioning import Conditioning
    from nodes.ltx.decode.conv_vae import load_conv_vae
    from nodes.ltx.decode.diffusion_vae import load_diffusion_vae
    from nodes.ltx.dit.transformer import load_transformer
    from nodes.ltx.files.assets import inspect_asset
    from nodes.tools.tiny.common import TINY_DIMS

    def loaded(component, load):
        return Loaded.register(load(tiny_file(component), torch.float32), inspect_asset(tiny_file(component)))
    checks = StopAt(10**9)
    monkeypatch.setattr(bridge, "check_interrupt", checks)
    conv = loaded("conv_vae", load_conv_vae)
    counts = {}
    LTX25ConvVAEDecode().decode(conv, {"samples": torch.randn(1, 128, 2, 2, 2)}, "off", 80, 768, 24, 64, 0.0)
    counts["conv decode"], checks.calls = checks.calls, 0
    LTX25LatentUpsample().upsample(loaded("upsampler", ups.load_upsampler), conv,
                                   {"samples": torch.randn(1, 128, 2, 2, 2), "frame_rate": 24.0})
    counts["upsample"], checks.calls = checks.calls, 0
    asyncio.run(LTX25AudioDecode().decode(loaded("audio_vae", load_audio_vae), {"samples": torch.randn(1, 8, 18, 16)}))
    counts["audio decode"], checks.calls = checks.calls, 0
    frames = torch.rand(24, 16, 16, 3)
    asyncio.run(LTX25DecoderCompare().compare(frames, frames, "a", "b", "side_by_side", False))
    counts["compare"], checks.calls = checks.calls, 0
    LTX25DiffusionVAEDecode().decode(loaded("diffusion_vae", load_diffusion_vae), {"samples": torch.randn(
        1, 128, 2, 2, 2)}, "sdpa", 0, 0, "off", 80, 512, 40, 160, 0.0)  # one tile, one step
    counts["diffusion decode"], checks.calls = checks.calls, 0
    prompt = Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"]),
                          torch.randn(1, 1024, TINY_DIMS["audio_inner"]))
    guider = LTX25MultimodalGuider().guide(prompt, 3.0, 7.0, 1.0, 1.0, "1", "1", 3.0, 3.0, 0.7, 0.7, negative=prompt)[0]
    LTX25GuidedSampler().sample(loaded("transformer", load_transformer), guider,
                                *LTX25EmptyLatent().make(128, 128, 9, 24.0, 1, True), 0, 2, "euler", "4096 tokens",
                                "1", "sequential", "eager")  # two steps of four passes
    counts["guided sampler"] = checks.calls
    assert min(counts.values()) > 2, counts


# ---------------------------------------------------------------------------------------------- the runner
class Number:
    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1})}}

    def make(self, value):
        return (value,)


class Steps:
    """A plain node that works in steps and checks for interrupts between them, as the sampler does."""
    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "work"
    done: list[int] = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",), "steps": ("INT", {"default": 3})}}

    def work(self, number, steps):
        on_step = bridge.step_callback(steps, "steps")
        for step in range(steps):
            time.sleep(0.01)
            Steps.done.append(step)
            on_step(step + 1, steps)
        return (number + steps,)


class Save:
    """An async output node whose work runs on a thread and checks for interrupts, as the save does."""
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"
    frames: list[int] = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",)}}

    async def save(self, number):
        import asyncio

        def encode():
            for frame in range(200):
                bridge.check_interrupt()
                Save.frames.append(frame)
                time.sleep(0.005)
        await asyncio.to_thread(encode)
        return {"ui": {"saved": [number]}}


CLASSES = {"Number": Number, "Steps": Steps, "Save": Save}
GRAPH = {"1": {"class_type": "Number", "inputs": {"value": 1}},
         "2": {"class_type": "Steps", "inputs": {"number": ["1", 0], "steps": 3}},
         "3": {"class_type": "Save", "inputs": {"number": ["2", 0]}}}


def test_an_interrupt_left_from_before_a_run_does_not_stop_it():
    """An interrupt that landed where nothing checked it (here: between runs) is dropped when the next run starts,
    as ComfyUI's executor does for each prompt; it used to kill the next run at its first check."""
    Steps.done, Save.frames = [], []
    bridge.request_interrupt()
    result = run.execute(copy.deepcopy(GRAPH), CLASSES)
    assert result["ui"]["3"] == {"saved": [4]} and Steps.done == [0, 1, 2] and len(Save.frames) == 200


def test_the_runner_checks_before_each_node():
    """An interrupt during a node that never checks (a loader) stops the run before the next node starts."""
    started = []
    with pytest.raises(bridge.InterruptError):
        run.execute(copy.deepcopy(GRAPH), CLASSES,
                    on_start=lambda node: started.append(node) or (node == "1" and bridge.request_interrupt()))
    assert started == ["1"], started


def test_one_interrupt_stops_both_a_computing_node_and_a_save_beside_it():
    """A save encoding on its thread while the next node computes: the interrupt stops both (inside a run the first
    check to see it does not use it up), and the run fails with the interrupt."""
    graph = {**copy.deepcopy(GRAPH), "4": {"class_type": "Steps", "inputs": {"number": ["2", 0], "steps": 400}},
             "5": {"class_type": "Save", "inputs": {"number": ["4", 0]}}}
    Steps.done, Save.frames = [], []

    def interrupt_during_the_long_node(node):
        if node == "4":
            bridge.request_interrupt()
    with pytest.raises(bridge.InterruptError):
        run.execute(graph, CLASSES, on_start=interrupt_during_the_long_node)
    assert len(Steps.done) < 3 + 400 and len(Save.frames) < 200, (len(Steps.done), len(Save.frames))
    assert run.execute(copy.deepcopy(GRAPH), CLASSES)["ui"]["3"] == {"saved": [4]}  # and the next run is clean


def test_the_runner_says_an_interrupted_async_node_stopped_and_a_broken_one_failed(capsys, monkeypatch):
    """A save stopped by the user is reported as stopped, not as a failure to look into; a save that raises is still
    a failure."""
    Steps.done, Save.frames = [], []
    with pytest.raises(bridge.InterruptError):
        run.execute(copy.deepcopy(GRAPH), CLASSES, on_start=lambda node: node == "3" and bridge.request_interrupt())
    assert "[run] 3 stopped" in capsys.readouterr().err

    async def broken(self, number):
        raise ValueError("a broken save")
    monkeypatch.setattr(Save, "save", broken)
    with pytest.raises(ValueError):
        run.execute(copy.deepcopy(GRAPH), CLASSES)
    assert "[run] 3 failed" in capsys.readouterr().err


_CTRL_C_RUN = textwrap.dedent("""
    import signal, sys, time
    from nodes.comfy import bridge
    from nodes.tools import run

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may inherit SIGINT ignored

    class Sampler:
        RETURN_TYPES = ("NUMBER",)
        FUNCTION = "sample"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        def sample(self):
            on_step = bridge.step_callback(2000, "sampler")
            for step in range(2000):
                print(f"step {step}", file=sys.stderr, flush=True)
                time.sleep(0.01)
                on_step(step + 1, 2000)
            return (1,)

    class Later:
        RETURN_TYPES = ()
        OUTPUT_NODE = True
        FUNCTION = "later"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"number": ("NUMBER",)}}

        def later(self, number):
            print("the next node ran", file=sys.stderr, flush=True)
            return {}

    run.NODE_CLASS_MAPPINGS = {"Sampler": Sampler, "Later": Later}
    raise SystemExit(run.main(sys.argv[1:]))
""")


def test_ctrl_c_stops_sampling_at_the_next_step_and_exits_without_a_traceback(tmp_path):
    """`python -m nodes.tools.run` given Ctrl-C in the middle of a plain node's steps: it stops at the next step
    (left to asyncio, the run went on until the next async node), runs no later node, and exits with status 130 and
    a line saying so, with no traceback."""
    script, prompt = tmp_path / "ctrl_c_run.py", tmp_path / "prompt.json"
    script.write_text(_CTRL_C_RUN)
    prompt.write_text(json.dumps({"1": {"class_type": "Sampler", "inputs": {}},
                                  "2": {"class_type": "Later", "inputs": {"number": ["1", 0]}}}))
    process = subprocess.Popen([sys.executable, str(script), str(prompt), "--models", str(tmp_path), "--out",
                                str(tmp_path / "out")], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any(line.startswith("step 5") for line in lines):  # sampling is under way
            line = process.stderr.readline()
            assert line, "".join(lines)[-3000:]
            lines.append(line)
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    err = "".join(lines) + rest
    steps = [int(line.split()[1]) for line in err.splitlines() if line.startswith("step ")]
    assert process.returncode == 130 and "Traceback" not in err and "[run] stopped" in err, err[-3000:]
    assert max(steps) <= 5 + 2 and "the next node ran" not in err, err[-3000:]


# ---------------------------------------------------------------------------------------------- the A/B graph
AB_SIZE = {"width": 128, "height": 64, "frames": 9}  # the smallest two-stage clip: 19 stopped runs stay cheap
STOPS_INSIDE = {"LTX25DistilledSampler", "LTX25GuidedSampler", "LTX25LatentUpsample", "LTX25ConvVAEDecode",
                "LTX25DiffusionVAEDecode", "LTX25AudioDecode", "LTX25DecoderCompare",
                "LTX25SaveVideo"}  # nodes that check while they work


def _ab_prompt() -> dict:
    with open(os.path.join(ROOT, "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json"), encoding="utf-8") as f:
        prompt = json.load(f)
    prompt["5"]["inputs"].update(AB_SIZE)
    return prompt


def _results(result: dict) -> dict[str, torch.Tensor]:
    """The tensors a run hands its saves: both stage-2 latents, both decodes, the audio and the canvas."""
    outputs = result["outputs"]
    return {"video latent": outputs["12"][0]["samples"], "audio latent": outputs["12"][1]["samples"],
            "conv": outputs["13"][0], "diffusion": outputs["14"][0], "audio": outputs["15"][0]["waveform"],
            "canvas": outputs["16"][0]}


def test_an_interrupt_at_any_node_of_the_ab_graph_leaves_the_next_run_clean_and_identical(tiny_models, tmp_path):
    """Fault injection: for each node of the A/B graph in turn, a run interrupted as that node starts ends with the
    interrupt, at that node (one that checks while it works stops inside it), leaving no partial file (a save that
    had ended keeps its whole video);
    each of those runs reaches its node, so no interrupt carried over from the run before; and after all of them a
    clean run gives exactly the tensors of a run made before any interrupt (same seed)."""
    bridge.set_output_dir(str(tmp_path))
    reference = _results(run.execute(_ab_prompt()))
    for video in tmp_path.glob("*.mp4"):
        video.unlink()
    order = []
    run.execute(_ab_prompt(), on_start=order.append)
    for video in tmp_path.glob("*.mp4"):
        video.unlink()
    prompt = _ab_prompt()
    assert sorted(order) == sorted(prompt), order
    for node in order:
        started, ended = [], []

        def interrupt_at(node_id, node=node, started=started):
            started.append(node_id)
            if node_id == node:
                bridge.request_interrupt()
        with pytest.raises(bridge.InterruptError):
            run.execute(_ab_prompt(), on_start=interrupt_at, on_end=lambda node_id, *_: ended.append(node_id))
        class_type = prompt[node]["class_type"]
        assert started[-1] == node, (node, started)
        assert class_type not in STOPS_INSIDE or node not in ended, f"{node} ({class_type}) ran to its end"
        left = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
        assert all(name.endswith(".mp4") for name in left), (node, left)  # no partial file
        for name in left:  # a save that ended before the interrupt keeps its whole video, as in ComfyUI
            with av.open(str(tmp_path / name)) as container:
                assert sum(1 for _ in container.decode(video=0)) == AB_SIZE["frames"], (node, name)
            os.unlink(tmp_path / name)
    again = _results(run.execute(_ab_prompt()))
    for name, tensor in reference.items():
        assert torch.equal(again[name], tensor), f"{name}: max diff {(again[name] - tensor).abs().max():.3e}"


def test_the_guided_sampler_of_the_dev_graph_stops_before_its_next_pass(tiny_models, tmp_path, monkeypatch):
    """The dev template's guided sampler, Stop pressed during its first forward pass: no further pass runs (it
    waited for the step's remaining three before), the node does not end, and a clean run after gives the latents
    of a run made before."""
    from nodes.ltx.dit import guidance as G
    bridge.set_output_dir(str(tmp_path))
    with open(os.path.join(ROOT, "workflows", "api", "ltx25_t2v_dev_two_stage.json"), encoding="utf-8") as f:
        prompt = json.load(f)
    prompt["5"]["inputs"].update(AB_SIZE)
    prompt["22"]["inputs"].update({"video_stg_blocks": "1", "audio_stg_blocks": "1"})  # the tiny DiT has 2 blocks
    prompt["10"]["inputs"]["steps"] = 2
    assert prompt["10"]["class_type"] in STOPS_INSIDE
    reference = run.execute(copy.deepcopy(prompt), targets=["10"])["outputs"]["10"]
    forwards, ended = [], []
    real = G._perturbed_velocity

    def forward(*args, **kwargs):
        forwards.append(1)
        if len(forwards) == 1:
            bridge.request_interrupt()
        return real(*args, **kwargs)
    monkeypatch.setattr(G, "_perturbed_velocity", forward)
    with pytest.raises(bridge.InterruptError):
        run.execute(copy.deepcopy(prompt), targets=["10"], on_end=lambda node_id, *_: ended.append(node_id))
    assert len(forwards) == 1 and "10" not in ended, (len(forwards), ended)
    monkeypatch.setattr(G, "_perturbed_velocity", real)
    again = run.execute(copy.deepcopy(prompt), targets=["10"])["outputs"]["10"]
    assert all(torch.equal(a["samples"], b["samples"]) for a, b in zip(again, reference))
