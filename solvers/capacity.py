"""The budget chain of a rank and the KV pool of a layout (docs/domain.md §3, §4).

Pipeline (PP) layouts are layer-sharded: pool = min over ranks of allowed tokens (the min rule).
Tensor-parallel (TP) layouts are width-sharded with a token-sharding vector: the sum rule.
The two rules are separate functions on purpose; a PP pool refuses a vector outright.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from contracts.layout import ServingShape
from solvers.census import ModelCensus
from solvers.dtypes import width
from solvers.errors import SolverError
from solvers.floors import ArmingFloor, arming_floor
from solvers.rig import Rig
from solvers.units import format_bytes

NO_BIND = 1 << 62  # allowed tokens of a rank with no attention layers: it never binds
REFUSED = -1


@dataclass(frozen=True)
class RankBudget:
    """One row of the per-rank table: where every byte of the rank goes, and what the pool gets."""

    rank: int
    name: str
    layers: tuple[int, int]  # [start, stop) of the model's layers on this rank
    attention_layers: int
    budget_bytes: int
    overhead_bytes: int
    weights_bytes: int
    state_bytes: int
    workspace_bytes: int
    arena_bytes: int
    floor: ArmingFloor
    margin_bytes: int
    cell_bytes: int  # KV bytes per token on this rank
    refusal: str | None
    block_size: int = 1  # tokens per KV block: the pool is a whole number of blocks

    @property
    def free_bytes(self) -> int:
        """free_at_measure: what is left after everything resident (the 'rest')."""
        return (self.budget_bytes - self.overhead_bytes - self.weights_bytes - self.state_bytes
                - self.workspace_bytes - self.arena_bytes)

    @property
    def allowed_tokens(self) -> int | None:
        """Tokens this rank can hold under its floor, in whole KV blocks; None without attention layers."""
        if self.cell_bytes == 0:
            return None
        tokens = max(0, (self.free_bytes - self.floor.bytes - self.margin_bytes) // self.cell_bytes)
        return tokens - tokens % self.block_size

    def table_row(self, pool_tokens: int | None) -> dict:
        allowed = self.allowed_tokens
        used = pool_tokens if (allowed is not None and pool_tokens is not None) else 0
        return {
            "rank": self.rank, "name": self.name, "layers": list(self.layers),
            "attention_layers": self.attention_layers,
            "budget": self.budget_bytes, "overhead": self.overhead_bytes, "weights": self.weights_bytes,
            "state": self.state_bytes, "workspace": self.workspace_bytes, "arena": self.arena_bytes,
            "rest": self.free_bytes, "floor": self.floor.bytes, "floor_detail": self.floor.to_dict(),
            "margin": self.margin_bytes, "cell_bytes": self.cell_bytes,
            "allowed": allowed, "used": used,
            "slack": None if allowed is None or pool_tokens is None else allowed - pool_tokens,
            "used_bytes": used * self.cell_bytes, "refusal": self.refusal,
        }


@dataclass(frozen=True)
class PoolResult:
    cut: tuple[int, ...]
    ranks: tuple[RankBudget, ...]
    rule: str  # "pp" or "tp"
    pool_tokens: int | None  # None when refused, or when no rank holds an attention layer
    binding_rank: int | None
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.reasons

    @property
    def attention_split(self) -> tuple[int, ...]:
        return tuple(rank.attention_layers for rank in self.ranks)

    def table(self) -> list[dict]:
        return [rank.table_row(self.pool_tokens) for rank in self.ranks]

    def to_dict(self) -> dict:
        return {
            "cut": list(self.cut), "rule": self.rule, "feasible": self.feasible,
            "pool_tokens": self.pool_tokens, "binding_rank": self.binding_rank,
            "attention_split": list(self.attention_split), "reasons": list(self.reasons),
            "notes": list(self.notes), "ranks": self.table(),
        }


@dataclass(frozen=True)
class WeightsExceedRig:
    """The model's weights alone exceed what the rig's ranks hold together, so every cut is refused:
    whatever the cut, the ranks' free bytes sum below zero and some rank cannot clear its floor."""

    model: str
    rig: str
    needed_bytes: int  # every weight, with the tied lm_head's copy on a multi-rank rig
    available_bytes: int  # the ranks' budgets less their non-torch overhead

    @property
    def message(self) -> str:
        return (f"the weights alone exceed the rig: {self.model} needs {format_bytes(self.needed_bytes)} of weights, "
                f"rig {self.rig} holds {format_bytes(self.available_bytes)} (its ranks' budgets less overhead); "
                f"short by {format_bytes(self.needed_bytes - self.available_bytes)}")

    def to_dict(self) -> dict:
        return {"feasible": False, "refusal": self.message, "model": self.model, "rig": self.rig,
                "weights_bytes": self.needed_bytes, "available_bytes": self.available_bytes}


def weights_exceed_rig(model: ModelCensus, rig: Rig) -> WeightsExceedRig | None:
    """The refusal to print instead of a table of refused cuts when the weights cannot fit at all."""
    tied_copy = model.embedding_bytes if model.tied_embeddings and rig.size > 1 else 0  # as CutPricer places it
    needed = model.weight_bytes_total + tied_copy
    available = sum(rank.memory_bytes - rank.overhead_bytes for rank in rig.ranks)
    if needed <= available:
        return None
    return WeightsExceedRig(model.name or model.model_type, rig.name, needed, available)


def workspace_estimate(model: ModelCensus, shape: ServingShape, holds_head: bool) -> int:
    """Activations for one batch of max_num_batched_tokens, plus fp32 logits on the head rank.

    Used only when the rig gives no measured workspace for a rank.
    """
    activations = shape.max_num_batched_tokens * (4 * model.hidden_size + 2 * model.intermediate_size)
    logits = shape.max_num_seqs * model.vocab_size * width("fp32") if holds_head else 0
    return activations * width(model.dtype) + logits


class CutPricer:
    """Prices any contiguous range of layers on any rank in O(1), from prefix sums.

    One pricer serves single cuts (`price`) and the frontier's search (`allowed_tokens`).
    """

    def __init__(self, model: ModelCensus, rig: Rig, shape: ServingShape | None = None,
                 arena_bytes: Sequence[int] | None = None):
        self.model, self.rig = model, rig
        self.shape = shape or rig.shape
        if arena_bytes is not None and len(arena_bytes) != rig.size:
            raise SolverError(f"arena_bytes has {len(arena_bytes)} entries; the rig has {rig.size} ranks")
        self.arena_bytes = tuple(arena_bytes) if arena_bytes is not None else (0,) * rig.size
        kv_dtype, state_dtype = self.shape.kv_dtype, self.shape.state_dtype
        indices = range(model.num_layers)
        self._weights = [0, *accumulate(model.layer_weight_bytes(i) for i in indices)]
        self._kv = [0, *accumulate(model.layer_kv_bytes_per_token(i, kv_dtype) for i in indices)]
        self._state = [0, *accumulate(
            model.layer_state_bytes_per_sequence(i, state_dtype, kv_dtype, self.shape.max_model_len) for i in indices)]
        self._attention = [0, *accumulate(int(layer.grows_with_tokens) for layer in model.layers)]
        last = rig.size - 1
        # A tied lm_head is the embedding matrix; a last rank that is not also first holds its own copy.
        tied_copy = model.embedding_bytes if model.tied_embeddings and rig.size > 1 else 0
        self._fixed = [
            model.embedding_bytes * (i == 0) + (model.head_bytes + tied_copy) * (i == last) for i in range(rig.size)
        ]
        self._workspace = [
            spec.workspace_bytes if spec.workspace_bytes is not None
            else workspace_estimate(model, self.shape, holds_head=(i == last))
            for i, spec in enumerate(rig.ranks)
        ]

    def attention_count(self, start: int, stop: int) -> int:
        return self._attention[stop] - self._attention[start]

    def rank_budget(self, rank: int, start: int, stop: int) -> RankBudget:
        spec = self.rig.ranks[rank]
        attention = self.attention_count(start, stop)
        budget = RankBudget(
            rank=rank, name=spec.name, layers=(start, stop), attention_layers=attention,
            budget_bytes=spec.memory_bytes, overhead_bytes=spec.overhead_bytes,
            weights_bytes=self._weights[stop] - self._weights[start] + self._fixed[rank],
            state_bytes=self.shape.max_num_seqs * (self._state[stop] - self._state[start]),
            workspace_bytes=self._workspace[rank], arena_bytes=self.arena_bytes[rank],
            floor=arming_floor(spec, attention), margin_bytes=spec.margin_bytes,
            cell_bytes=self._kv[stop] - self._kv[start], refusal=None, block_size=self.shape.block_size,
        )
        clearance = budget.free_bytes - budget.floor.bytes - budget.margin_bytes
        if clearance < 0:
            refusal = (f"rank {rank} ({spec.name}) cannot clear its arming floor: free {budget.free_bytes} B "
                       f"- floor {budget.floor.bytes} B - margin {budget.margin_bytes} B = {clearance} B "
                       f"({format_bytes(clearance)})")
            return _with_refusal(budget, refusal)
        return budget

    def allowed_tokens(self, rank: int, start: int, stop: int) -> int:
        """Fast path for search: allowed tokens, REFUSED when under the floor, NO_BIND without attention."""
        budget = self.rank_budget(rank, start, stop)
        if budget.refusal is not None:
            return REFUSED
        allowed = budget.allowed_tokens
        return NO_BIND if allowed is None else allowed

    def price(self, cut: Sequence[int]) -> PoolResult:
        """The PP pool of `cut` (min rule), with the per-rank table and any refusal reasons."""
        cut = check_cut(cut, self.model.num_layers, self.rig.size)
        bounds = [0, *accumulate(cut)]
        ranks = tuple(self.rank_budget(i, bounds[i], bounds[i + 1]) for i in range(len(cut)))
        reasons = [rank.refusal for rank in ranks if rank.refusal]
        binding = [rank for rank in ranks if rank.allowed_tokens is not None]
        pool = binder = None
        if binding:
            binder = min(binding, key=lambda rank: (rank.allowed_tokens, rank.rank))
            pool, binder = binder.allowed_tokens, binder.rank
        if not reasons and pool is not None and pool < self.shape.max_model_len:
            reasons.append(f"pool {pool} tokens (bound by rank {binder}) cannot hold one sequence of "
                           f"max_model_len {self.shape.max_model_len}")
        return PoolResult(tuple(cut), ranks, "pp", None if reasons else pool, None if reasons else binder,
                          tuple(reasons))


def _with_refusal(budget: RankBudget, refusal: str) -> RankBudget:
    return replace(budget, refusal=refusal)


def check_cut(cut: Sequence[int], num_layers: int, ranks: int) -> tuple[int, ...]:
    """A cut must give every rank a positive whole number of layers and cover the model exactly."""
    if isinstance(cut, str | bytes) or not isinstance(cut, Sequence):
        raise SolverError(f"a cut is a list of layer counts, one per rank (got {cut!r})")
    if len(cut) != ranks:
        raise SolverError(f"cut {list(cut)} has {len(cut)} entries; the rig has {ranks} ranks")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut):
        raise SolverError(f"cut {list(cut)}: every rank needs a positive whole number of layers")
    if sum(cut) != num_layers:
        raise SolverError(f"cut {list(cut)} sums to {sum(cut)} layers; the model has {num_layers}")
    return tuple(cut)


def pp_pool(model: ModelCensus, rig: Rig, cut: Sequence[int], shape: ServingShape | None = None, *,
            arena_bytes: Sequence[int] | None = None, token_vector: object = None) -> PoolResult:
    """Pool of a pipeline layout: min over ranks of allowed tokens. Ranks without attention never bind."""
    if token_vector is not None:
        raise TypeError("a PP pool is layer-sharded: every rank stores all tokens of its own layers, so a "
                        "token-sharding vector does not apply (it belongs to tp_pool)")
    return CutPricer(model, rig, shape, arena_bytes).price(cut)
