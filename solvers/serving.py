"""The serving shape a budget is priced for: context, concurrency, dtypes and the batch token budget."""

from __future__ import annotations

from dataclasses import dataclass

from solvers.dtypes import width
from solvers.errors import SolverError


@dataclass(frozen=True)
class ServingShape:
    max_model_len: int = 32768
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    # KV is handed out in blocks of this many tokens, so a pool is a whole number of blocks.
    block_size: int = 16
    kv_dtype: str | None = None  # None: the model's dtype
    state_dtype: str | None = None  # None: the model's dtype

    def __post_init__(self) -> None:
        for field_name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SolverError(f"shape.{field_name}: must be a positive integer (got {value!r})")
        for field_name in ("kv_dtype", "state_dtype"):
            value = getattr(self, field_name)
            if value is not None:
                width(value)  # raises a SolverError naming the unknown dtype

    @classmethod
    def from_dict(cls, data: dict, where: str = "shape") -> ServingShape:
        if not isinstance(data, dict):
            raise SolverError(f"{where}: expected an object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise SolverError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
