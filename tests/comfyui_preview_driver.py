"""Run with ComfyUI's interpreter (tests/test_comfyui_preview.py does):

    COMFYUI_PYTHON tests/comfyui_preview_driver.py --comfyui ROOT --pack PACK_ROOT --report OUT.json

Inside a real ComfyUI: the bridge's preview step callback gets a seeded x0 video latent at each of three steps,
once with ComfyUI's Latent2RGB preview method and once with previews off. ComfyUI's progress-bar hook records what
reaches it; the report holds, per step, what the hook got for it (value, total, the preview's format, size and
pixels beside those computed by hand from core's LTX-2 latent format's factors, `LTXAV`, else `LTXV`; None when
ComfyUI's throttle held a plain update back).
"""
from __future__ import annotations

import argparse
import json
import sys

import comfyui_boot as boot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--comfyui", "--pack", "--report"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    comfy_args = boot.comfy_flags(args.comfyui)
    from comfy.cli_args import LatentPreviewMethod
    import torch
    import comfy.latent_formats as latent_formats
    import comfy.utils

    boot.import_pack(args.pack, "ltx25_pack")
    from ltx25_pack.nodes.comfy import bridge

    sent = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None:
                                             sent.append((value, total, preview)))
    latent_format = getattr(latent_formats, "LTXAV", None) or latent_formats.LTXV
    fmt = latent_format()
    factors = torch.tensor(fmt.latent_rgb_factors)                      # [128, 3]
    bias = torch.tensor(fmt.latent_rgb_factors_bias) if fmt.latent_rgb_factors_bias is not None else 0.0
    generator = torch.Generator().manual_seed(0)
    report = {"comfy": bridge.HAS_COMFY, "format": latent_format.__name__, "runs": {}}
    for method in ("Latent2RGB", "NoPreviews"):
        comfy_args.preview_method = getattr(LatentPreviewMethod, method)
        sent.clear()
        on_step = bridge.step_callback(3, "preview test", preview_latent=True)
        steps = []
        for done in (1, 2, 3):
            x0 = torch.randn((1, 128, 2, 4, 6), generator=generator)
            on_step(done, 3, x0)
            rgb = torch.einsum("chw,cr->hwr", x0[0, :, 0], factors) + bias
            want = ((rgb + 1) / 2).clamp(0, 1).mul(255).to(torch.uint8)
            value, total, preview = sent[-1] if sent else (None, None, None)
            step = {"value": value, "total": total, "preview": preview is not None}
            sent.clear()  # ComfyUI throttles plain progress updates: a step may send nothing
            if preview is not None:
                width, height = preview[1].size
                image = torch.tensor(list(preview[1].getdata())).reshape(height, width, -1)
                step.update(format=preview[0], size=[width, height], mode=preview[1].mode,
                            max_pixel_diff=int((image - want.int()).abs().max()))
            steps.append(step)
        report["runs"][method] = steps
    with open(args.report, "w") as out:
        json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
