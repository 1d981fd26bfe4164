"""Where torch.compile and Triton keep what they compile, so a restart reuses it instead of compiling again.

What the first run of a process compiles: the DiT's blocks (`torch.compile`: Dynamo's trace, AOTAutograd, Inductor
and the Triton kernels Inductor writes) and the pack's own Triton kernels (the diffusion decoder's). Dynamo's trace
is redone in every process; the rest can come from on-disk caches, which Inductor and Triton keep by default in
places that do not last or that the user does not know about (`/tmp/torchinductor_<user>`, emptied at reboot and by
temp cleaners; `~/.triton/cache`). The pack points both at one folder of its own, before its first compilation in
the process:

- `<root>/inductor` as `TORCHINDUCTOR_CACHE_DIR`: Inductor's FX-graph cache (the generated code of each compiled
  graph), the AOTAutograd cache, and the dynamic-shape profiles Dynamo records (its "PGO" profiles), all keyed by
  torch's version and the graph, so a stale entry is never used;
- `<root>/triton` as `TRITON_CACHE_DIR`: the compiled kernels of both Inductor and the pack (keyed by Triton's
  version, the kernel's source and its constants). The pack's kernels take fixed launch configurations (no
  `triton.autotune`), so there are no autotune results to keep beside them.

The root: `LTX25_CACHE_DIR` when set (`off` leaves torch's and Triton's own defaults alone); in ComfyUI its user
directory (`ComfyUI/user/ltx25_cache`, which lasts across restarts, unlike its temp folder, emptied at every start),
registered by the bridge; headless `$XDG_CACHE_HOME/ltx25` or `~/.cache/ltx25`. A variable the user set themselves
(`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`) is kept; importing `torch._dynamo` writes Inductor's fallback
folder into its variable, so that value counts as unset. The setting is process-wide (torch reads the variables, not
a per-call option), so once made it also holds for anything else in the process that compiles later.

Not used: `torch.compiler.save_cache_artifacts`/`load_cache_artifacts` ("mega-cache"). It bundles these same
on-disk entries into one blob to carry to another machine; on the machine that compiled, the folders above already
hold them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, MutableMapping

from . import compat

log = logging.getLogger("ltx25")

ENV = "LTX25_CACHE_DIR"
OFF = "off"                       # LTX25_CACHE_DIR=off: keep torch's and Triton's own cache places
COMFY_FOLDER = "ltx25_cache"      # inside ComfyUI's user directory
HEADLESS_FOLDER = "ltx25"         # inside $XDG_CACHE_HOME or ~/.cache
INDUCTOR_ENV, TRITON_ENV = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"


@dataclass(frozen=True)
class CacheDirs:
    """The folders compiled artifacts go to, and why: `root` None when the pack leaves the defaults alone."""
    root: str | None
    chosen_by: str                # "LTX25_CACHE_DIR", "ComfyUI user directory", "headless default", …
    inductor: str | None          # TORCHINDUCTOR_CACHE_DIR in effect (None: torch's default)
    triton: str | None            # TRITON_CACHE_DIR in effect (None: Triton's default)

    def describe(self) -> str:
        if self.root is None:
            return f"compile caches: torch's and Triton's defaults ({self.chosen_by})"
        return f"compile caches in {self.root} ({self.chosen_by})"


def choose_root(environ: Mapping[str, str], host_root: str | None, home: str) -> tuple[str | None, str]:
    """(root, chosen_by): `LTX25_CACHE_DIR` (None for 'off'), else the host application's folder (ComfyUI's user
    directory, from the bridge), else `$XDG_CACHE_HOME/ltx25` or `<home>/.cache/ltx25`. Pure: reads only its
    arguments."""
    value = environ.get(ENV, "").strip()
    if value.lower() == OFF:
        return None, f"{ENV}={OFF}"
    if value:
        return os.path.abspath(os.path.expanduser(value)), ENV
    if host_root:
        return os.path.join(os.path.abspath(host_root), COMFY_FOLDER), "ComfyUI user directory"
    base = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return os.path.join(os.path.abspath(base), HEADLESS_FOLDER), "headless default"


def apply(root: str | None, chosen_by: str, environ: MutableMapping[str, str],
          torch_default: str | None = None) -> CacheDirs:
    """Point Inductor and Triton at `root`'s subfolders in `environ`, keeping any folder the user set; nothing
    changes for `root` None. `torch_default`: Inductor's own fallback folder. Importing `torch._dynamo` (diffusers
    does) already writes that into `TORCHINDUCTOR_CACHE_DIR`, so that value counts as unset, not as a choice."""
    if root is not None:
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as error:  # results stay right, only the first run of each process stays slow
            log.warning("LTX-2.5: cannot create the compile cache folder %s (%s); torch's and Triton's default "
                        "places are used. Set %s to a writable folder.", root, error, ENV)
            root, chosen_by = None, f"{root} not writable"
    if root is None:
        return CacheDirs(None, chosen_by, environ.get(INDUCTOR_ENV), environ.get(TRITON_ENV))
    for name, sub, default in ((INDUCTOR_ENV, "inductor", torch_default), (TRITON_ENV, "triton", None)):
        value = environ.get(name)
        if not value or (default is not None and os.path.abspath(value) == os.path.abspath(default)):
            environ[name] = os.path.join(root, sub)
    return CacheDirs(root, chosen_by, environ[INDUCTOR_ENV], environ[TRITON_ENV])


_host_root: Callable[[], str | None] = lambda: None
_applied: CacheDirs | None = None


def set_host_root(host_root: Callable[[], str | None]) -> None:
    """Where the host application wants the cache (the bridge registers ComfyUI's user directory), asked at the
    first `ensure_applied`: registered at import, it sees the folder ComfyUI settled on after parsing its
    arguments."""
    global _host_root
    _host_root = host_root


def ensure_applied() -> CacheDirs:
    """Choose and apply the cache folders once per process; called before every place the pack compiles (the DiT's
    blocks, the first launch of its Triton kernels). Later calls return the first result."""
    global _applied
    if _applied is None:
        root, chosen_by = choose_root(os.environ, _host_root(), os.path.expanduser("~"))
        _applied = apply(root, chosen_by, os.environ, compat.inductor_default_cache_dir())
        log.info("LTX-2.5: %s", _applied.describe())
    return _applied


def applied() -> CacheDirs | None:
    """What `ensure_applied` chose, or None before the pack's first compilation in this process."""
    return _applied
