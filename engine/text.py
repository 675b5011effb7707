"""A checkpoint's text side: its tokenizer (optional), its end-of-sequence ids, and prompt checks."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import EngineError, EngineRequestError


class CheckpointText:
    def __init__(self, folder: Path, vocab_size: int):
        self.folder, self.vocab_size = folder, vocab_size
        self.tokenizer = _tokenizer(folder)
        self.eos_ids = _eos_ids(folder)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineRequestError(f"checkpoint {self.folder} has no tokenizer.json: send token ids instead of text")
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer else ""

    def prompt_ids(self, prompt: list[int] | str) -> list[int]:
        """Token ids of a prompt (text is encoded), each checked against the vocabulary."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return ids


def _eos_ids(folder: Path) -> tuple[int, ...]:
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else (int(eos),)
    return ()


def _tokenizer(folder: Path):
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers library raises a bare Exception for a corrupt file
        raise EngineError(f"{path}: not a readable tokenizer ({error})") from error
