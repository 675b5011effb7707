"""Sampling parameters and the sampler: penalties, greedy, temperature, top-k, top-p, per-request seed, logprobs.

One sampler serves `LLM` (engine/llm.py) and the served engine (engine/control/driver.py) alike. A step's rows are
processed in this order, as vLLM does: the penalties (all rows at once, on the batch's logits), then the temperature
and the top-k/top-p cut per row, then the draw. A token's logprob is taken from exactly the distribution it was drawn
from ("processed", as vLLM's processed_logprobs): after the penalties, the temperature and the top-k/top-p cut (a
token the cut removed has -inf); a greedy row's, from its penalized logits at temperature 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

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
# OpenAI's ranges for its additive penalties; the multiplicative one (HF's, vLLM's) as SGLang bounds it.
PENALTY_RANGE = (-2.0, 2.0)
MAX_REPETITION_PENALTY = 2.0
MAX_LOGPROBS = 20  # alternatives per token: OpenAI's chat ceiling
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
    # OpenAI's: subtracted from a token's logit once if it was generated before (presence), and once per time it was
    # (frequency); the prompt does not count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # HF's and vLLM's: a token seen in the prompt or the output has its logit divided by this when positive,
    # multiplied when negative; 1 changes nothing.
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # None: none; k: each token's logprob and the k likeliest alternatives' (Sequence)

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
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise EngineRequestError(f"{name} must be a number from {low:g} to {high:g} (got {value!r})")
        value = self.repetition_penalty
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_REPETITION_PENALTY:
            raise EngineRequestError(f"repetition_penalty must be a number above 0 and at most "
                                     f"{MAX_REPETITION_PENALTY:g}; 1 disables it (got {value!r})")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise EngineRequestError(f"logprobs must be None or an integer from 0 to {MAX_LOGPROBS} "
                                     f"(got {self.logprobs!r})")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def needs_row(self) -> bool:
        """Whether the sampler needs this row's whole logits, not only its argmax."""
        return not self.greedy or self.penalized or self.logprobs is not None


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability, and the `top` likeliest tokens' (id, logprob), likeliest first, under the
    distribution it was drawn from (the module's docstring says which)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Row(Protocol):
    """What the sampler reads of a sequence (engine/runtime/sequence.py's Sequence), and the list it appends each
    drawn token's logprobs to."""

    seq_id: int
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[TokenLogprobs]


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
    """Turns each sequence's last-token logits into its next token (and its logprobs, when the request asks).

    A request with a seed owns its generator, so its samples do not depend on what else is
    batched with it.
    """

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}
        fault = os.environ.get(FAULT_SEED_ENV)
        self.fault_seed = int(fault) if fault else None

    def sample(self, logits: torch.Tensor | StepLogits, seqs: list[Row]) -> list[int]:
        """Every row's next token; the first row whose sampling fails raises."""
        drawn = self.sample_rows(logits, seqs)
        for token in drawn:
            if isinstance(token, Exception):
                raise token
        return drawn

    def sample_rows(self, logits: torch.Tensor | StepLogits, seqs: list[Row]) -> list[int | Exception]:
        """Every row's next token, or in its place the exception its sampling raised: one request's failure stays
        its own (as asyncio.gather's return_exceptions), and its neighbours' draws are exactly as without it. A
        sequence whose params ask for logprobs gets the token's TokenLogprobs appended to its `logprobs`."""
        if isinstance(logits, torch.Tensor):
            logits = StepLogits.take(logits, [seq.params.needs_row for seq in seqs])
        rows = dict(logits.rows)
        # Only the penalized rows are stacked: copying every sampled row would cost [rows, vocab] floats a step.
        penalized = [i for i in sorted(rows) if seqs[i].params.penalized]
        if penalized:
            stacked = penalize(torch.stack([rows[i] for i in penalized]), [seqs[i] for i in penalized])
            rows.update(zip(penalized, stacked, strict=True))
        tokens: list[int | Exception] = []
        for index, seq in enumerate(seqs):
            try:
                tokens.append(self._draw(rows.get(index), seq, logits.argmax[index]))
            except Exception as error:  # whatever it was, it is this request's alone
                tokens.append(error)
        return tokens

    def _draw(self, row: torch.Tensor | None, seq: Row, argmax: int) -> int:
        param = seq.params
        if self.fault_seed is not None and param.seed == self.fault_seed:
            raise RuntimeError(f"fault injection: sampling fails for seed {param.seed} ({FAULT_SEED_ENV})")
        if row is None:
            return argmax
        if param.greedy:
            scores = row
            token = int(torch.argmax(row)) if param.penalized else argmax
        else:
            scores = _filter(row / param.temperature, param.top_k, param.top_p)
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self._generator(seq)))
        if param.logprobs is not None:
            seq.logprobs.append(_logprobs(scores, token, param.logprobs))
        return token

    def release(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)

    def _generator(self, seq: Row) -> torch.Generator | None:
        if seq.params.seed is None:
            return None
        if seq.seq_id not in self._generators:
            generator = torch.Generator()
            generator.manual_seed(seq.params.seed)
            self._generators[seq.seq_id] = generator
        return self._generators[seq.seq_id]


def penalize(logits: torch.Tensor, seqs: list[Row]) -> torch.Tensor:
    """`logits` [rows, vocab] after each row's sequence's penalties, all rows at once (vLLM's order: repetition,
    then frequency, then presence); a row without penalties comes out exactly as it went in."""
    params = [seq.params for seq in seqs]
    vocab = logits.shape[-1]
    generated = _counts([seq.output_ids for seq in seqs], vocab)
    if any(param.repetition_penalty != 1 for param in params):
        seen = (_counts([seq.prompt_ids for seq in seqs], vocab) > 0) | (generated > 0)
        factor = torch.tensor([[param.repetition_penalty] for param in params]).expand_as(logits)
        factor = torch.where(seen, factor, torch.ones_like(factor))
        logits = torch.where(logits > 0, logits / factor, logits * factor)
    frequency = torch.tensor([[param.frequency_penalty] for param in params])
    presence = torch.tensor([[param.presence_penalty] for param in params])
    return logits - frequency * generated - presence * (generated > 0)


def _counts(ids: list[list[int]], vocab: int) -> torch.Tensor:
    """[rows, vocab] float32: how often each token occurs in each row's ids."""
    padded = torch.nn.utils.rnn.pad_sequence([torch.tensor(row, dtype=torch.long) for row in ids], batch_first=True,
                                             padding_value=vocab)  # the padding lands in a column dropped below
    counts = torch.zeros(len(ids), vocab + 1).scatter_add_(1, padded, torch.ones(padded.shape))
    return counts[:, :vocab]


def _logprobs(scores: torch.Tensor, token: int, alternatives: int) -> TokenLogprobs:
    logprobs = torch.log_softmax(scores, dim=-1)
    top = torch.topk(logprobs, alternatives) if alternatives else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
    return TokenLogprobs(token, float(logprobs[token]), pairs)


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
