"""LTX-2.5 engine: torch + diffusers + transformers + safetensors. Never imports ComfyUI."""
