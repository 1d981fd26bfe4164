# Sourced at the start of every GPU benchmark call: installs the carried wheels (.whl, git-ignored) into /tmp/site.
# The GPU image has torch 2.11 + transformers 5.17 but no diffusers/natten/comfy-kitchen; transformers is pinned
# below 5.15 for Gemma-4, so the carried 5.14.1 shadows the image's copy.
set -e
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/diffusers-*.whl .whl/transformers-*.whl .whl/tokenizers-*.whl >/dev/null 2>&1
tar xzf .whl/comfy_kitchen_site.tgz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD
set +e
