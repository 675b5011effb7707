"""With a real engine (three CPU ranks): two cut changes run as real jobs (propose -> approve -> execute in this
process, as tests/console/jobs/test_execution.py does), with completions sent at each layout and a measurement
recorded there. Afterwards the frontier's incumbent is the engine's running cut, calibration reports the ranks the
changes moved as identified, and the predictions list both jobs with the measured pool equal to the predicted one.
The module's tests share one engine: the cuts are chosen relative to whatever layout it runs."""

from __future__ import annotations

import pytest

from console.calibration import recording
from console.calibration.models import JobPrediction, MeasuredLayout
from console.jobs import lifecycle, worker
from console.jobs.models import Job
from tests.support.live_service import LiveService

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # an engine of its own, six moves a test

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]


@pytest.fixture(scope="module")
def engine(demo_checkpoint):
    """Not the run's shared engine: these tests move the cut six times from wherever it starts and check a timing
    fit across the cuts they visit. Started at the demo's incumbent (7,5,4) they stay near it; from where earlier
    tests leave the shared engine they reach cuts such as 11,4,1, which the fit prices more than 25% off."""
    live = LiveService(demo_checkpoint)
    yield live
    live.stop()


def moved(engine, cut: list[int], ranks: tuple[int, int], seen: list[list[int]]) -> list[int]:
    """A feasible cut not seen yet that moves one layer between `ranks` (either way)."""
    low, high = ranks
    for delta in (1, -1):
        candidate = list(cut)
        candidate[low] += delta
        candidate[high] -= delta
        if min(candidate) >= 1 and candidate not in seen and engine.plan("cut", {"cut": candidate})["feasible"]:
            return candidate
    raise AssertionError(f"no feasible cut moving ranks {ranks} from {cut}")


def serve_and_measure(engine) -> MeasuredLayout:
    """Send completions to the engine, then record what it measured of its layout, as beat does."""
    for prompt in PROMPTS:
        assert len(engine.complete(prompt, 12)) == 12
    outcome = recording.measure()
    assert outcome.startswith("measured layout"), outcome
    return MeasuredLayout.objects.first()


def run_job(operator, reviewer, cut: list[int]) -> Job:
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut}})
    lifecycle.approve(reviewer, job)
    assert worker.execute(job.pk, worker="w-calibration") == "succeeded", Job.objects.get(pk=job.pk).error
    return Job.objects.get(pk=job.pk)


def test_two_cut_changes_identify_the_ranks_they_moved(live_engine, operator, reviewer, handoffs, settings, get,
                                                       viewer):
    settings.SEAM_MEASURE_S = 0  # beat's bound between periodic rows; the test measures when it has served
    start = live_engine.state()["cut"]
    first_row = serve_and_measure(live_engine)
    assert first_row.cut == start and first_row.decode_steps > 0

    first = moved(live_engine, start, (0, 1), [start])
    first_job = run_job(operator, reviewer, first)
    state = live_engine.state()
    assert state["cut"] == first
    frontier = get("/api/v1/frontier/", user=viewer)
    assert frontier["incumbent"]["cut"] == state["cut"] and frontier["incumbent_source"] == "engine"
    assert frontier["incumbent"]["pool_tokens"] == state["pool_tokens"]  # priced at the engine's own shape
    assert frontier["shape"] == state["shape"] and frontier["engine"]["model"] == state["model"]
    assert frontier["incumbent"]["provenance"] == "measured"  # the job's end recorded it
    serve_and_measure(live_engine)
    calibration = get("/api/v1/calibration/", user=viewer)
    assert [rank["identified"] for rank in calibration["ranks"]] == [True, True, False]  # the first moved 0 and 1
    [arms] = calibration["arms"]
    assert arms["rank"] == 2 and arms["from"] == first
    assert {arm["delta_layers"] for arm in arms["arms"]} == {1, -1}  # both ways
    assert all(arm["propose_url"] == f"/jobs/new/?kind=cut&cut={','.join(map(str, arm['cut']))}"
               for arm in arms["arms"])

    second = moved(live_engine, first, (1, 2), [start, first])
    second_job = run_job(operator, reviewer, second)
    assert live_engine.state()["cut"] == second
    serve_and_measure(live_engine)

    calibration = get("/api/v1/calibration/", user=viewer)
    cuts = [start, first, second]
    moved_ranks = [rank for rank in range(3) if len({cut[rank] for cut in cuts}) > 1]
    assert moved_ranks == [0, 1, 2]
    assert calibration["incumbent"] == second and calibration["incumbent_source"] == "engine"
    assert [rank["rank"] for rank in calibration["ranks"] if rank["identified"]] == moved_ranks
    assert calibration["unidentified"] == [] and calibration["arms"] == []
    assert calibration["samples"] == 3 and sorted(calibration["cuts"]) == sorted(cuts)

    body = get("/api/v1/predictions/", user=viewer)
    rows = {row["job"]: row for row in body["results"]}
    assert [row["job"] for row in body["results"]] == [second_job.pk, first_job.pk]
    for job, before, after in ((first_job, start, first), (second_job, first, second)):
        row = rows[job.pk]
        assert row["layout_diff"] == f"{','.join(map(str, before))} -> {','.join(map(str, after))}"
        assert row["comparable"] and row["pool"]["measured"] == row["pool"]["predicted"] == job.prediction[
            "pool_tokens"]
        assert row["pool"]["error"] == 0.0
        assert len(row["stage_ms"]["predicted"]) == 3 and len(row["stage_ms"]["measured"]) == 3
        assert row["decode_tok_s"] > 0 and row["speedup"]["predicted"] > 0 and row["speedup"]["measured"] > 0
    assert rows[first_job.pk]["timing"] == {"source": "measured", "samples": 1}
    assert rows[second_job.pk]["timing"] == {"source": "measured", "samples": 2}
    assert body["summary"]["pool_error"] == {"jobs": 2, "mean": 0.0, "max": 0.0, "last": 0.0}
    assert JobPrediction.objects.filter(measurement__isnull=False).count() == 2
    assert set(MeasuredLayout.objects.filter(source="job_end").values_list("job", flat=True)) == {
        first_job.pk, second_job.pk}


def test_after_three_cut_changes_every_measured_layout_is_priced_within_its_spread(
        live_engine, operator, reviewer, handoffs, settings, get, viewer):
    """Issue 29's bar with the real engine: three cut changes under traffic, each layout measured twice; the fitted
    timing then prices every measured layout within its own measured spread or 25%, whichever is larger, names any it
    cannot explain, and every speedup interval on the frontier is a pair of finite numbers."""
    settings.SEAM_MEASURE_S = 0
    cuts = [live_engine.state()["cut"]]
    for ranks in ((0, 1), (1, 2), (0, 2)):
        if len(cuts) > 1:
            run_job(operator, reviewer, cuts[-1])
            assert live_engine.state()["cut"] == cuts[-1]
        for _ in range(2):
            serve_and_measure(live_engine)
        cuts.append(moved(live_engine, cuts[-1], ranks, cuts))
    run_job(operator, reviewer, cuts[-1])
    for _ in range(2):
        serve_and_measure(live_engine)

    calibration = get("/api/v1/calibration/", user=viewer)
    layouts = {tuple(layout["cut"]): layout for layout in calibration["layouts"]}
    assert set(layouts) == {tuple(cut) for cut in cuts} and len(cuts) == 4
    for layout in layouts.values():
        assert layout["samples"] >= 2
        error = abs(layout["predicted_ms"] / layout["measured_ms"] - 1)
        within = layout["low_ms"] <= layout["predicted_ms"] <= layout["high_ms"] or error <= 0.25
        assert within, layout
        assert layout["explained"] == (layout["low_ms"] <= layout["predicted_ms"] <= layout["high_ms"])
        assert layout["explained"] or layout["reason"]
    assert calibration["validation"]["validated"] and len(calibration["validation"]["layouts"]) == 4
    frontier = get("/api/v1/frontier/", user=viewer)
    assert frontier["timing"]["source"] == "measured"
    for point in [frontier["incumbent"], *frontier["points"]]:
        low, high = point["x_pipelined_interval"]
        assert isinstance(low, float) and isinstance(high, float)
        assert 0 < low <= point["x_pipelined"] <= high, point
