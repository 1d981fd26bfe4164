"""The Gemma tokenizer stored inside the text-encoder file, and prompt tokenization exactly as the reference
encodes (docs/MODEL.md §3.1): strip, no padding, truncate to 1024, prepend BOS when the tokenizer did not emit it
(Gemma 4's does not; Gemma 3's does), truncate again, LEFT-pad to exactly 1024. Attention mask 1 = valid.

The tokenizer is rebuilt from the `tokenizer_json` bytes with `tokenizers.Tokenizer.from_buffer`; its special
tokens come from the `hf_asset__tokenizer_config.json` sidecar.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from tokenizers import Tokenizer

from ..errors import LTX25Error

MAX_TOKENS = 1024  # the reference pads/truncates every prompt to this; the connectors need a multiple of 128
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenBatch:
    """ids: [B, 1024] int64 (LEFT padded with the pad id); mask: [B, 1024] int64, 1 = valid token;
    dropped: per prompt, how many of its tokens truncation cut off."""
    ids: torch.Tensor
    mask: torch.Tensor
    dropped: tuple[int, ...]


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores a special token as a string or as a serialized AddedToken `{"content": ...}`."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def check_prompt_text(prompt: object, where: str) -> str:
    """A prompt the tokenizer can read: a string that is valid Unicode. A lone surrogate (half of a UTF-16 pair,
    e.g. from text cut in the middle of an emoji) cannot be encoded, and the tokenizer's own error names neither the
    prompt nor the character."""
    if not isinstance(prompt, str):
        raise LTX25Error(where, "the prompt", type(prompt).__name__, "text")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LTX25Error(where, "the prompt", f"text with an unpaired surrogate {prompt[e.start]!r} at character "
                         f"{e.start} (…{prompt[max(0, e.start - 20):e.start]!r} before it)", "valid Unicode text",
                         "Delete that character or paste the text again; it is half of a character (such as an "
                         "emoji) whose other half was lost.") from e
    return prompt


@dataclass(frozen=True)
class GemmaTokenizer:
    tokenizer: Tokenizer = field(compare=False, repr=False)
    bos_id: int
    pad_id: int
    max_length: int = MAX_TOKENS

    @classmethod
    def from_bytes(cls, where: str, tokenizer_json: bytes, tokenizer_config: Mapping[str, Any]) -> "GemmaTokenizer":
        """Rebuild from the file's `tokenizer_json` bytes and its `tokenizer_config.json` (special tokens)."""
        try:
            tokenizer = Tokenizer.from_buffer(tokenizer_json)
        except Exception as e:  # tokenizers raises a bare Exception subclass for malformed JSON
            raise LTX25Error(where, "tokenizer_json", f"unreadable ({e})", "a tokenizers JSON blob",
                             "The text-encoder file is damaged; re-download it.") from e
        side = tokenizer_config.get("truncation_side", "right")
        if side != "right":
            raise LTX25Error(where, "tokenizer_config.json truncation_side", repr(side), "'right' (the reference)")

        def token_id(key: str) -> int | None:
            content = _token_content(tokenizer_config.get(key))
            return None if content is None else tokenizer.token_to_id(content)

        bos = token_id("bos_token")
        if bos is None:
            raise LTX25Error(where, "tokenizer_config.json bos_token", tokenizer_config.get("bos_token"),
                             "a token of the vocabulary", "Every prompt starts with BOS; the file lacks one.")
        pad = token_id("pad_token")
        pad = token_id("eos_token") if pad is None else pad  # the reference falls back to EOS
        if pad is None:
            raise LTX25Error(where, "tokenizer_config.json pad_token/eos_token", "absent",
                             "a padding token of the vocabulary")
        return cls(tokenizer, bos, pad)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def prompt_ids(self, prompt: str) -> tuple[list[int], int]:
        """One prompt → (ids with exactly one leading BOS, at most `max_length` long; tokens dropped).

        The empty prompt becomes `[BOS]` alone, as in the reference (then padding), not an error."""
        ids = self.tokenizer.encode(prompt.strip(), add_special_tokens=True).ids
        if not ids or ids[0] != self.bos_id:
            ids = [self.bos_id, *ids]  # equals the reference's truncate → prepend → truncate again
        return ids[: self.max_length], max(0, len(ids) - self.max_length)

    def encode(self, prompts: Sequence[str]) -> TokenBatch:
        """Prompts → left-padded [B, 1024] ids and mask. Over-long prompts are cut at the end, with a warning."""
        rows, masks, dropped = [], [], []
        for prompt in prompts:
            ids, cut = self.prompt_ids(prompt)
            if cut:
                log.warning("LTX-2.5 prompt is %d tokens long; the last %d tokens were dropped (the text encoder "
                            "reads at most %d, BOS included): %.60r…", len(ids) + cut, cut, self.max_length, prompt)
            pad = self.max_length - len(ids)
            rows.append([self.pad_id] * pad + ids)
            masks.append([0] * pad + [1] * len(ids))
            dropped.append(cut)
        return TokenBatch(torch.tensor(rows, dtype=torch.int64), torch.tensor(masks, dtype=torch.int64),
                          tuple(dropped))
