"""A layout: the cut (which layers each rank serves), the serving shape, and the fingerprint that names the two.

- `Cut`: one positive whole number of layers per rank, in pipeline order. Parsed once where it arrives (a request
  body, an engine reply, a command line) with a message naming what is wrong; then iterated, measured (`len`), and
  turned back into JSON with `to_list`.
- `ServingShape`: context, concurrency, the batch token budget, the KV block size and the dtypes. The planner prices
  a budget for it (solvers/); here it is only data, checked.
- `layout_fingerprint`: 16 hex digits naming a cut and shape (and the ladder rung), so a plan is bound to the layout
  it was priced for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from contracts.canonical import canonical_json
from contracts.errors import ContractError
from contracts.reading import show

__all__ = ["DTYPE_WIDTHS", "Cut", "ServingShape", "dtype_width", "layout_fingerprint"]

# The dtypes a config, a shape or an operator may name, with their bytes per element.
DTYPE_WIDTHS: Mapping[str, int] = MappingProxyType({
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2,
    "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
})


def dtype_width(dtype: str) -> int:
    """Bytes per element of `dtype` (fp32 4, bf16/fp16 2, fp8 1); `torch.` prefixes and case are ignored."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_WIDTHS:
        raise ContractError(f"unknown dtype {dtype!r}; use one of: {', '.join(sorted(set(DTYPE_WIDTHS)))}")
    return DTYPE_WIDTHS[key]


def _is_layer_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Cut(Sequence[int]):
    """Layers per rank, in pipeline order: rank i serves `layers[i]` consecutive layers after rank i-1's. A sequence
    of ints, so the planner's arithmetic takes it as it is; equal only to another Cut."""

    layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple) or not self.layers or not all(map(_is_layer_count, self.layers)):
            raise ContractError(f"cut: expected a positive whole number of layers per rank, got {show(self.layers)}")

    @classmethod
    def parse(cls, value: object, where: str = "cut", *, ranks: int | None = None,
              num_layers: int | None = None) -> Cut:
        """A cut from JSON: one positive whole number of layers per rank; with `ranks` exactly that many entries, with
        `num_layers` summing to the model's layers."""
        if isinstance(value, Cut):
            value = value.to_list()
        if not isinstance(value, list | tuple):
            count = f"{ranks} " if ranks is not None else ""
            raise ContractError(f"{where}: expected a list of {count}layer counts (one per rank), "
                                f"got {type(value).__name__}")
        if ranks is not None and len(value) != ranks:
            raise ContractError(f"{where}: has {len(value)} entries; the rig has {ranks} ranks")
        if not value:
            raise ContractError(f"{where}: expected at least one rank's layer count")
        for index, layers in enumerate(value):
            if isinstance(layers, bool) or not isinstance(layers, int):
                raise ContractError(f"{where}[{index}]: expected a whole number of layers, got "
                                    f"{type(layers).__name__} {show(layers)}")
            if layers < 1:
                raise ContractError(f"{where}[{index}]: every rank needs at least 1 layer (got {show(layers)})")
            if num_layers is not None and layers > num_layers:
                raise ContractError(f"{where}[{index}]: {show(layers)} layers is more than the model's {num_layers}")
        if num_layers is not None and sum(value) != num_layers:
            raise ContractError(f"{where}: sums to {sum(value)} layers; the model has {num_layers}")
        return cls(tuple(value))

    @classmethod
    def from_text(cls, text: str) -> Cut:
        """'28,20,16' -> Cut((28, 20, 16)), with a clear error for anything else (a command line's cut)."""
        try:
            layers = tuple(int(part) for part in text.split(","))
        except ValueError as error:
            raise ContractError(f"cut {text!r}: expected comma-separated layer counts such as 28,20,16") from error
        if any(n < 1 for n in layers):
            raise ContractError(f"cut {text!r}: every rank needs at least one layer")
        return cls(layers)

    def __iter__(self) -> Iterator[int]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: Any) -> Any:  # a rank's layers, or a slice of them as a tuple
        return self.layers[index]

    def __str__(self) -> str:
        return str(list(self.layers))  # as messages have always shown a cut: [8, 4, 4]

    @property
    def num_layers(self) -> int:
        return sum(self.layers)

    def ranges(self) -> tuple[range, ...]:
        """The layers each rank serves: Cut((2, 3)).ranges() == (range(0, 2), range(2, 5))."""
        starts = [sum(self.layers[:rank]) for rank in range(len(self.layers))]
        return tuple(range(start, start + layers) for start, layers in zip(starts, self.layers, strict=True))

    def to_list(self) -> list[int]:
        return list(self.layers)

    def to_text(self) -> str:
        """'28,20,16': the inverse of from_text."""
        return ",".join(map(str, self.layers))


SHAPE_COUNTS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size")
SHAPE_DTYPES = ("kv_dtype", "state_dtype")


@dataclass(frozen=True)
class ServingShape:
    """The serving shape a budget is priced for: context, concurrency, dtypes and the batch token budget."""

    max_model_len: int = 32768
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    # KV is handed out in blocks of this many tokens, so a pool is a whole number of blocks.
    block_size: int = 16
    kv_dtype: str | None = None  # None: the model's dtype
    state_dtype: str | None = None  # None: the model's dtype

    def __post_init__(self) -> None:
        for field_name in SHAPE_COUNTS:
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ContractError(f"shape.{field_name}: must be a positive integer (got {value!r})")
        for field_name in SHAPE_DTYPES:
            value = getattr(self, field_name)
            if value is not None:
                dtype_width(value)  # raises a ContractError naming the unknown dtype

    @classmethod
    def from_dict(cls, data: Any, where: str = "shape") -> ServingShape:
        if not isinstance(data, dict):
            raise ContractError(f"{where}: expected an object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ContractError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def layout_fingerprint(cut: Sequence[int] | Cut, shape: ServingShape, rung: Sequence[int] | Cut | None = None) -> str:
    """16 hex digits naming a layout: any change of cut, shape or rung changes it."""
    content = {"cut": list(cut), "shape": shape.to_dict(), "rung": None if rung is None else list(rung)}
    return hashlib.sha256(canonical_json(content).encode("ascii")).hexdigest()[:16]
