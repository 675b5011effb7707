"""Calibration steps on a running stack's console, run as a process of that stack (`console_step(stack, ...)`):
the browser tests' modules never touch the Django ORM themselves (tests/support/browser.py says why).

    python -m tests.support.stack_calibration measure
        beat's measurement of the engine (console.calibration.recording.measure), until one is recorded
    python -m tests.support.stack_calibration wrong-arms CUT..
        six runs each of two cuts other than CUT.. (e.g. 7,5,4 8,4,4), recorded as measurements of the engine's
        model and rig: a calibration the operator should not trust
    python -m tests.support.stack_calibration measure-job ID
        measure until job ID's prediction is completed; prints its speed verdict
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLAIMED_MS_PER_LAYER = (50.0, 1.0, 1.0)  # rank 0 fifty times slower than the others: nothing like the CPU ranks
ARMS = ([6, 5, 5], [5, 6, 5], [6, 6, 4], [7, 4, 5], [5, 5, 6])


def console_step(stack, *args: str, timeout: float = 180) -> dict:
    """Run one step as a process of `stack` (its database, var folder, secrets and engine); its JSON answer."""
    env = {**stack.env, "SEAM_ENGINE_URL": stack.engine_url, "SEAM_MEASURE_S": "0",
           "DJANGO_SETTINGS_MODULE": "console.settings"}
    done = subprocess.run([sys.executable, "-m", __name__, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure(until: float) -> str:
    from console.calibration import recording

    while True:
        said = recording.measure()
        if said.startswith("measured layout") or time.monotonic() > until:
            return said
        time.sleep(1.0)


def _wrong_arms(avoid: list[list[int]]) -> list[list[int]]:
    from console.calibration import recording
    from console.engine import EngineClient
    from contracts.measurement import LayoutMeasurement

    with EngineClient() as engine:
        state = engine.state()
    arms = [cut for cut in ARMS if cut not in avoid][:2]
    for cut in arms:
        for run in range(6):
            ms = [layers * per * (1 + 0.0005 * (run % 3 - 1)) for layers, per in zip(cut, CLAIMED_MS_PER_LAYER,
                                                                                        strict=True)]
            decode = {"steps": 40, "median_tokens": 1.0, "median_ms": ms, "spread_ms": [0.01] * len(cut)}
            measured = {**state.measurement.to_dict(), "cut": cut,
                        "fingerprint": "calibration-" + "-".join(map(str, cut)), "decode": decode}
            assert recording.record(replace(state, measurement=LayoutMeasurement.from_dict(measured)), "periodic")
    return arms


def _measure_job(job_id: int, until: float) -> dict:
    from console.calibration.models import JobPrediction
    from console.jobs.models import Job

    said = ""
    while time.monotonic() < until:
        prediction = JobPrediction.objects.filter(job_id=job_id).first()
        if prediction is not None and prediction.measured_stage_ms is not None:
            break
        said = _measure(time.monotonic())
        time.sleep(1.0)
    job = Job.objects.get(pk=job_id)
    prediction = JobPrediction.objects.get(job_id=job_id)
    return {"speed_verdict": job.speed_verdict, "last": said, "notes": prediction.notes,
            "speedup": [prediction.predicted_speedup, prediction.measured_speedup, prediction.noise_floor]}


def main(command: str, *args: str) -> dict:
    import django

    from launch.stack_secrets import stack_secrets

    os.environ.update(stack_secrets(Path(os.environ["SEAM_VAR_DIR"]), os.environ))
    django.setup()
    until = time.monotonic() + 120
    if command == "measure":
        return {"said": _measure(until)}
    if command == "wrong-arms":
        return {"arms": _wrong_arms([[int(n) for n in cut.split(",")] for cut in args])}
    if command == "measure-job":
        return _measure_job(int(args[0]), until)
    raise SystemExit(f"unknown step {command!r}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
