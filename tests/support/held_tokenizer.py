"""The checkpoint's real tokenizer, watched from a test: it records what it is asked to encode and can keep the
caller waiting, so a test can act while a prompt is being tokenized without guessing how long that takes."""

from __future__ import annotations

import threading
from typing import Any

HOLD_LIMIT_S = 60  # a held caller goes on by itself after this: a test that never releases fails, it does not hang


class HeldTokenizer:
    def __init__(self, real: Any, held: bool):
        self.real = real
        self.lengths: list[int] = []  # the length of each text it was asked to encode
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: bool | None = None  # False: the hold ran out before the test released it
        if not held:
            self.release.set()

    def __getattr__(self, name: str) -> Any:  # everything but encoding is the real tokenizer's
        return getattr(self.real, name)

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self._enter([text])
        return self.real.encode(text, *args, **kwargs)

    def encode_batch(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self._enter(texts)
        return self.real.encode_batch(texts, *args, **kwargs)

    def _enter(self, texts: list[str]) -> None:
        self.lengths += [len(text) for text in texts]
        self.entered.set()
        self.released_in_time = self.release.wait(HOLD_LIMIT_S)
