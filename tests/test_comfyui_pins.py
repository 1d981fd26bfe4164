"""The pack's requirements admit ComfyUI 0.33's pins and the versions its requirements resolve to (offline: the
data files in tests/data). `make check-pins` runs the same question through pip against PyPI; see
tests/comfyui_pins.py. Unlike the rest of the real-ComfyUI tier, these tests need no ComfyUI checkout."""
from __future__ import annotations

from packaging.requirements import Requirement
from packaging.version import Version

import comfyui_pins as pins


def test_comfyui_data_files_hold_its_pins_and_a_resolution():
    """The data files are what the other tests compare against: ComfyUI's own pins (comfy-kitchen==0.2.31, the
    frontend) and a resolution naming transformers. Fails when a file is emptied or replaced by another list."""
    pinned = pins.pinned_versions(pins.comfyui_requirements())
    assert pinned["comfy-kitchen"] == Version("0.2.31") and "comfyui-frontend-package" in pinned, pinned
    resolved = pins.resolved_versions()
    assert resolved["transformers"] >= Version("5.24") and resolved["comfy-kitchen"] == Version("0.2.31"), resolved


def test_pack_requirements_admit_every_version_comfyui_pins():
    """Each pack requirement, extras included, admits the version ComfyUI 0.33 pins with `==`. Fails when a range
    excludes a pin: pip then replaces ComfyUI's copy, or refuses the two requirement files together."""
    pack = pins.pack_requirements()
    assert not pins.refusals(pack, pins.pinned_versions(pins.comfyui_requirements()), "pinned by ComfyUI")


def test_pack_requirements_admit_the_versions_comfyui_resolves_to():
    """Each pack requirement admits the version ComfyUI 0.33's requirements resolve to on their own. Fails on an
    upper bound that downgrades what ComfyUI installs (transformers, and with it huggingface-hub and tokenizers)."""
    pack = pins.pack_requirements()
    assert not pins.refusals(pack, pins.resolved_versions(), "ComfyUI 0.33 resolved")


def test_pack_leaves_comfyuis_own_packages_to_comfyui():
    """The frontend, templates and docs packages are ComfyUI's dependencies; the pack listing one would move it
    whenever the pack is installed. Fails when such a package is in pyproject.toml."""
    assert not pins.comfyui_own_packages(pins.pack_requirements())


def test_checks_refuse_the_ranges_that_fought_comfyui():
    """The checks above are not vacuous: the ranges that replaced comfy-kitchen, downgraded transformers and
    carried the frontend are each reported. Fails when a check stops comparing versions."""
    old = [Requirement("comfy-kitchen>=0.2.40"), Requirement("transformers>=5.11,<5.15"),
           Requirement("comfyui-frontend-package>=1.27")]
    pinned = pins.refusals(old, pins.pinned_versions(pins.comfyui_requirements()), "pinned")
    resolved = pins.refusals(old, pins.resolved_versions(), "resolved")
    assert [Requirement(line.split(" ")[0]).name for line in pinned] == ["comfy-kitchen"], pinned
    assert sorted(Requirement(line.split(" ")[0]).name for line in resolved) == ["comfy-kitchen", "transformers"], \
        resolved
    assert pins.comfyui_own_packages(old) == ["comfyui-frontend-package>=1.27"]


def test_requirements_txt_is_the_pyproject_dependencies_but_torch():
    """ComfyUI-Manager installs a node pack's requirements.txt, not pyproject.toml: without it a Manager install
    lacks diffusers and the pack fails to import. It lists pyproject's dependencies except torch (ComfyUI's own
    build must stay). Fails when the two lists drift apart or torch is listed."""
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")
    listed = [Requirement(line) for line in pins.requirement_lines(path)]
    expected = [r for r in pins.pack_requirements(extras=()) if r.name != "torch"]
    assert sorted(map(str, listed)) == sorted(map(str, expected))
