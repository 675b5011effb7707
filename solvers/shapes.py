"""Shape arithmetic (docs/domain.md §8): what a KV pool holds, whether a contract fits, the largest context.

A contract of `seqs x max_model_len` needs `pool_bytes - safety_band >= seqs x max_model_len x
bytes_per_token`. The safety band stays free after everything because a boot is not proof that the
runtime survives; a shape that does not fit is refused with the numbers and the inequality that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from contracts.errors import ContractError
from solvers.capacity import CutPricer, PoolResult
from solvers.census import ModelCensus
from solvers.errors import SolverError
from solvers.rig import Rig
from solvers.units import format_bytes, parse_size

GIB = 2**30
DEFAULT_SAFETY_BAND = 2 * GIB
DEFAULT_STEP = 16384


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SolverError(f"{name}: must be a positive whole number (got {value!r})")
    return value


def tokens(pool_bytes: int, bytes_per_token: int) -> int:
    """Whole tokens a pool of `pool_bytes` holds."""
    return max(0, pool_bytes) // _positive("bytes_per_token", bytes_per_token)


def concurrency(token_count: int, max_model_len: int) -> float:
    """How many sequences of full `max_model_len` the tokens hold at once."""
    return token_count / _positive("max_model_len", max_model_len)


def pool_needed(seqs: int, max_model_len: int, bytes_per_token: int) -> int:
    """Bytes a contract of `seqs` sequences of `max_model_len` tokens needs."""
    return (_positive("seqs", seqs) * _positive("max_model_len", max_model_len)
            * _positive("bytes_per_token", bytes_per_token))


@dataclass(frozen=True)
class ShapeFit:
    pool_bytes: int
    safety_band_bytes: int
    bytes_per_token: int
    max_model_len: int
    seqs: int
    tokens: int  # pool_bytes // bytes_per_token
    usable_tokens: int  # after the safety band
    concurrency: float  # usable_tokens / max_model_len
    needed_bytes: int
    refusal: str | None

    @property
    def fits(self) -> bool:
        return self.refusal is None

    def to_dict(self) -> dict:
        return {"pool_bytes": self.pool_bytes, "safety_band_bytes": self.safety_band_bytes,
                "usable_bytes": self.pool_bytes - self.safety_band_bytes, "bytes_per_token": self.bytes_per_token,
                "max_model_len": self.max_model_len, "seqs": self.seqs, "tokens": self.tokens,
                "usable_tokens": self.usable_tokens, "concurrency": round(self.concurrency, 6),
                "needed_bytes": self.needed_bytes, "fits": self.fits, "refusal": self.refusal}


def safety_band(value: int | str | None) -> int:
    """The band in bytes from an int or a size such as '3GiB'; None means the default 2 GiB."""
    return DEFAULT_SAFETY_BAND if value is None else parse_size(value, "safety_band")


def fit(pool_bytes: int, bytes_per_token: int, max_model_len: int, seqs: int,
        safety_band_bytes: int | str | None = None) -> ShapeFit:
    """Tokens, concurrency and whether `seqs x max_model_len` fits in the pool less the safety band."""
    if isinstance(pool_bytes, bool) or not isinstance(pool_bytes, int) or pool_bytes < 0:
        raise SolverError(f"pool_bytes: must be a non-negative whole number of bytes (got {pool_bytes!r})")
    band = safety_band(safety_band_bytes)
    needed = pool_needed(seqs, max_model_len, bytes_per_token)
    usable = pool_bytes - band
    usable_tokens = tokens(usable, bytes_per_token)
    refusal = None
    if usable < needed:
        refusal = (f"does not fit: pool {pool_bytes} B ({format_bytes(pool_bytes)}) - safety band {band} B "
                   f"({format_bytes(band)}) = {usable} B < needed {seqs} seqs x {max_model_len} tokens x "
                   f"{bytes_per_token} B/token = {needed} B ({format_bytes(needed)}); short by {needed - usable} B")
    return ShapeFit(pool_bytes, band, bytes_per_token, max_model_len, seqs, tokens(pool_bytes, bytes_per_token),
                    usable_tokens, concurrency(usable_tokens, max_model_len), needed, refusal)


@dataclass(frozen=True)
class LargestLen:
    seqs: int
    start: int
    step: int
    max_model_len: int | None  # None when refused
    fit: ShapeFit  # at the chosen length, or at the smallest step tried when refused
    tried: tuple[tuple[int, bool], ...]  # (max_model_len, fits) in the order tried
    refusal: str | None

    def to_dict(self) -> dict:
        return {"seqs": self.seqs, "start": self.start, "step": self.step, "max_model_len": self.max_model_len,
                "fit": self.fit.to_dict(), "tried": [{"max_model_len": n, "fits": ok} for n, ok in self.tried],
                "refusal": self.refusal}


def largest_max_model_len(pool_bytes: int, bytes_per_token: int, seqs: int, *, start: int | None = None,
                          model: ModelCensus | None = None, step: int = DEFAULT_STEP,
                          safety_band_bytes: int | str | None = None) -> LargestLen:
    """Step down from `start` (default: the model's max_position_embeddings) by `step` until the contract
    fits, then try one bonus step up of half a step; refused, with the arithmetic, if no step fits."""
    ceiling = model.max_position_embeddings if model is not None else None
    if start is None and ceiling is None:
        raise SolverError("no max_model_len to start from: give start, or a model whose config states "
                          "max_position_embeddings")
    start = _positive("start", start if start is not None else ceiling)
    if ceiling is not None and start > ceiling:
        raise SolverError(f"start {start} exceeds the model's max_position_embeddings {ceiling}; start at or below it")
    step = _positive("step", step)
    tried: list[tuple[int, bool]] = []
    length, result = start, None
    while length > 0:
        result = fit(pool_bytes, bytes_per_token, length, seqs, safety_band_bytes)
        tried.append((length, result.fits))
        if result.fits:
            break
        length -= step
    assert result is not None  # start > 0, so the loop ran at least once
    if not result.fits:
        return LargestLen(seqs, start, step, None, result, tuple(tried),
                          f"even max_model_len {result.max_model_len} (the smallest step) {result.refusal}")
    bonus = length + step // 2
    if length < start and step // 2 > 0:  # one smaller step back up: the last full step may overshoot
        trial = fit(pool_bytes, bytes_per_token, bonus, seqs, safety_band_bytes)
        tried.append((bonus, trial.fits))
        if trial.fits:
            result = trial
    return LargestLen(seqs, start, step, result.max_model_len, result, tuple(tried), None)


@dataclass(frozen=True)
class RigShape:
    """A shape priced on a model + rig + cut: the PP pool (capacity's min rule) and the fit against it."""

    pricing: PoolResult
    pool_tokens: int | None
    binding_rank: int | None
    bytes_per_token: int
    fit: ShapeFit | None  # None when the cut itself was refused
    refusal: str | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"cut": list(self.pricing.cut), "pool_tokens": self.pool_tokens,
                "pool_bytes": None if self.pool_tokens is None else self.pool_tokens * self.bytes_per_token,
                "bytes_per_token": self.bytes_per_token, "binding_rank": self.binding_rank,
                "fit": None if self.fit is None else self.fit.to_dict(), "fits": self.fit is not None and
                self.fit.fits, "refusal": self.refusal, "notes": list(self.notes), "pricing": self.pricing.to_dict()}


def fit_on_rig(model: ModelCensus, rig: Rig, max_model_len: int, seqs: int, *, cut: Sequence[int] | None = None,
               kv_dtype: str | None = None, safety_band_bytes: int | str | None = None) -> RigShape:
    """Price `seqs x max_model_len` on `rig` at `cut` (default: the incumbent) through capacity.CutPricer.

    The pool is pool_tokens x the model's KV bytes per token, i.e. the binding rank's tokens in bytes.
    """
    notes: list[str] = []
    if cut is None:
        cut, note = rig.incumbent_for(model.num_layers)
        notes += [note] if note else []
    try:
        shape = replace(rig.shape, max_model_len=_positive("max_model_len", max_model_len),
                        max_num_seqs=_positive("seqs", seqs), kv_dtype=kv_dtype or rig.shape.kv_dtype)
    except ContractError as error:  # an unknown dtype: bad input to the planner like any other
        raise SolverError(str(error)) from None
    per_token = model.kv_bytes_per_token(shape.kv_dtype)
    if per_token == 0:
        raise SolverError(f"model {model.name!r} has no layer whose KV grows with tokens: its pool is not token-bound")
    pricing = CutPricer(model, rig, shape).price(cut)
    rank_refusals = [rank.refusal for rank in pricing.ranks if rank.refusal]
    if rank_refusals:
        return RigShape(pricing, None, None, per_token, None, f"cut {list(pricing.cut)} refused: "
                        + "; ".join(rank_refusals), tuple(notes))
    # capacity refuses a pool shorter than one sequence without a pool number; that is this shape not
    # fitting, so read the binder from the rank table (the same min rule) to show the failing arithmetic.
    binder = min((r for r in pricing.ranks if r.allowed_tokens is not None), key=lambda r: (r.allowed_tokens, r.rank))
    band = safety_band_bytes if safety_band_bytes is not None else rig.safety_band_bytes
    result = fit(binder.allowed_tokens * per_token, per_token, max_model_len, seqs, band)
    return RigShape(pricing, binder.allowed_tokens, binder.rank, per_token, result, result.refusal, tuple(notes))
