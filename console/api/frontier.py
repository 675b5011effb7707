"""The running model and rig's frontier: the one computation behind /api/v1/frontier/ and the frontier page."""

from __future__ import annotations

from django.conf import settings

from solvers.census import load_census
from solvers.frontier import Frontier, compute_frontier
from solvers.rig import Rig, load_rig

__all__ = ["running_frontier", "running_rig"]


def running_rig() -> Rig:
    """The rig the engine runs on (settings.SEAM_RIG)."""
    return load_rig(settings.SEAM_RIG)


def running_frontier(min_pool_ratio: float | None = None, rig: Rig | None = None) -> Frontier:
    """The complete Pareto frontier of settings.SEAM_MODEL on the running rig (`python -m solvers frontier`)."""
    return compute_frontier(load_census(settings.SEAM_MODEL), rig or running_rig(), min_pool_ratio=min_pool_ratio)
