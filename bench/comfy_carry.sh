#!/bin/sh
# Builds the git-ignored folder .comfy/ that the benches running ComfyUI in their own process
# (bench/bench_comfyui_lowvram.py, bench/bench_core_graph.py) need on the GPU machine, which has no internet:
#
# - ComfyUI/: ComfyUI 0.33's Python source as far as headless in-process execution imports it (no frontend, models,
#   tests or API nodes), plus the comfy_extras files of core's LTX-2.5 text-to-video graph;
# - site.tar.xz: an installed site folder (Python 3.12, x86_64) of what the GPU image lacks (its other needs are in
#   the image): comfy-kitchen (core's LTX transformer calls its RoPE kernels; its ROCm backend left out),
#   comfy-aimdo, torchsde, trampoline, PyAV (the saves), diffusers and importlib_metadata. xz packs it in about
#   50 MB (PyAV 25, comfy-kitchen 22; gzip would take 80), so the folder, about 56 MB, fits the 64 MiB a call
#   carries. The benches unpack it themselves: --site .comfy/site.tar.xz.
#
#     sh bench/comfy_carry.sh /work/comfyui-033 .comfy        # a few minutes (xz)
set -e
SRC=$(cd "${1:?usage: comfy_carry.sh COMFYUI_CHECKOUT [DEST]}" && pwd)
DEST=${2:-.comfy}
rm -rf "$DEST"
mkdir -p "$DEST/ComfyUI" "$DEST/wheels" "$DEST/site"
DEST=$(cd "$DEST" && pwd)
# What `import execution, nodes` and running pack nodes import (checked with an audit of the loaded modules):
# comfy, comfy_api, comfy_config, comfy_execution and the root modules; app and utils are small and imported by
# some of ComfyUI's modules on other paths. Core's graph: its LTXV, audio, upsampler, sampler and video nodes.
EXTRAS="nodes_lt.py nodes_lt_audio.py nodes_audio.py nodes_lt_upsampler.py nodes_hunyuan.py nodes_custom_sampler.py
nodes_video.py"
(cd "$SRC" && find comfy comfy_api comfy_config comfy_execution app utils -name '*.py' && ls ./*.py &&
  for f in $EXTRAS; do echo "comfy_extras/$f"; done) |
  (cd "$SRC" && tar cf - -T -) | (cd "$DEST/ComfyUI" && tar xf -)
PLATFORM="--python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --abi cp312 --abi abi3 --abi none"
# shellcheck disable=SC2086  # PLATFORM is a list of options
python3 -m pip download -q --no-deps --only-binary=:all: $PLATFORM -d "$DEST/wheels" \
  "comfy-kitchen==0.2.31" "comfy-aimdo==0.4.13" torchsde trampoline "av==18.1.0" "diffusers==0.42.1" \
  "importlib_metadata==8.7.0"
# shellcheck disable=SC2086
python3 -m pip install -q --no-deps --no-compile --no-index --only-binary=:all: $PLATFORM --target "$DEST/site" \
  "$DEST"/wheels/*.whl
rm -rf "$DEST/site/comfy_kitchen/backends/hip" "$DEST/site/bin" "$DEST/wheels"
find "$DEST/site" -name __pycache__ -prune -exec rm -rf {} +
tar cf - -C "$DEST/site" . | xz -6 -T0 > "$DEST/site.tar.xz"
rm -rf "$DEST/site"
du -sh "$DEST" "$DEST/site.tar.xz"
