"""First look at the GPU machine: versions, and whether comfy-kitchen's fused na3d runs there."""
import json
import time

import torch

info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
import diffusers, transformers, comfy_kitchen as ck  # noqa: E401

info |= {"diffusers": diffusers.__version__, "transformers": transformers.__version__}
q = torch.randn(1, 16, 32, 48, 4, 64, device="cuda", dtype=torch.bfloat16)
for backend in ("default",):
    out = ck.na3d(q, q, q, [11, 11, 11], scale=1.0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        ck.na3d(q, q, q, [11, 11, 11], scale=1.0)
    torch.cuda.synchronize()
    info["ck_na3d_ms_[1,16,32,48,4,64]_k11"] = (time.perf_counter() - t) / 10 * 1e3
print(json.dumps(info))
