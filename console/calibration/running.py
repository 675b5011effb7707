"""The layout the engine runs and the measurements that describe its model and rig: what the frontier, calibration
and metrics all start from.

How the console's names match the engine's: the engine reports `model` (its checkpoint folder's name) and `rig`
(its rig's name) in GET /control/state and in every measurement. SEAM_RIG loads a rig by name or file, and the
engine loaded the same rig, so rig names compare directly. SEAM_MODEL names a census (a built-in name, a
config.json or a folder) that need not be called what the engine's checkpoint folder is (`make run` prices
`demo-hybrid-16` while the engine serves `var/demo-checkpoint`), so the console takes the model's name from the
engine: the measurements used are those whose rig is SEAM_RIG's name and whose model is the one the running engine
reports (when the engine cannot be reached: the model of the newest measurement on that rig), and only those whose
cut is a cut of SEAM_MODEL on SEAM_RIG (rank count and layer total); others are left out with a note. Of each
layout, the newest PER_LAYOUT measurements are used.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db.models import QuerySet

from console.calibration.models import MeasuredLayout
from console.engine import EngineClient, EngineError
from contracts.control import EngineState
from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape
from solvers.calibration import Sample
from solvers.census import ModelCensus, load_census
from solvers.rig import Rig, load_rig

__all__ = ["PER_LAYOUT", "RunningLayout", "engine_state", "fit_samples", "matching_measurements", "model_label",
           "newest_per_layout", "running_layout"]

log = logging.getLogger("seam.calibration")

PER_LAYOUT = 100  # measurements of one layout used: repeats beyond these add little to a fit or a noise floor
ENGINE = "engine"
LAST_MEASURED = "last_measured"
RIG = "rig"


@dataclass(frozen=True)
class RunningLayout:
    """The incumbent layout and where it came from, with the console's model and rig and the engine's names."""

    census: ModelCensus
    rig: Rig
    cut: tuple[int, ...] | None  # None: the rig's own incumbent
    shape: ServingShape | None  # None: the rig's default shape
    source: str  # "engine", "last_measured" or "rig"
    model_name: str | None  # the engine's name for the model, which measurements are keyed by
    fingerprint: str | None
    notes: tuple[str, ...]

    @property
    def incumbent(self) -> tuple[int, ...]:
        """The running cut, or the rig's incumbent for the model when the running one is not known."""
        return self.cut if self.cut is not None else self.rig.incumbent_for(self.census.num_layers)[0]


def engine_state() -> tuple[EngineState | None, str | None]:
    """GET /control/state of the configured engine: (state, None), or (None, why it could not be read)."""
    try:
        with EngineClient() as engine:
            return engine.state(), None
    except EngineError as error:
        return None, str(error)


def model_label(census: ModelCensus) -> str:
    return census.name or census.model_type


def _is_cut_of(cut: object, census: ModelCensus, rig: Rig) -> bool:
    return (isinstance(cut, list | tuple | Cut) and len(cut) == rig.size and sum(cut) == census.num_layers
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in cut))


def running_layout(census: ModelCensus | None = None, rig: Rig | None = None) -> RunningLayout:
    """The engine's running cut and shape (GET /control/state); else the newest measurement's; else the rig's."""
    census = census or load_census(settings.SEAM_MODEL)
    rig = rig or load_rig(settings.SEAM_RIG)
    state, why = engine_state()
    if state is not None:
        notes = []
        if state.rig not in (None, rig.name):
            notes.append(f"the engine reports rig {state.rig!r} but SEAM_RIG loads {rig.name!r}: configure the "
                         "console with the rig the engine was started with")
        if _is_cut_of(state.cut, census, rig):
            return RunningLayout(census, rig, state.cut.layers, state.shape, ENGINE, state.model, state.fingerprint,
                                 tuple(notes))
        why = (f"its cut {state.cut.to_list()!r} is not a cut of {model_label(census)} on {rig.name} ({rig.size} "
               f"ranks, {census.num_layers} layers)")
    newest = next((row for row in MeasuredLayout.objects.filter(rig=rig.name)
                   if _is_cut_of(row.cut, census, rig)), None)
    if newest is not None:
        try:
            shape = ServingShape.from_dict(newest.shape, "measured shape")
        except (ContractError, TypeError):
            shape = None
        note = (f"the engine's running layout is not known ({why}): the incumbent is the newest measured layout "
                f"{newest.cut}, measured {newest.measured_at:%Y-%m-%d %H:%M:%S} UTC")
        return RunningLayout(census, rig, tuple(newest.cut), shape, LAST_MEASURED, newest.model, newest.fingerprint,
                             (note,))
    note = (f"the engine's running layout is not known ({why}) and nothing is measured on {rig.name}: the incumbent "
            "is the rig's")
    return RunningLayout(census, rig, None, None, RIG, None, None, (note,))


def newest_per_layout(rows: QuerySet[MeasuredLayout]) -> list[MeasuredLayout]:
    """The newest PER_LAYOUT of `rows` for each layout (fingerprint), newest first: an engine serving one layout for
    months must not crowd out the few measurements of the others, nor make every page read all of them."""
    fingerprints = rows.order_by().values_list("fingerprint", flat=True).distinct()
    kept = [row for fingerprint in fingerprints for row in rows.filter(fingerprint=fingerprint)[:PER_LAYOUT]]
    return sorted(kept, key=lambda row: (row.measured_at, row.pk), reverse=True)


def matching_measurements(layout: RunningLayout) -> tuple[list[MeasuredLayout], list[str]]:
    """Every measurement of the running model on the rig, newest first, and notes on what was left out."""
    if layout.model_name is None:
        return [], []
    rows, skipped = [], 0
    for row in newest_per_layout(MeasuredLayout.objects.filter(model=layout.model_name, rig=layout.rig.name)):
        if _is_cut_of(row.cut, layout.census, layout.rig):
            rows.append(row)
        else:
            skipped += 1
    if not skipped:
        return rows, []
    census = layout.census
    return rows, [f"{skipped} measurement(s) of {layout.model_name} on {layout.rig.name} left out: their cuts are not "
                  f"cuts of {model_label(census)} ({census.num_layers} layers on {layout.rig.size} ranks)"]


def fit_samples(rows: Sequence[MeasuredLayout]) -> list[Sample]:
    """One sample per measurement with decode steps: its cut and every rank's median decode stage ms."""
    samples = []
    for row in rows:
        ms = row.decode_ms if row.decode_steps else None
        if ms is not None and all(value > 0 for value in ms):  # a 0 ms median is no stage time to fit
            samples.append(Sample(tuple(row.cut), ms))
    return samples
