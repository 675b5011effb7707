"""The KV pool of a tensor-parallel layout (docs/domain.md §3): width-sharded, tokens sharded by a vector.

Every rank holds 1/n of every layer (and of the embeddings and head), so the per-token cost is
uniform; tokens are spread by a vector such as 2.4:1:1, and the pool is the sum of the ranks'
capacities when the vector matches them. A vector that does not match is bound by the rank it
overloads: pool = min_i capacity_i / share_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.layout import ServingShape
from solvers.capacity import workspace_estimate
from solvers.census import ModelCensus
from solvers.errors import SolverError
from solvers.floors import arming_floor
from solvers.rig import Rig


@dataclass(frozen=True)
class TensorParallelPool:
    vector: tuple[float, ...]
    shares: tuple[float, ...]
    cell_bytes: int
    capacities: tuple[int, ...]  # tokens each rank can hold at the uniform cell
    pool_tokens: int
    sum_of_capacities: int  # the pool a vector matched to the capacities reaches
    binding_rank: int
    reasons: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        return {
            "rule": "tp", "vector": list(self.vector), "shares": list(self.shares), "cell_bytes": self.cell_bytes,
            "capacities": list(self.capacities), "pool_tokens": self.pool_tokens,
            "sum_of_capacities": self.sum_of_capacities, "binding_rank": self.binding_rank,
            "feasible": self.feasible, "reasons": list(self.reasons),
        }


def parse_vector(text: str | Sequence[float], ranks: int) -> tuple[float, ...]:
    """A token-sharding vector from '2.4:1:1' or a list; one positive share per rank."""
    parts = text.split(":") if isinstance(text, str) else list(text)
    try:
        vector = tuple(float(part) for part in parts)
    except (TypeError, ValueError) as error:
        raise SolverError(f"token vector {text!r}: every share must be a number, e.g. 2.4:1:1") from error
    if len(vector) != ranks or any(share <= 0 for share in vector):
        raise SolverError(f"token vector {text!r}: needs {ranks} positive shares, one per rank")
    return vector


def tp_pool(model: ModelCensus, rig: Rig, vector: str | Sequence[float],
            shape: ServingShape | None = None) -> TensorParallelPool:
    shape = shape or rig.shape
    vector = parse_vector(vector, rig.size)
    ranks = rig.size
    total = sum(vector)
    shares = tuple(share / total for share in vector)
    weights = -(-model.weight_bytes_total // ranks)
    state = shape.max_num_seqs * -(-model.state_bytes_per_sequence(shape.state_dtype, shape.kv_dtype,
                                                                     max_model_len=shape.max_model_len) // ranks)
    cell = model.kv_bytes_per_token(shape.kv_dtype)
    if cell == 0:
        raise SolverError(f"model {model.name!r} has no layer whose KV grows with tokens; a TP pool is unbounded")
    capacities, reasons = [], []
    for i, spec in enumerate(rig.ranks):
        workspace = spec.workspace_bytes if spec.workspace_bytes is not None else workspace_estimate(
            model, shape, holds_head=True)
        free = spec.memory_bytes - spec.overhead_bytes - weights - state - workspace
        clearance = free - arming_floor(spec, len(model.attention_layers)).bytes - spec.margin_bytes
        if clearance < 0:
            reasons.append(f"rank {i} ({spec.name}) cannot clear its arming floor by {-clearance} B")
        tokens = max(0, clearance) // cell
        capacities.append(tokens - tokens % shape.block_size)
    pool, binder = min((int(capacities[i] / shares[i]), i) for i in range(ranks))
    return TensorParallelPool(vector, shares, cell, tuple(capacities), pool, sum(capacities), binder, tuple(reasons))
