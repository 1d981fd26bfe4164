# Sourced at the start of every GPU benchmark call: installs the carried wheels (git-ignored; $WHEELS, default .whl)
# into /tmp/site, and comfy-kitchen from its stripped site tarball when carried. The GPU image has torch 2.11 +
# transformers 5.17 but no diffusers/natten/comfy-kitchen/PyAV; transformers is pinned below 5.15 for Gemma-4, so
# the carried 5.14.1 shadows the image's copy. A call carries at most 64 MiB: comfy-kitchen (36 MB) and PyAV (35 MB)
# do not fit together, so the A/B graph run carries a folder with PyAV instead of comfy-kitchen.
set -e
WHEELS=${WHEELS:-.whl}
mkdir -p /tmp/site
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then  # a call may carry none (bench_core_graph: .comfy/site.tar.xz only)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl >/dev/null 2>&1
fi
if [ -f "$WHEELS/comfy_kitchen_site.tgz" ]; then tar xzf "$WHEELS/comfy_kitchen_site.tgz" -C /tmp/site; fi
export PYTHONPATH=/tmp/site:$PWD
set +e
