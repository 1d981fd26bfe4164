"""Reading a split file's `__metadata__["config"]`: the one reader every component's config parsing goes through, so
an absent, mistyped or unsupported value is refused the same way everywhere, naming the file and the key."""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import LTX25Error

REQUIRED = object()  # `config_field` default: the key must be in the file
_ABSENT_HINT = ("The file's metadata lacks it (stripped by a repack, or another release) and its default cannot be "
                "assumed; use the official file.")


def config_field(file: str, metadata: Mapping[str, Any], path: str, default: Any = REQUIRED, *,
                 kind: type | tuple[type, ...] | None = None, allowed: tuple | None = None, hint: str = "") -> Any:
    """The value at `path` (dotted, e.g. "vae.decoder.patch_size"; "" for the whole block) under the file's
    `__metadata__["config"]`.

    Absent (or under a section that is not a JSON object): `default`, or an LTX25Error without one. Present: checked
    to be a `kind` (a bool is never taken for a number). Either way checked to be one of `allowed`, so a default
    the pack cannot run is refused too. Errors name `file` and `config.<path>`; `hint` replaces the standard advice.
    """
    name = f"config.{path}" if path else "config"
    node: Any = metadata
    for key in ["config", *(path.split(".") if path else ())]:
        if not isinstance(node, Mapping) or key not in node:
            if default is REQUIRED:
                raise LTX25Error(file, name, "absent", "a value in the file's metadata", hint or _ABSENT_HINT)
            _check_allowed(file, name, default, allowed, hint, absent=True)
            return default
        node = node[key]
    kinds = kind if isinstance(kind, tuple) else (kind,) if kind is not None else ()
    if kinds and (not isinstance(node, kinds) or isinstance(node, bool) and bool not in kinds):
        expected = " or ".join("JSON object" if k is Mapping else k.__name__ for k in kinds)
        raise LTX25Error(file, name, repr(node) if not isinstance(node, Mapping) else "a JSON object",
                         f"a {expected}", hint)
    _check_allowed(file, name, node, allowed, hint)
    return node


def _check_allowed(file: str, name: str, value: Any, allowed: tuple | None, hint: str, absent: bool = False) -> None:
    if allowed is not None and value not in allowed:
        raise LTX25Error(file, name, f"absent (its default {value!r})" if absent else repr(value),
                         " or ".join(map(repr, allowed)),
                         hint or "This pack runs the LTX-2.5 architecture only.")
