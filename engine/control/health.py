"""Whether the engine can serve: what GET /healthz and the telemetry say, from the steps and recoveries it ran.

A failed step is recovered (engine/control/operations.py): requests requeued, layout rebuilt, a test step run. A
recovery that
only rebuilds what keeps failing is a loop, which must neither run forever nor look healthy. So failures are
counted until a real step succeeds: at MAX_RECOVERIES_IN_A_ROW the failing batch's requests are refused instead of
requeued (no request can hold the engine in a loop), and the engine reports itself unhealthy until a step succeeds
again. A recovery that fails leaves the engine broken (it then refuses every request), unhealthy for good.
"""

from __future__ import annotations

from contracts.control import Health

MAX_RECOVERIES_IN_A_ROW = 3


class StepHealth:
    """Written by the engine loop only; read from any thread (single attribute reads, no lock needed)."""

    def __init__(self) -> None:
        self.recoveries_in_a_row = 0  # failed steps since the last step that succeeded
        self.recoveries = 0  # since start
        self.last_error: str | None = None
        self.broken_reason: str | None = None

    def step_succeeded(self) -> None:
        self.recoveries_in_a_row = 0

    def step_failed(self, error: Exception) -> bool:
        """Count a failed step; True when the loop has reached the cap, so its requests must not be retried."""
        self.recoveries_in_a_row += 1
        self.recoveries += 1
        self.last_error = str(error)
        return self.recoveries_in_a_row >= MAX_RECOVERIES_IN_A_ROW

    @property
    def looping(self) -> bool:
        return self.recoveries_in_a_row >= MAX_RECOVERIES_IN_A_ROW

    def report(self, phase: str) -> Health:
        """Whether the engine can serve: not when broken or looping, `reason` then says which."""
        reason = None
        if phase == "broken":
            reason = f"the engine is broken: {self.broken_reason or 'it could not restore a verified layout'}"
        elif self.looping:
            reason = (f"{self.recoveries_in_a_row} steps failed in a row, each recovered, with no step succeeding "
                      f"between (a recovery loop): {self.last_error}")
        return Health(ok=reason is None, phase=phase, reason=reason, recoveries_in_a_row=self.recoveries_in_a_row,
                      recoveries=self.recoveries, last_error=self.last_error)
