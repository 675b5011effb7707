"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, per-request seed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from engine.errors import EngineRequestError

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes exactly 0..2**64-1 (and overflows above)
# Below MIN_TEMPERATURE, logits / temperature overflows float32 to inf and softmax gives NaN, which multinomial
# refuses; 2 is OpenAI's ceiling. 0 means greedy and is always accepted.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-5, 2.0
TEMPERATURE_RULE = f"0 (greedy) or between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}"
# top_p is compared with float32 probabilities: below float32's smallest normal number it rounds toward 0 (to 0
# itself under 7e-46, e.g. 5e-324), every token is dropped, and softmax over nothing but -inf is NaN, which
# multinomial refuses.
MIN_TOP_P = float(torch.finfo(torch.float32).tiny)
TOP_P_RULE = f"a number from {MIN_TOP_P:.3g} (float32's smallest normal number) to 1"
# Fault injection for tests: sampling raises for a request with this seed (SamplingParams stay valid).
FAULT_SEED_ENV = "SEAM_FAULT_SAMPLE_SEED"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise EngineRequestError(f"max_tokens must be a positive integer (got {self.max_tokens!r})")
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float)
                or not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE)):
            raise EngineRequestError(f"temperature must be {TEMPERATURE_RULE} (got {self.temperature!r})")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not MIN_TOP_P <= self.top_p <= 1:
            raise EngineRequestError(f"top_p must be {TOP_P_RULE} (got {self.top_p!r})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise EngineRequestError(f"top_k must be a non-negative integer (got {self.top_k!r}); 0 disables it")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= SEED_MAX):
            raise EngineRequestError(f"seed must be an integer from 0 to {SEED_MAX} (got {self.seed!r})")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class StepLogits:
    """One step's next-token logits as the sampler needs them: each row's argmax (taken on the device, inside the
    decode graph where there is one) and the full row only for rows that draw at random. A greedy batch so crosses
    to the host, and between processes, as a list of ids rather than [rows, vocab] floats (150 MB at batch 256)."""

    argmax: list[int]
    rows: dict[int, torch.Tensor]  # row index -> float32 logits on the host, for rows that sample

    @classmethod
    def take(cls, logits: torch.Tensor, draws: list[bool | None], argmax: torch.Tensor | None = None) -> StepLogits:
        """The rows of `logits` [seqs, vocab] whose `draws` entry is not None, in order (others yield no token); the
        full row of each whose entry is True (drawn at random), the argmax of every one."""
        ready = [i for i, draw in enumerate(draws) if draw is not None]
        if not ready:
            return cls([], {})
        argmax = torch.argmax(logits, dim=-1) if argmax is None else argmax
        if len(ready) < len(draws):  # only some rows yield a token (chunked prefills): pick theirs
            argmax = argmax[torch.tensor(ready, dtype=torch.long, device=logits.device)]
        picked = argmax.tolist()
        drawn = [n for n, i in enumerate(ready) if draws[i]]
        rows = logits[torch.tensor([ready[n] for n in drawn], device=logits.device)].float().cpu() if drawn else []
        return cls(picked, dict(zip(drawn, rows, strict=True)))


class Sampler:
    """Turns each sequence's last-token logits into its next token.

    A request with a seed owns its generator, so its samples do not depend on what else is
    batched with it.
    """

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}
        fault = os.environ.get(FAULT_SEED_ENV)
        self.fault_seed = int(fault) if fault else None

    def sample(self, logits: torch.Tensor | StepLogits, params: list[SamplingParams], seq_ids: list[int]) -> list[int]:
        """Every row's next token; the first row whose sampling fails raises."""
        drawn = self.sample_rows(logits, params, seq_ids)
        for token in drawn:
            if isinstance(token, Exception):
                raise token
        return drawn

    def sample_rows(self, logits: torch.Tensor | StepLogits, params: list[SamplingParams],
                    seq_ids: list[int]) -> list[int | Exception]:
        """Every row's next token, or in its place the exception its sampling raised: one request's failure stays
        its own (as asyncio.gather's return_exceptions), and its neighbours' draws are exactly as without it."""
        if isinstance(logits, torch.Tensor):
            logits = StepLogits.take(logits, [not param.greedy for param in params])
        tokens: list[int | Exception] = []
        for index, (param, seq_id) in enumerate(zip(params, seq_ids, strict=True)):
            try:
                tokens.append(self._draw(logits.rows.get(index), param, seq_id, logits.argmax[index]))
            except Exception as error:  # whatever it was, it is this request's alone
                tokens.append(error)
        return tokens

    def _draw(self, row: torch.Tensor | None, param: SamplingParams, seq_id: int, argmax: int) -> int:
        if self.fault_seed is not None and param.seed == self.fault_seed:
            raise RuntimeError(f"fault injection: sampling fails for seed {param.seed} ({FAULT_SEED_ENV})")
        if param.greedy:
            return argmax
        probs = torch.softmax(_filter(row / param.temperature, param.top_k, param.top_p), dim=-1)
        return int(torch.multinomial(probs.cpu(), 1, generator=self._generator(seq_id, param)))

    def release(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)

    def _generator(self, seq_id: int, param: SamplingParams) -> torch.Generator | None:
        if param.seed is None:
            return None
        if seq_id not in self._generators:
            generator = torch.Generator()
            generator.manual_seed(param.seed)
            self._generators[seq_id] = generator
        return self._generators[seq_id]


def _filter(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask everything outside the top-k and outside the smallest set with cumulative mass >= top_p."""
    if top_k and top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p  # keep the token that crosses top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return scores
