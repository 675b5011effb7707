"""A request as the scheduler sees it: its tokens, where its cache lives, and how far it got."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.runtime.sampler import SamplingParams, TokenLogprobs


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    cached_tokens: int = 0  # tokens whose KV/state are in the pools
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None
    finish_reason: str | None = None  # "stop" | "length"
    # One per output token when params.logprobs is set, appended by the sampler as it draws the token (before the
    # scheduler commits it), so entry i is output_ids[i]'s.
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # Progress is counted apart from attempts, so a retry loop is visible (docs/domain.md §11).
    committed_chunks: int = 0
    scheduled_attempts: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0  # cached work thrown away by preemption

    def tokens_between(self, start: int, stop: int) -> list[int]:
        """(prompt + output)[start:stop] without building the whole list: a decode step reads one token, and
        concatenating every sequence's whole history each step costs O(context) a sequence."""
        prompt_len = len(self.prompt_ids)
        if start >= prompt_len:
            return self.output_ids[start - prompt_len:stop - prompt_len]
        if stop <= prompt_len:
            return self.prompt_ids[start:stop]
        return self.prompt_ids[start:] + self.output_ids[:stop - prompt_len]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def lifetime_tokens(self) -> int:
        """Prompt + every token it may generate: what admission must be able to hold."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def uncached_tokens(self) -> int:
        return self.num_tokens - self.cached_tokens

    @property
    def in_prefill(self) -> bool:
        """More than the newest token is missing from the cache: a (re)prefill is under way."""
        return self.uncached_tokens > 1 or not self.output_ids
