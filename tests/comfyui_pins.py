"""Does the pack install beside ComfyUI 0.33 without changing ComfyUI's packages?

Offline (tests/test_comfyui_pins.py, in CI): every requirement of the pack (pyproject.toml: dependencies and every
extra) must admit each version ComfyUI pins (tests/data/comfyui-0.33-requirements.txt, ComfyUI's file verbatim)
and each version those requirements resolved to on their own (tests/data/comfyui-0.33-resolved.txt). A range that
excludes one of them makes pip replace ComfyUI's copy, or refuse both files together.

Online (`make check-pins`, needs PyPI; not in CI, since one resolution takes 20 s to 2 min there):

    python tests/comfyui_pins.py            # resolve ComfyUI's file alone and with the pack's; compare
    python tests/comfyui_pins.py --record   # also rewrite comfyui-0.33-resolved.txt from the alone resolution

Both resolutions are `pip install --dry-run --ignore-installed --only-binary :all: --report`: nothing is
installed. The check fails when pip finds no solution with the pack, or when adding the pack changes the version
of any package ComfyUI's requirements resolve to.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from typing import Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

TESTS = os.path.dirname(os.path.abspath(__file__))
PACK_ROOT = os.path.dirname(TESTS)
COMFYUI_REQUIREMENTS = os.path.join(TESTS, "data", "comfyui-0.33-requirements.txt")
COMFYUI_RESOLVED = os.path.join(TESTS, "data", "comfyui-0.33-resolved.txt")
# Extras left out of the online resolution: natten is source-only on PyPI (built by hand, see the Makefile).
SOURCE_ONLY_EXTRAS = ("natten",)
# Not recorded: which torch build and CUDA wheels pip picks depends on the machine (index, caps), not on ComfyUI.
MACHINE_DEPENDENT = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")


# ---------------------------------------------------------------------------------------------------- reading
def _project() -> dict:
    with open(os.path.join(PACK_ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def pack_extras() -> list[str]:
    return list(_project().get("optional-dependencies", {}))


def pack_requirements(extras: Iterable[str] | None = None) -> list[Requirement]:
    """The pack's dependencies and the requirements of its extras (all of them when `extras` is None)."""
    project = _project()
    optional = project.get("optional-dependencies", {})
    chosen = optional if extras is None else {name: optional[name] for name in extras}
    lines = list(project["dependencies"]) + [line for group in chosen.values() for line in group]
    return [Requirement(line) for line in lines]


def requirement_lines(path: str) -> list[str]:
    """The requirement lines of a pip requirements file (comments and blank lines dropped; no options in ours)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.split("#", 1)[0].strip() for line in f]
    return [line for line in lines if line]


def comfyui_requirements() -> list[Requirement]:
    return [Requirement(line) for line in requirement_lines(COMFYUI_REQUIREMENTS)]


def pinned_versions(requirements: Iterable[Requirement]) -> dict[str, Version]:
    """{name: version} of every `name==version` requirement."""
    pins = {}
    for req in requirements:
        exact = [spec for spec in req.specifier if spec.operator in ("==", "===") and "*" not in spec.version]
        if exact:
            pins[canonicalize_name(req.name)] = Version(exact[0].version)
    return pins


def resolved_versions(path: str = COMFYUI_RESOLVED) -> dict[str, Version]:
    return pinned_versions(Requirement(line) for line in requirement_lines(path))


# ---------------------------------------------------------------------------------------------------- checking
def refusals(pack: Iterable[Requirement], versions: dict[str, Version], source: str) -> list[str]:
    """One line per pack requirement whose specifier excludes the version `source` has for that package."""
    found = []
    for req in pack:
        version = versions.get(canonicalize_name(req.name))
        if version is not None and not req.specifier.contains(version, prereleases=True):
            found.append(f"{req} excludes {req.name}=={version} ({source})")
    return found


def comfyui_own_packages(pack: Iterable[Requirement]) -> list[str]:
    """Pack requirements that are ComfyUI's own packages (frontend, templates, docs): ComfyUI installs those."""
    return [str(req) for req in pack if canonicalize_name(req.name).startswith("comfyui-")]


# ---------------------------------------------------------------------------------------------------- online
def resolve(requirement_files: list[str], pip: list[str]) -> dict[str, str]:
    """{name: version} pip would install for these files into an empty environment (a dry run)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--only-binary", ":all:",
               "--report", report]
        for path in requirement_files:
            cmd += ["-r", path]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pip found no solution for {requirement_files}:\n{done.stdout[-3000:]}"
                             f"{done.stderr[-3000:]}")
        with open(report, encoding="utf-8") as f:
            installs = json.load(f)["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=f"rewrite {os.path.relpath(COMFYUI_RESOLVED)}")
    args = parser.parse_args(argv)
    pip = [sys.executable, "-m", "pip"]
    extras = [name for name in pack_extras() if name not in SOURCE_ONLY_EXTRAS]
    with tempfile.TemporaryDirectory() as tmp:
        pack_file = os.path.join(tmp, "pack-requirements.txt")
        with open(pack_file, "w", encoding="utf-8") as f:
            f.write("\n".join(str(req) for req in pack_requirements(extras)) + "\n")
        alone = resolve([COMFYUI_REQUIREMENTS], pip)
        together = resolve([COMFYUI_REQUIREMENTS, pack_file], pip)
    changed = [f"{name}: {alone[name]} alone, {together[name]} with the pack"
               for name in sorted(alone) if together.get(name) != alone[name]]
    if args.record:
        with open(COMFYUI_RESOLVED, "w", encoding="utf-8") as f:
            f.write("# What pip resolved comfyui-0.33-requirements.txt to on its own (tests/comfyui_pins.py "
                    "--record);\n# torch, its CUDA wheels and triton are left out: they depend on the machine.\n")
            f.writelines(f"{name}=={version}\n" for name, version in sorted(alone.items())
                         if not MACHINE_DEPENDENT.match(name))
    print(f"ComfyUI 0.33 alone: {len(alone)} packages; with the pack (extras {extras}): {len(together)}")
    if changed:
        print("adding the pack changes ComfyUI's packages:\n  " + "\n  ".join(changed))
        return 1
    print("adding the pack changes none of ComfyUI's packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
