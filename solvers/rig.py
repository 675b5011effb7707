"""Rig profiles: the ranks of a serving rig and what was measured on them (docs/architecture.md §3.1).

One schema, read by `rig_from_dict` and written by `Rig.to_dict`, so a printed rig loads back as the
same Rig; docs/planner.md documents every field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contracts.errors import ContractError
from contracts.layout import ServingShape
from solvers.errors import RigError, SolverError
from solvers.rig_fields import FieldReader
from solvers.units import exact_size

RIG_DIR = Path(__file__).resolve().parent / "rigs"
DEFAULT_NOISE_FLOOR = 0.141  # A-vs-A spread measured on the reference rig


@dataclass(frozen=True)
class SeamReserve:
    """The peak drawn while switching layout, by named component (required: no default exists).

    `measured` is keyed by how many attention layers the rank holds, because the reserve moves
    with the attention split; any other layout uses `estimate`, which says so with its uncertainty.
    """

    estimate: dict[str, int]
    uncertainty_bytes: int
    measured: dict[int, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"estimate": _sizes(self.estimate), "uncertainty": exact_size(self.uncertainty_bytes)}
        if self.measured:
            data["measured"] = {str(layers): _sizes(parts) for layers, parts in sorted(self.measured.items())}
        return data


@dataclass(frozen=True)
class RankSpec:
    name: str
    device: str
    memory_bytes: int
    overhead_bytes: int
    h2d_bytes_per_s: float
    corridor_band_bytes: int
    corridor_tolerance: float
    seam_reserve: SeamReserve
    stage_ms: float | None = None  # measured at the rig's incumbent cut
    margin_bytes: int = 0
    workspace_bytes: int | None = None  # measured; None: estimated from the model and shape

    def to_dict(self) -> dict:
        data: dict[str, Any] = {
            "name": self.name, "device": self.device, "memory": exact_size(self.memory_bytes),
            "overhead": exact_size(self.overhead_bytes),
            "h2d_bandwidth": exact_size(round(self.h2d_bytes_per_s), decimal=True) + "/s",
            "corridor": {"band": exact_size(self.corridor_band_bytes), "tolerance": self.corridor_tolerance},
            "seam_reserve": self.seam_reserve.to_dict(),
        }
        if self.stage_ms is not None:
            data["stage_ms"] = self.stage_ms
        if self.margin_bytes:
            data["margin"] = exact_size(self.margin_bytes)
        if self.workspace_bytes is not None:
            data["workspace"] = exact_size(self.workspace_bytes)
        return data


@dataclass(frozen=True)
class Rig:
    name: str
    ranks: tuple[RankSpec, ...]
    incumbent_cut: tuple[int, ...] | None
    shape: ServingShape
    noise_floor: float = DEFAULT_NOISE_FLOOR
    booted_cuts: tuple[tuple[int, ...], ...] = ()
    reference_model: str | None = None
    description: str = ""
    source: str = "<rig>"
    safety_band_bytes: int | None = None  # free band kept after everything; None: the planner's default (2 GiB)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def stage_ms(self) -> list[float] | None:
        """Measured stage times at the incumbent, or None unless every rank has one."""
        times = [rank.stage_ms for rank in self.ranks]
        return None if any(time is None for time in times) else times

    def incumbent_for(self, num_layers: int) -> tuple[tuple[int, ...], str | None]:
        """The incumbent cut for a model of `num_layers`; a proportional split when it does not fit.

        Returns (cut, note); the note says when and why the incumbent was rescaled.
        """
        declared = self.incumbent_cut or tuple([1] * self.size)
        if sum(declared) == num_layers:
            return declared, None
        cut = proportional_split(num_layers, declared)
        return cut, (
            f"rig {self.name!r} incumbent {list(declared)} sums to {sum(declared)} layers, the model has "
            f"{num_layers}; using the proportional split {list(cut)}"
        )

    def is_booted(self, cut: tuple[int, ...]) -> bool:
        return tuple(cut) in self.booted_cuts or tuple(cut) == self.incumbent_cut

    def to_dict(self) -> dict:
        """The rig in the schema rig_from_dict reads (sizes with units), so it round-trips to an equal Rig."""
        data: dict[str, Any] = {
            "name": self.name, "description": self.description, "reference_model": self.reference_model,
            "incumbent_cut": None if self.incumbent_cut is None else list(self.incumbent_cut),
            "noise_floor": self.noise_floor, "shape": self.shape.to_dict(),
            "ranks": [rank.to_dict() for rank in self.ranks],
        }
        if self.booted_cuts:
            data["booted_cuts"] = [list(cut) for cut in self.booted_cuts]
        if self.safety_band_bytes is not None:
            data["safety_band"] = exact_size(self.safety_band_bytes)
        return data


def _sizes(components: dict[str, int]) -> dict[str, str]:
    return {name: exact_size(count) for name, count in components.items()}


def proportional_split(num_layers: int, weights: tuple[int, ...] | list[float]) -> tuple[int, ...]:
    """Split `num_layers` in proportion to `weights` (largest remainder), at least one layer a rank."""
    ranks = len(weights)
    if num_layers < ranks:
        raise SolverError(f"cannot split {num_layers} layers over {ranks} ranks: every rank needs a layer")
    spare = num_layers - ranks
    total = float(sum(weights))
    shares = [spare * weight / total for weight in weights]
    cut = [1 + int(share) for share in shares]
    by_remainder = sorted(range(ranks), key=lambda i: (-(shares[i] - int(shares[i])), i))
    for i in by_remainder[: num_layers - sum(cut)]:
        cut[i] += 1
    return tuple(cut)


# --- loading and validation ------------------------------------------------------------------

# The fields a rig file may hold, by level (docs/planner.md, "The rig file", documents each one).
RIG_FIELDS = {"name", "description", "ranks", "incumbent_cut", "shape", "noise_floor", "booted_cuts",
              "reference_model", "safety_band"}
RANK_FIELDS = {"name", "device", "memory", "overhead", "h2d_bandwidth", "corridor", "seam_reserve", "stage_ms",
               "margin", "workspace"}
CORRIDOR_FIELDS = {"band", "tolerance"}
SEAM_RESERVE_FIELDS = {"estimate", "uncertainty", "measured"}


def builtin_rigs() -> list[str]:
    return sorted(path.stem for path in RIG_DIR.glob("*.json"))


def load_rig(source: str | Path) -> Rig:
    """A built-in rig name (`reference`, `h200`, `h200x8`, `cpu-demo`) or a YAML/JSON file."""
    text = str(source)
    builtin = RIG_DIR / f"{text}.json"
    path = builtin if "/" not in text and builtin.is_file() else Path(text)
    if not path.is_file():
        raise RigError(f"rig {text!r}: no such built-in name or file; built-in rigs: {', '.join(builtin_rigs())}")
    try:
        raw = path.read_text()
        data = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise RigError(f"rig {path}: not readable as {kind} ({error})") from error
    return rig_from_dict(data, source=str(path), default_name=path.stem)


def rig_from_dict(data: Any, source: str = "<rig>", default_name: str = "rig") -> Rig:
    """Validate a parsed rig profile; every error names the file and the field."""
    reader = FieldReader(source)
    if not isinstance(data, dict):
        raise reader.error("", f"a rig profile must be an object, got {type(data).__name__}")
    reader.only(data, "", RIG_FIELDS)
    ranks_data = data.get("ranks")
    if not isinstance(ranks_data, list) or not ranks_data:
        raise reader.error("ranks", "a rig needs a non-empty list of ranks")
    ranks = tuple(_rank(reader, f"ranks[{i}]", item) for i, item in enumerate(ranks_data))
    names = [rank.name for rank in ranks]
    if len(set(names)) != len(names):
        raise reader.error("ranks", f"rank names must be unique (got {names})")
    incumbent = data.get("incumbent_cut")
    if incumbent is not None:
        incumbent = reader.cut(incumbent, "incumbent_cut", len(ranks))
    booted = tuple(
        reader.cut(cut, f"booted_cuts[{i}]", len(ranks)) for i, cut in enumerate(data.get("booted_cuts", []))
    )
    try:
        shape = ServingShape.from_dict(data.get("shape", {}))
    except ContractError as error:
        raise reader.error("", str(error)) from error
    noise_floor = data.get("noise_floor", DEFAULT_NOISE_FLOOR)
    if isinstance(noise_floor, bool) or not isinstance(noise_floor, int | float) or not 0 <= noise_floor < 1:
        raise reader.error("noise_floor", f"must be a fraction in [0, 1), e.g. 0.141 (got {noise_floor!r})")
    return Rig(
        name=str(data.get("name", default_name)), ranks=ranks, incumbent_cut=incumbent, shape=shape,
        noise_floor=float(noise_floor), booted_cuts=booted, reference_model=data.get("reference_model"),
        description=str(data.get("description", "")), source=source,
        safety_band_bytes=None if data.get("safety_band") is None else reader.size(data["safety_band"], "safety_band"),
    )


def _rank(reader: FieldReader, where: str, item: Any) -> RankSpec:
    if not isinstance(item, dict):
        raise reader.error(where, f"a rank must be an object, got {type(item).__name__}")
    reader.only(item, where, RANK_FIELDS)
    for required in ("name", "memory", "overhead", "h2d_bandwidth", "corridor", "seam_reserve"):
        if item.get(required) is None:
            raise reader.error(f"{where}.{required}", "is required" + (
                " (the measured switching peak per rank: there is no default)" if required == "seam_reserve" else ""))
    memory = reader.size(item["memory"], f"{where}.memory")
    if memory <= 0:
        raise reader.error(f"{where}.memory", "must be positive")
    corridor = item["corridor"]
    if not isinstance(corridor, dict) or "band" not in corridor:
        raise reader.error(f"{where}.corridor", "needs {band: size, tolerance: fraction}, e.g. {band: 1GiB, "
                                                "tolerance: 0.2}")
    reader.only(corridor, f"{where}.corridor", CORRIDOR_FIELDS)
    tolerance = corridor.get("tolerance", 0.0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
        raise reader.error(f"{where}.corridor.tolerance", f"must be a fraction in [0, 1) (got {tolerance!r})")
    stage_ms = item.get("stage_ms")
    if stage_ms is not None and (isinstance(stage_ms, bool) or not isinstance(stage_ms, int | float) or stage_ms <= 0):
        raise reader.error(f"{where}.stage_ms", f"must be a positive number of milliseconds (got {stage_ms!r})")
    workspace = item.get("workspace")
    return RankSpec(
        name=str(item["name"]),
        device=str(item.get("device", "cpu")),
        memory_bytes=memory,
        overhead_bytes=reader.size(item["overhead"], f"{where}.overhead"),
        h2d_bytes_per_s=reader.bandwidth(item["h2d_bandwidth"], f"{where}.h2d_bandwidth"),
        corridor_band_bytes=reader.size(corridor["band"], f"{where}.corridor.band"),
        corridor_tolerance=float(tolerance),
        seam_reserve=_seam_reserve(reader, f"{where}.seam_reserve", item["seam_reserve"]),
        stage_ms=None if stage_ms is None else float(stage_ms),
        margin_bytes=reader.size(item.get("margin", 0), f"{where}.margin"),
        workspace_bytes=None if workspace is None else reader.size(workspace, f"{where}.workspace"),
    )


def _seam_reserve(reader: FieldReader, where: str, data: Any) -> SeamReserve:
    if not isinstance(data, dict) or not isinstance(data.get("estimate"), dict) or not data["estimate"]:
        raise reader.error(where, "needs {estimate: {component: size, ...}, uncertainty: size, measured: "
                                  "{attention_layers: {component: size}}}")
    reader.only(data, where, SEAM_RESERVE_FIELDS)
    if data.get("uncertainty") is None:
        raise reader.error(f"{where}.uncertainty", "is required: an unbooted layout's floor is an estimate ± this")
    measured_data = data.get("measured", {})
    if not isinstance(measured_data, dict):
        raise reader.error(f"{where}.measured", "must map an attention-layer count to components")
    measured = {}
    for key, components in measured_data.items():
        if not str(key).isdigit():
            raise reader.error(f"{where}.measured", f"keys are attention-layer counts on this rank (got {key!r})")
        measured[int(key)] = reader.components(components, f"{where}.measured.{key}")
    return SeamReserve(
        estimate=reader.components(data["estimate"], f"{where}.estimate"),
        uncertainty_bytes=reader.size(data["uncertainty"], f"{where}.uncertainty"),
        measured=measured,
    )
