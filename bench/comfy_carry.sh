#!/bin/sh
# Builds the git-ignored folder .comfy/ that bench/bench_comfyui_lowvram.py needs on the GPU machine, which has no
# internet: ComfyUI 0.33's Python source as far as headless in-process execution imports it (no frontend, models,
# tests, API nodes or core's extra nodes), and the wheels (Python 3.12, x86_64) of ComfyUI's requirements the GPU image
# may lack and that are small. About 14 MB; the lead carries it beside .whl/ (64 MiB per call in all).
#
#     sh bench/comfy_carry.sh /work/comfyui-033 .comfy
#
# On the GPU machine: python3 -m pip install -q --no-index --no-deps --target /tmp/comfy_site .comfy/wheels/*.whl
# and pass --site /tmp/comfy_site to the bench (appended to sys.path: the image's own packages win).
set -e
SRC=$(cd "${1:?usage: comfy_carry.sh COMFYUI_CHECKOUT [DEST]}" && pwd)
DEST=${2:-.comfy}
rm -rf "$DEST"
mkdir -p "$DEST/ComfyUI" "$DEST/wheels"
DEST=$(cd "$DEST" && pwd)
# What `import execution, nodes` and running pack nodes import (checked with an audit of the loaded modules):
# comfy, comfy_api, comfy_config, comfy_execution and the root modules; app and utils are small and imported by
# some of ComfyUI's modules on other paths.
(cd "$SRC" && find comfy comfy_api comfy_config comfy_execution app utils -name '*.py' && ls ./*.py) |
  (cd "$SRC" && tar cf - -T -) | (cd "$DEST/ComfyUI" && tar xf -)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --abi cp312 --abi abi3 --abi none -d "$DEST/wheels" \
  "comfy-aimdo==0.4.13" psutil einops torchsde trampoline pillow
du -sh "$DEST"
