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
        # Every token stands for at most as many characters of text as its vocabulary entry spells: a byte-level BPE
        # entry spells each of its bytes as one character (a text has no more characters than UTF-8 bytes), and
        # SentencePiece pieces spell their text (byte-fallback pieces like <0xE2>, more). A normalizer may fold
        # characters first, at most 1.5 to one (NFC: three into one of two bytes), hence the factor 2 in
        # max_prompt_chars. (A tokenizer that fuses unknown text into one token could fit more; the engine's
        # byte-level checkpoints have none.)
        vocab = self.tokenizer.get_vocab(with_added_tokens=True) if self.tokenizer else {}
        self.longest_token_chars = max(map(len, vocab), default=1)

    def max_prompt_chars(self, max_model_len: int) -> int | None:
        """The most characters a text prompt can have and still fit `max_model_len` tokens (None: no tokenizer), so
        a longer one is refused before the tokenizer spends seconds on it."""
        return None if self.tokenizer is None else 2 * max_model_len * self.longest_token_chars

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineRequestError(f"checkpoint {self.folder} has no tokenizer.json: send token ids instead of text")
        # encode_batch releases the GIL while it works (encode holds it throughout), so a long prompt tokenized on a
        # worker thread leaves the event loop and the other threads running.
        return self.tokenizer.encode_batch([text])[0].ids

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
