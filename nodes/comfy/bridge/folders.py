"""Model, output, temp and user folders: ComfyUI's (folder_paths), or headless a models directory
(`LTX25_MODELS_DIR`, or the runner's `--models`) and an output directory."""
from __future__ import annotations

import os

from ...ltx import compile_cache
from .comfyui import HAS_COMFY, _folder_paths

MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "latent_upscale_models", "loras")

_models_dir_override: str | None = None


def set_models_dir(path: str) -> None:
    """The headless runner's `--models`: a ComfyUI-style models folder."""
    global _models_dir_override
    _models_dir_override = os.path.abspath(path)
    if HAS_COMFY:
        for folder in MODEL_FOLDERS:
            _folder_paths.add_model_folder_path(folder, os.path.join(_models_dir_override, folder), is_default=True)


def _standalone_models_dir() -> str:
    return _models_dir_override or os.environ.get("LTX25_MODELS_DIR") or os.path.join(os.getcwd(), "models")


if HAS_COMFY and "latent_upscale_models" not in _folder_paths.folder_names_and_paths:
    # ComfyUI before LTX-2 support lacks this folder; register it beside the others.
    _folder_paths.add_model_folder_path("latent_upscale_models",
                                        os.path.join(_folder_paths.models_dir, "latent_upscale_models"))


def list_model_files(folder: str) -> list[str]:
    """Files a loader widget offers (ComfyUI's folder list, or the standalone models directory)."""
    if HAS_COMFY:
        return [f for f in _folder_paths.get_filename_list(folder) if f.endswith((".safetensors", ".sft"))]
    root = os.path.join(_standalone_models_dir(), folder)
    if not os.path.isdir(root):
        return []
    found = []
    for dirpath, _dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f.endswith((".safetensors", ".sft"))]
    return sorted(found)


def model_file_path(folder: str, name: str) -> str:
    if HAS_COMFY:
        path = _folder_paths.get_full_path(folder, name)
    else:
        path = os.path.join(_standalone_models_dir(), folder, name)
        path = path if os.path.isfile(path) else None
    if path is None:
        from ...ltx.errors import LTX25Error
        raise LTX25Error(f"{folder}/{name}", "the model file", "not found",
                         f"a file in the {folder!r} models folder", "Put the official file there (see README).")
    return path


_output_dir_override: str | None = None


def set_output_dir(path: str) -> None:
    global _output_dir_override
    _output_dir_override = os.path.abspath(path)
    if HAS_COMFY:
        _folder_paths.set_output_directory(_output_dir_override)


def output_dir() -> str:
    if HAS_COMFY and _output_dir_override is None:
        return _folder_paths.get_output_directory()
    return _output_dir_override or os.path.join(os.getcwd(), "output")


def temp_dir() -> str:
    if HAS_COMFY:
        return _folder_paths.get_temp_directory()
    return os.path.join(output_dir(), "temp")


def user_directory() -> str | None:
    """ComfyUI's user directory, where the pack keeps its compile cache (compile_cache.py): it lasts across
    restarts, while ComfyUI empties its temp folder at every start. None headless."""
    return _folder_paths.get_user_directory() if HAS_COMFY else None


compile_cache.set_host_root(user_directory)  # asked at the pack's first compilation, after ComfyUI's arguments
