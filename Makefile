# The two commands a fresh machine needs: `make test` (the suite) and `make demo` (the main job, tiny assets).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
MODELS := .cache/tiny-models
OUT := out

.PHONY: test demo venv clean check-pins

venv: $(STAMP)

$(STAMP): constraints.txt requirements-dev.txt pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -r requirements-dev.txt
	# natten is source-only on PyPI: build it without CUDA (flex backend, exact on the CPU) in seconds.
	CUDA_VISIBLE_DEVICES= $(PIP) install -q -c constraints.txt --no-build-isolation natten==0.21.7
	touch $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest

# Online (PyPI, 1-2 min, so not part of `make test`): resolves ComfyUI 0.33's requirements alone and with the
# pack's and fails if the pack changes any of ComfyUI's packages. tests/test_comfyui_pins.py checks the same offline.
check-pins: $(STAMP)
	$(VPY) tests/comfyui_pins.py

demo: $(STAMP)
	$(VPY) -m nodes.tools.demo --models $(MODELS) --out $(OUT)

clean:
	rm -rf $(VENV) .cache $(OUT)
