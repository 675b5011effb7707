"""Corridor and arming floors (docs/domain.md §5): what a rank must keep free, per rank and per layout."""

from __future__ import annotations

from dataclasses import dataclass

from solvers.rig import RankSpec


@dataclass(frozen=True)
class ArmingFloor:
    corridor_floor_bytes: int
    seam_reserve: dict[str, int]  # named components of the switching peak
    estimated: bool  # True when this layout was never booted on this rank
    uncertainty_bytes: int  # ± on an estimate; 0 when measured

    @property
    def seam_reserve_bytes(self) -> int:
        return sum(self.seam_reserve.values())

    @property
    def bytes(self) -> int:
        return self.corridor_floor_bytes + self.seam_reserve_bytes

    def to_dict(self) -> dict:
        return {
            "bytes": self.bytes,
            "corridor_floor_bytes": self.corridor_floor_bytes,
            "seam_reserve": dict(self.seam_reserve),
            "estimated": self.estimated,
            "uncertainty_bytes": self.uncertainty_bytes,
        }


def corridor_floor(band_bytes: int, tolerance: float) -> int:
    """The free bytes a rank must keep for real traffic: the band less its tolerance (1 GiB, 20% -> 819 MiB)."""
    return int(band_bytes * (1.0 - tolerance))


def arming_floor(rank: RankSpec, attention_layers: int) -> ArmingFloor:
    """Corridor floor + seam reserve for this rank holding `attention_layers` attention layers.

    A measured reserve for that layout is used when the rig has one; otherwise the estimate,
    flagged as such with its uncertainty.
    """
    measured = rank.seam_reserve.measured.get(attention_layers)
    return ArmingFloor(
        corridor_floor_bytes=corridor_floor(rank.corridor_band_bytes, rank.corridor_tolerance),
        seam_reserve=dict(measured if measured is not None else rank.seam_reserve.estimate),
        estimated=measured is None,
        uncertainty_bytes=0 if measured is not None else rank.seam_reserve.uncertainty_bytes,
    )
