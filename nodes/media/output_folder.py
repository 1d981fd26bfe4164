"""Where a filename prefix puts a file in the output folder, checked without PyAV and without writing anything, so
the Save node can refuse a prefix or folder it could never write before a run spends minutes sampling
(`LTX25SaveVideo.VALIDATE_INPUTS`); `mp4.reserve` then takes the name itself."""
from __future__ import annotations

import os

from ..ltx.errors import LTX25Error


def resolve_prefix(directory: str, prefix: str, where: str = "filename_prefix") -> tuple[str, str, str]:
    """(folder, base, subfolder) of `prefix` ("videos/LTX25") under `directory`, symlinks resolved; a prefix
    that leaves the directory or holds a NUL raises LTX25Error naming `where`. An empty prefix is "LTX25"."""
    root = os.path.realpath(directory)
    prefix = prefix or "LTX25"
    if "\0" in prefix:
        raise LTX25Error(where, "the filename prefix", repr(prefix), "a name without NUL characters",
                         "Remove the NUL character (\\0) from the prefix.")
    target = os.path.realpath(os.path.join(root, os.path.normpath(prefix)))  # a symlink cannot lead outside
    if os.path.commonpath([root, target]) != root or target == root:
        raise LTX25Error(where, "the filename prefix", repr(prefix), f"a name inside {root}",
                         "Remove '..', absolute paths and links to other folders from the prefix.")
    folder, base = os.path.split(target)
    subfolder = os.path.relpath(folder, root)
    return folder, base, "" if subfolder == "." else subfolder.replace(os.sep, "/")


def check_writable(directory: str, prefix: str, where: str = "filename_prefix") -> None:
    """Refuse, naming `where`, a prefix `resolve_prefix` refuses or whose folder could not be made and written: the
    nearest existing folder on its path must be a folder this process may write in (a file standing where a
    subfolder should be, or a read-only folder, is refused). A full disk shows only when the file is written."""
    folder = resolve_prefix(directory, prefix, where)[0]
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        what = "a file, not a folder" if not os.path.isdir(existing) else "not writable by this process"
        raise LTX25Error(where, "the output folder", folder, "a folder this process can create and write in",
                         f"{existing} is {what}. Check the output folder (ComfyUI's --output-directory) and the "
                         "subfolders the prefix names.")
