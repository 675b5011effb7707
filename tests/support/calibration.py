"""Crafted engine measurements (the `measurement` of GET /control/state, contracts/measurement.py) for the tests."""

from __future__ import annotations

import httpx
from django.utils import timezone

from console.calibration import recording
from console.calibration.models import JobPrediction, MeasuredLayout
from console.engine import EngineClient
from console.jobs.models import Job
from contracts.control import EngineState

URL = "http://engine.test"
MODEL, RIG = "demo-checkpoint", "cpu-demo"
SHAPE = {"max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
         "kv_dtype": "fp32", "state_dtype": None}


def stage_stats(ms: list[float] | None, steps: int = 40, spread: float = 0.5) -> dict:
    if ms is None:
        return {"steps": 0, "median_tokens": None, "median_ms": None, "spread_ms": None}
    return {"steps": steps, "median_tokens": 1.0, "median_ms": list(ms), "spread_ms": [spread] * len(ms)}


def measurement(cut: list[int], decode_ms: list[float] | None = None, *, pool: int = 9136,
                fingerprint: str | None = None, model: str = MODEL, rig: str = RIG, shape: dict | None = None,
                tok_s: float = 12.5) -> dict:
    """The engine's `measurement` of a layout, as contracts.measurement.LayoutMeasurement.to_dict() writes it."""
    return {"model": model, "rig": rig, "fingerprint": fingerprint or "fp-" + "-".join(map(str, cut)),
            "cut": list(cut), "shape": dict(shape or SHAPE), "decode": stage_stats(decode_ms),
            "prefill": stage_stats(None), "decode_tok_s": tok_s if decode_ms else 0.0, "prefill_tok_s": 0.0,
            "pool": {"predicted": pool, "allocated": pool, "real": pool},
            "latency": {"requests": 3, "ttft_ms": 120.0, "itl_ms": 30.0}}


def state_of(data: dict) -> dict:
    """A GET /control/state around a measurement."""
    return {"model": data["model"], "rig": data["rig"], "fingerprint": data["fingerprint"], "cut": data["cut"],
            "shape": data["shape"], "phase": "serving", "pool_tokens": data["pool"]["predicted"],
            "measurement": data}


class FakeEngine:
    """A /control/state that answers whatever `state` holds now (None: the engine refuses the connection)."""

    def __init__(self, state: dict | None):
        self.state = state

    def client(self) -> EngineClient:
        def answer(request: httpx.Request) -> httpx.Response:
            if self.state is None:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(200, json=self.state)
        return EngineClient(URL, transport=httpx.MockTransport(answer), token="t")


A = (2.0, 2.5, 3.0)  # ms per layer of each rank in crafted stage times: linear, no fixed cost


def record_measurement(cut: list[int], decode_ms: list[float] | None = None, **kwargs) -> MeasuredLayout:
    """Record a crafted measurement of `cut` as the console's periodic recording would (kwargs: measurement's)."""
    row = recording.record(EngineState.from_dict(state_of(measurement(cut, decode_ms, **kwargs))), "periodic",
                           engine_url=URL)
    assert row is not None
    return row


def stages(cut: list[int]) -> list[float]:
    return [round(layers * ms, 4) for layers, ms in zip(cut, A, strict=True)]


def executed_job(before: list[int], after: list[int], pool: int = 9120) -> Job:
    plan = {"kind": "cut", "target": {"cut": after}, "incumbent_fingerprint": "fp-" + "-".join(map(str, before)),
            "predicted": {"cut": after, "pool_tokens": pool, "shape": SHAPE}}
    return Job.objects.create(kind="cut", target={"cut": after}, plan=plan, plan_hash="0" * 64,
                              prediction=plan["predicted"], status="succeeded", proposer_name="olga",
                              started_at=timezone.now(), finished_at=timezone.now())


def end_job(job: Job, state: dict) -> JobPrediction:
    """What the worker does as the job's operation ends: record the layout and the prediction."""
    recording.note_job_end(job, EngineState.from_dict(state), URL)
    return JobPrediction.objects.get(job=job)
