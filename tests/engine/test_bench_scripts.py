"""The device scripts at toy size on the CPU: what proves a GPU session's one call will not die on a Python error.

benchmarks/rig_h200.py runs every step of the full-size rig run on the CPU demo rig (the same engine paths: start,
refusals, live cut and shape changes under load, a ladder on a model of another depth than the rig's incumbent); a
rank killed in every reconfiguration shows a failure is recorded and the run goes on; the step guard records
failures, timeouts and skips. A rank's rebuild is measured (resident memory) to hold the new pools without the old.
"""

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks import quant_divergence
from benchmarks.rig_compare import compare, transition
from benchmarks.rig_steps import Record, Steps
from engine.config import ModelConfig
from engine.memory.host_image import HostImage
from engine.ranks.rank import RankLayout, RankWorker
from solvers.capacity import CutPricer
from solvers.census import CONFIG_DIR
from solvers.rig import load_rig

ROOT = Path(__file__).resolve().parents[2]


def run_rig(out: Path, *extra: str, env: dict | None = None, timeout: float = 600) -> dict:
    done = subprocess.run([sys.executable, "benchmarks/rig_h200.py", "--toy", "--device", "cpu", "--out", str(out),
                           "--work", str(out / "work"), *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "rig_h200.json").read_text())


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    return run_rig(tmp_path_factory.mktemp("rig-toy"))


@pytest.mark.slow
def test_every_step_of_the_rig_run_succeeds_at_toy_size(toy_run):
    steps = toy_run["steps"]
    assert set(steps) == {"image", "refused_at_start", "start", "warmup", "refused_by_engine", "cut 8,4,4",
                          "cut 9,3,4", "cut 7,5,4", "shape", "shutdown", "ladder", "quantized"}
    assert {name: step["status"] for name, step in steps.items()} == dict.fromkeys(steps, "ok")
    assert "aborted" not in toy_run and toy_run["summary"]["steps"] == dict.fromkeys(steps, "ok")


@pytest.mark.slow
def test_the_fp8_model_allocates_exactly_what_the_planner_priced_on_every_rank(toy_run):
    """The rig run's quantized case: the model as block-scaled FP8 started at the incumbent, served a wave, and every
    rank's weights, state and KV pool equal to the prediction at both moments, its weights under bf16's."""
    quantized = toy_run["quantized"]
    assert quantized["quantization_config"]["weight_block_size"] == [128, 128]
    assert toy_run["summary"]["quantized"] == {"start": True, "warmup": True}
    assert quantized["warmup"]["finish_reasons"] == ["length"] * 4 and not quantized["warmup"]["errors"]
    fp8 = sum(row["weights"]["allocated"] for row in quantized["start"]["compare"]["ranks"])
    bf16 = sum(row["weights"]["allocated"] for row in toy_run["start"]["compare"]["ranks"])
    assert 0 < fp8 < bf16


@pytest.mark.slow
def test_every_cut_allocates_exactly_the_predicted_pool_and_binds_where_predicted(toy_run):
    measured = [toy_run["start"], *toy_run["cuts"]]
    assert [toy_run["start"]["cut"], *(entry["target"]["cut"] for entry in toy_run["cuts"])] == \
        [[7, 5, 4], [8, 4, 4], [9, 3, 4], [7, 5, 4]]
    assert [entry["on_frontier"] for entry in toy_run["cuts"]] == [True, True, False]  # two frontier cuts
    for entry in measured:
        compared = entry["compare"]
        assert compared["exact"], compared
        pool = compared["pool_tokens"]
        assert pool["predicted"] == pool["allocated"] == pool["real_capacity"] > 0 and pool["real_vs_predicted"] == 0
        assert compared["binding_rank"]["predicted"] == compared["binding_rank"]["real"]
        for row in compared["ranks"]:
            assert row["weights"]["predicted"] == row["weights"]["allocated"] > 0
            assert row["allowed_tokens"]["predicted"] == row["allowed_tokens"]["real"]
            assert row["binding_predicted"] == (row["rank"] == compared["binding_rank"]["predicted"])
    assert [entry["compare"]["pool_tokens"]["predicted"] for entry in measured] == [9136, 17056, 15776, 9136]
    assert [entry["compare"]["binding_rank"]["predicted"] for entry in measured] == [1, 0, 0, 1]


@pytest.mark.slow
def test_the_started_layout_is_compared_again_once_it_has_served(toy_run):
    """The start is measured before the first request; the ranks measure themselves again after the warm-up."""
    served = toy_run["warmup"]["compare"]
    assert served["exact"] and served["pool_tokens"] == toy_run["start"]["compare"]["pool_tokens"]
    assert [row["allowed_tokens"] for row in served["ranks"]] == \
        [row["allowed_tokens"] for row in toy_run["start"]["compare"]["ranks"]]
    rows = toy_run["summary"]["cuts"]
    assert [row["status"] for row in rows[:2]] == ["started", "served"]
    assert rows[1]["cut"] == rows[0]["cut"] == [7, 5, 4]


@pytest.mark.slow
def test_the_refused_cuts_are_refused_by_the_engine_with_the_planners_reasons(toy_run):
    for refused in (toy_run["refused_at_start"], toy_run["refused_by_engine"]):
        assert [row["cut"] for row in refused] == [[3, 12, 1], [1, 1, 14]]
        assert all(row["agree"] and row["planner_reasons"] for row in refused), refused
    start = {tuple(row["cut"]): row for row in toy_run["refused_at_start"]}
    assert "cannot hold one sequence" in start[(3, 12, 1)]["engine_error"]
    assert "cannot clear its arming floor" in start[(1, 1, 14)]["engine_error"]
    for row in toy_run["refused_by_engine"]:
        assert row["plan_feasible"] is False and row["apply"]["refused"] and row["apply"]["status"] == 422
        assert row["plan_reasons"] == row["planner_reasons"]


@pytest.mark.slow
def test_the_cut_change_under_load_grows_a_pool_past_both_and_loses_no_request(toy_run):
    first = toy_run["cuts"][0]
    assert first["status"] == "succeeded" and first["engine_phase"] == "serving"
    # Requests were mid-stream when it was applied; they were preempted, recomputed and finished in full.
    assert first["streaming_at_apply"] and first["in_flight_at_apply"] and first["preempted"] >= 1
    assert first["in_flight_outcomes"]["finished"] == first["in_flight_outcomes"]["submitted"] > 0
    # The H200 case: a rank whose budget cannot hold its old and new pools at once, but holds the new layout.
    tight = [row for row in first["transition"] if row["both_would_not_fit"]]
    assert tight and all(row["peak"] <= row["allocatable"] for row in first["transition"])
    shape = toy_run["shape"]
    assert shape["status"] == "succeeded" and shape["in_flight_at_apply"] and shape["streaming_at_apply"]
    assert shape["in_flight_outcomes"]["finished"] == shape["in_flight_outcomes"]["submitted"]
    load = toy_run["load"]
    assert load["submitted"] == load["finished"] > 0
    assert load["refused"] == load["lost"] == load["unsettled"] == 0 and load["finished_short"] == []


@pytest.mark.slow
def test_the_ladder_switch_is_timed_against_its_predicted_cost(toy_run):
    ladder = toy_run["ladder"]
    assert ladder["rungs"] == [[5, 4, 3], [6, 3, 3]]  # a 12-layer model on a rig whose incumbent has 16
    for move in (ladder["up"], ladder["back"]):
        assert move["status"] == "succeeded" and move["compare"]["exact"]
        assert move["switch_s"] > 0 and move["predicted_switch_cost_s"] > 0
        assert move["switch_vs_predicted"] == round(move["switch_s"] / move["predicted_switch_cost_s"], 3)
        assert all(copy > 0 for copy in move["copy_s"])
    assert ladder["up"]["compare"]["ranks"][0]["layers"] == [0, 6]


@pytest.mark.slow
def test_a_rank_dying_in_every_change_is_recorded_and_the_run_goes_on(tmp_path):
    run = run_rig(tmp_path, env={"SEAM_FAULT_DIE_RANK": "1"})
    assert all(step["status"] == "ok" for step in run["steps"].values())  # each step ran to its end
    assert [entry["status"] for entry in run["cuts"]] == ["rolled_back"] * 3
    assert all("died" in entry["error"] and entry["engine_phase"] == "serving" for entry in run["cuts"])
    assert run["shape"]["status"] == "rolled_back" and run["ladder"]["up"]["status"] == "rolled_back"
    load = run["load"]
    assert load["submitted"] == load["finished"] + load["refused"] and load["lost"] == load["unsettled"] == 0
    assert load["finished_short"] == []


@pytest.mark.slow
def test_a_build_failing_on_one_rank_rolls_back_under_load_and_the_next_changes_succeed(tmp_path):
    """The H200's failure, on the CPU: one rank's build fails mid-change while the others built the new layout (there
    out of memory, here a corrupted arrival); every rank is rebuilt at the old layout, serving resumes under load,
    and the next changes go through."""
    run = run_rig(tmp_path, env={"SEAM_FAULT_CORRUPT_RANK": "0"})
    first, *rest = run["cuts"]
    assert first["status"] == "rolled_back" and "checksum mismatch" in first["error"]
    assert first["engine_phase"] == "serving" and first["previous"]["pool_tokens"] == 9136
    assert [entry["status"] for entry in rest] == ["succeeded", "succeeded"] and run["shape"]["status"] == "succeeded"
    assert first["in_flight_outcomes"]["finished"] == first["in_flight_outcomes"]["submitted"] > 0
    load = run["load"]
    assert load["submitted"] == load["finished"] > 0 and load["lost"] == load["refused"] == 0


@pytest.mark.slow
def test_the_gpu_bench_runs_every_part_at_toy_size(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--toy", "--tests-timeout-s", "1",
                           "--out", str(tmp_path), "--checkpoint", str(tmp_path / "checkpoint")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bench = json.loads((tmp_path / "gpu_bench.json").read_text())
    # The GPU path tests are cut off at their timeout, said so in their log, and the bench still runs after them.
    assert bench["tests"]["returncode"] is None and "cut off after 1 s" in (tmp_path / "gpu_tests.log").read_text()
    assert bench["copy"]["bytes_per_s"] > 0 and bench["checkpoint"]["parameters"] > 0
    for side in ("engine", "transformers", "served"):
        rows = bench[side]["rows"]
        assert [row["batch"] for row in rows] == [1, 2]
        assert all(row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0 for row in rows)
    assert all(isinstance(row["tokens_equal_transformers"], bool) for row in bench["engine"]["rows"])
    # The served path (engine serve, through the OpenAI API) gives `LLM`'s greedy tokens, every request whole.
    assert [row["served_tokens_equal"] for row in bench["engine"]["rows"]] == [True, True]
    assert "engine serve" in bench["served"]["command"] and bench["served"]["measurement"]["decode"]["steps"] > 0
    step = bench["engine"]["step"]
    assert step["total_bytes"] == step["weights_bytes"] + step["state_bytes"] + step["kv_bytes"] > 0
    assert bench["unfused_step"]["step_s"] > 0
    # The checkpoint converted to FP8 blocks and W4A16 loads and runs as `LLM`, and its batch-1 step reads fewer
    # weight bytes the fewer bits a weight has (scales included).
    quantized = bench["quantized"]
    assert set(quantized) == {"fp8", "w4a16"} and all("error" not in run for run in quantized.values())
    assert all([row["batch"] for row in run["engine"]["rows"]] == [1, 2] for run in quantized.values())
    weights = [run["step"]["weights_bytes"] for run in (bench["engine"], quantized["fp8"]["engine"],
                                                        quantized["w4a16"]["engine"])]
    assert weights[0] > weights[1] > weights[2] > 0
    # Deterministic mode at the toy's largest batch: served and `LLM` give one another's tokens, at a measured cost.
    deterministic = bench["deterministic"]
    assert deterministic["batch"] == 2 and deterministic["served_tokens_equal"] is True
    assert deterministic["llm"]["decode_tok_s"] > 0 and deterministic["served"]["decode_tok_s"] > 0
    assert deterministic["llm_decode_tok_s_vs_usual"] > 0 and deterministic["served_decode_tok_s_vs_usual"] > 0
    # The bf16 table, the deterministic line, then the formats' header and one line each.
    assert len(bench["table"]) == 5 + 1 + 1 + 3


@pytest.mark.slow
def test_the_service_overhead_bench_streams_every_token_on_both_http_stacks(tmp_path):
    out = tmp_path / "overhead.json"
    done = subprocess.run([sys.executable, "benchmarks/service_overhead.py", "--batch", "3", "--tokens", "5",
                           "--step-ms", "2", "--repeat", "1", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    # Each stack with one client process and with the batch spread over three; _one_batch refuses a short stream.
    assert [(r["http"], r["client_processes"]) for r in rows] == [("h11", 1), ("h11", 3), ("httptools", 1),
                                                                  ("httptools", 3)]
    # Figures, not speeds: at this size a loaded machine may deliver a stream's tokens in one chunk (no decode after
    # the last first token) and the server's CPU time, read in 10 ms ticks, may stay under one tick.
    assert all(r["decode_tok_s"] >= 0 and r["server_cpu_us_per_token"] >= 0 for r in rows)
    assert "server CPU per token: h11/asyncio" in done.stdout


@pytest.mark.parametrize("size", ["FULL", "TOY"])
def test_every_planned_step_of_the_run_is_what_the_planner_says(size, tmp_path):
    """The device run's plan, checked here first: every move and the shape change feasible from where the run
    makes it, the moves on the planner's frontier, the refused cuts refused for two different reasons, the ladder's
    rungs feasible on its model (another depth than the rig's incumbent), every step budgeted."""
    from benchmarks import rig_h200
    from contracts.layout import layout_fingerprint
    from solvers.frontier import default_timing
    from solvers.ladder import price_ladder
    from solvers.plans import build_plan

    case = getattr(rig_h200, size)
    rig = load_rig(case["rig"])
    folder = rig_h200.write_config(case["config"], case["overrides"], tmp_path / "model")
    census = ModelConfig.from_pretrained(folder).census
    frontier = rig_h200.frontier_cuts(folder, rig)
    assert all(cut in frontier for cut in case["moves"][:2]) and case["moves"][-1] == case["incumbent"]
    cut, shape = case["incumbent"], rig.shape
    for move in case["moves"]:
        request = {"kind": "cut", "target": {"cut": move}, "incumbent_fingerprint": layout_fingerprint(cut, shape)}
        assert build_plan(request, census, rig, cut, shape).feasible, move
        cut = move
    request = {"kind": "shape", "target": case["shape"], "incumbent_fingerprint": layout_fingerprint(cut, shape)}
    planned = build_plan(request, census, rig, cut, shape)
    assert planned.feasible, planned.reasons
    reasons = [CutPricer(census, rig).price(refused).reasons for refused in case["refused"]]
    assert all(reasons) and "cannot hold one sequence" in reasons[0][0] and "arming floor" in reasons[1][0]
    ladder_census = ModelConfig.from_pretrained(rig_h200.write_config(
        case["config"], case["ladder"]["overrides"], tmp_path / "ladder")).census
    assert sum(rig.incumbent_cut) != ladder_census.num_layers
    timing = default_timing(rig, rig.incumbent_for(ladder_census.num_layers)[0], [])
    ladder = price_ladder(ladder_census, rig, case["ladder"]["rungs"], rig.shape, timing=timing)
    assert all(rung.pool.feasible for rung in ladder.rungs)
    # The FP8 model fits the incumbent, with a larger pool than bf16's (its weights are about half).
    fp8 = ModelConfig.from_pretrained(rig_h200.write_config(
        case["config"], {**case["overrides"], "quantization_config": rig_h200.QUANTIZED}, tmp_path / "fp8")).census
    assert fp8.quantization is not None and fp8.weight_bytes_total < census.weight_bytes_total
    fp8_pool = CutPricer(fp8, rig).price(case["incumbent"])
    assert fp8_pool.feasible and fp8_pool.pool_tokens > CutPricer(census, rig).price(case["incumbent"]).pool_tokens
    steps = {"h2d", "image", "refused_at_start", "start", "warmup", "refused_by_engine", "move", "shape", "shutdown",
             "ladder", "quantized"}
    assert set(case["budgets"]) == steps and set(case["needs"]) <= steps
    assert all(case["needs"][step] < case["budgets"][step] for step in case["needs"])


def test_the_step_guard_records_failures_timeouts_and_skips(tmp_path):
    record = Record(tmp_path / "run.json", {})
    steps = Steps(record, budget_s=60)
    assert steps.run("fine", 5, lambda: 7) == 7
    assert steps.run("broken", 5, lambda: 1 / 0) is None
    release = threading.Event()
    assert steps.run("stuck", 0.2, release.wait, 30) is None
    assert steps.run("after", 5, lambda: 1) is None  # the stuck step may still hold the engine
    assert steps.run("elsewhere", 5, lambda: 2, engine=False) == 2
    assert steps.run("too long", 120, lambda: 3, engine=False) is None
    release.set()
    saved = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert {name: step["status"] for name, step in saved.items()} == {
        "fine": "ok", "broken": "failed", "stuck": "timed_out", "after": "skipped", "elsewhere": "ok",
        "too long": "skipped"}
    assert saved["broken"]["error"] == "ZeroDivisionError: division by zero"
    assert "stuck" in saved["after"]["why"] and "time budget" in saved["too long"]["why"]


def test_a_run_without_time_left_records_every_step_skipped(tmp_path):
    started = time.monotonic()
    run = run_rig(tmp_path, "--budget-s", "1", timeout=120)
    assert time.monotonic() - started < 60
    assert {step["status"] for step in run["steps"].values()} == {"skipped"}
    assert "ladder" in run["steps"] and run["summary"]["cuts"][0]["status"] == "started"


def test_the_h200_runs_real_figures_give_the_documented_miss():
    """The CUDA half of the comparison on the figures the H200 really reported at [28,20,16] (2026-12-02): the pool
    the card could really hold is 4.6% under the prediction, still bound by rank 1 (docs/benchmarks.md, H200)."""
    run = json.loads((ROOT / "benchmarks/results/h200-2026-12-02/rig_h200.json").read_text())["rig"]["cuts"][0]
    recorded = [rank["predicted"] for rank in run["ranks"]]
    reference = load_rig("reference-h200")  # with the budgets and overheads the run was planned with
    rig = replace(reference, ranks=tuple(replace(spec, memory_bytes=row["budget"], overhead_bytes=row["overhead"])
                                         for spec, row in zip(reference.ranks, recorded, strict=True)))
    census = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json").census
    prediction = CutPricer(census, rig).price((28, 20, 16))
    assert prediction.table() == recorded
    compared = compare(prediction, [rank["measured"] for rank in run["ranks"]], run["probe"])
    assert compared["exact"] and compared["pool_tokens"]["allocated"] == 128016
    assert compared["pool_tokens"]["real_capacity"] == 122144 and compared["pool_tokens"]["real_vs_predicted"] < -0.045
    assert compared["binding_rank"] == {"predicted": 1, "real": 1}
    rank1 = compared["ranks"][1]["cuda"]
    assert rank1["allocated_minus_resident"] == 10339200 and rank1["reserved_minus_allocated"] == 39244288
    assert rank1["context"] == 639631360 and rank1["real_free"] == 1816133632  # 610 MiB; 1.816 GB
    assert rank1["probe_headroom"] == 2415919104 and rank1["peak_allocated_during_build"] is None  # not yet reported
    assert compared["ranks"][1]["overhead"]["real"] == 639631360 + 39244288 + 10339200



def test_the_h200_runs_last_figures_give_the_documented_table():
    """The last full-size run (session 3, run 5: expandable segments, memory returned before measuring, overhead
    720 MiB): each layout's real figures put back through the planner's own row give the documented real pools."""
    run = json.loads((ROOT / "benchmarks/results/h200-2026-12-02/session3/run5_rig_h200.json").read_text())
    census = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json").census
    reference = load_rig("reference-h200")
    layouts = [(run["start"]["cut"], run["start"]["compare"])]
    layouts += [(entry["target"]["cut"], entry["compare"]) for entry in run["cuts"]]
    real = {}  # the incumbent twice: started (before the first step) and moved back to (running): the last one kept
    for cut, compared in layouts:
        rows = compared["ranks"]
        specs = (replace(spec, memory_bytes=row["budget"], overhead_bytes=row["overhead"]["rig"])
                 for spec, row in zip(reference.ranks, rows, strict=True))
        rig = replace(reference, ranks=tuple(specs))
        prediction = CutPricer(census, rig).price(tuple(cut))
        assert compared["exact"] and compared["pool_tokens"]["allocated"] == prediction.pool_tokens
        allowed = []
        for budget, row in zip(prediction.ranks, rows, strict=True):
            resident = row["weights"]["allocated"] + row["kv_bytes"]["allocated"] + row["state"]["allocated"]
            assert row["overhead"]["real"] == row["cuda"]["process_used"] - resident
            if budget.attention_layers:
                allowed.append(replace(budget, overhead_bytes=row["overhead"]["real"]).allowed_tokens)
        assert min(allowed) == compared["pool_tokens"]["real_capacity"]
        real[tuple(cut)] = round(min(allowed) / prediction.pool_tokens - 1, 3)
    # before the first step (start) the context is 610 MiB, under the 720 priced; running, the allocator's slack stays
    assert real == {(28, 20, 16): -0.017, (30, 17, 17): -0.012, (31, 16, 17): -0.005, (32, 15, 17): -0.016,
                    (33, 15, 16): -0.038} and layouts[0][1]["pool_tokens"]["real_vs_predicted"] == 0.087377


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_a_growing_rebuild_holds_the_new_pools_without_the_old(tmp_path):
    """Measured, not accounted: the peak resident memory of a rank rebuilding [7,5,4] -> [8,4,4] on a rig whose
    budget cannot hold the old pools beside the new ones (rank 0's pool grows 1.9x and it gains a layer)."""
    config = ModelConfig.from_pretrained(CONFIG_DIR / "demo-hybrid-16.json")
    demo = load_rig("cpu-demo")  # budgets x8: pools of tens of MB stand well above allocator noise
    rig = replace(demo, ranks=tuple(replace(r, memory_bytes=r.memory_bytes * 8) for r in demo.ranks))
    before, after = (CutPricer(config.census, rig).price(cut) for cut in ((7, 5, 4), (8, 4, 4)))
    rank0 = transition(config.census, before, after)[0]
    assert rank0["both_would_not_fit"] and rank0["peak"] <= rank0["allocatable"]
    worker = RankWorker(0, 3, config, HostImage.random(config), torch.device("cpu"))
    worker.build(_layout(before, 0))
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current resident size
    resident = _vm("VmRSS")
    worker.build(_layout(after, 0))
    grew = _vm("VmHWM") - resident
    allowance = 4 << 20  # Python objects, module copies, the allocator's own pages
    assert rank0["peak"] == rank0["new"] == rank0["old"] + rank0["gained"] + rank0["new_pools"] - rank0["old_pools"]
    assert grew <= rank0["new"] - rank0["old"] + allowance  # no more than the larger layout
    assert rank0["old_pools"] > 4 * allowance  # keeping the old pools would have broken the bound above


def _layout(prediction, rank: int) -> RankLayout:
    row = prediction.ranks[rank]
    return RankLayout(prediction.cut, prediction.pool_tokens, 16, 8, "float32", "float32", row.budget_bytes,
                      row.overhead_bytes, row.workspace_bytes, row.floor.bytes, row.margin_bytes)


@pytest.mark.slow
def test_the_rig_run_can_leave_the_ladder_out(tmp_path):
    run = run_rig(tmp_path, "--skip-ladder")
    assert "ladder" not in run["steps"] and run["summary"]["ladder"]["up"]["status"] is None
    assert [entry["status"] for entry in run["cuts"]] == ["succeeded"] * 3 and run["shape"]["status"] == "succeeded"


def test_the_graphs_pool_counts_as_workspace_up_to_the_planned_workspace():
    """A rank's decode graphs hold a private pool the planner prices as workspace (docs/domain.md §4): it is not real
    overhead up to the planned workspace; beyond it, the excess is."""
    from benchmarks.rig_compare import real_overhead

    census = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json").census
    budget = CutPricer(census, load_rig("reference-h200")).price((28, 20, 16)).ranks[1]
    measured = {"weights_bytes": 10, "arena_bytes": 0, "kv_pool_bytes": 20, "state_pool_bytes": 30,
                "process_used_bytes": 900 << 20}
    without_graphs, _ = real_overhead(budget, measured)
    assert without_graphs == (900 << 20) - 60
    graphs = {"allocator_pools": {"graphs": {"reserved": 65 << 20}}}
    assert real_overhead(budget, {**measured, **graphs})[0] == without_graphs - (65 << 20)
    huge = {"allocator_pools": {"graphs": {"reserved": budget.workspace_bytes + (7 << 20)}}}
    assert real_overhead(budget, {**measured, **huge})[0] == without_graphs - budget.workspace_bytes


def test_the_h200_runs_of_the_third_session_give_the_documented_pools():
    """2026-12-04, call 7 (benchmarks/results/h200-2026-12-04c): the real figures of each layout it reached, put back
    through the planner's own row with the graphs' pool as workspace, give the documented real pools."""
    run = json.loads((ROOT / "benchmarks/results/h200-2026-12-04c/call7_rig_h200.json").read_text())
    census = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json").census
    rig = _rig_as_run(run)
    layouts = [(run["start"]["cut"], run["start"]["compare"])]
    layouts += [(entry["target"]["cut"], entry["compare"]) for entry in run["cuts"] if "compare" in entry]
    real = {}
    for cut, compared in layouts:
        prediction = CutPricer(census, rig).price(tuple(cut))
        assert compared["exact"] and compared["pool_tokens"]["predicted"] == prediction.pool_tokens
        assert [row["overhead"]["rig"] for row in compared["ranks"]] == [824 << 20, 824 << 20, 831 << 20]
        allowed = []
        for budget, row in zip(prediction.ranks, compared["ranks"], strict=True):
            graphs = row["cuda"]["pools"]["graphs"]["reserved"]
            assert 0 < graphs <= budget.workspace_bytes and row["workspace"]["graphs"] == graphs
            resident = row["weights"]["allocated"] + row["kv_bytes"]["allocated"] + row["state"]["allocated"]
            assert row["overhead"]["real"] == row["cuda"]["process_used"] - resident - graphs
            allowed.append(replace(budget, overhead_bytes=row["overhead"]["real"]).allowed_tokens)
        assert min(allowed) == compared["pool_tokens"]["real_capacity"]
        real[tuple(cut)] = round(min(allowed) / prediction.pool_tokens - 1, 4)
    # before the first request the context is 10 MiB short of running and the slack small: the start reads high
    assert real == {(28, 20, 16): 0.0241, (30, 17, 17): -0.0007, (31, 16, 17): -0.0056}


def _rig_as_run(run: dict):
    """reference-h200 with the overheads a run was planned with (its start's rows record them)."""
    reference = load_rig("reference-h200")
    rows = run["start"]["compare"]["ranks"]
    return replace(reference, ranks=tuple(replace(spec, overhead_bytes=row["overhead"]["rig"])
                                          for spec, row in zip(reference.ranks, rows, strict=True)))


def _running_layouts(run: dict) -> list[tuple[str, dict]]:
    """Each layout the rig run compared once it was serving: the started one after its warm-up, every move, the
    shape change."""
    return [("served", run["warmup"]["compare"]), *((str(e["target"]["cut"]), e["compare"]) for e in run["cuts"]),
            ("shape", run["shape"]["compare"])]


def test_the_slab_runs_real_overhead_is_the_same_on_every_layout():
    """2026-12-06, call 3 (benchmarks/results/h100-2026-12-06): with weights and pools in the slab a rank's real
    overhead moves by under 1.5 MiB (rank 2: 2.5) over seven running layouts (45 MiB with the allocator's holes)."""
    run = json.loads((ROOT / "benchmarks/results/h100-2026-12-06/call3_rig_h200.json").read_text())
    assert [row["overhead"]["rig"] for row in run["start"]["compare"]["ranks"]] == [824 << 20, 824 << 20, 831 << 20]
    real = [[row["overhead"]["real"] for row in compared["ranks"]] for _, compared in _running_layouts(run)]
    spread = [max(rank) - min(rank) for rank in zip(*real, strict=True)]
    assert len(real) == 7 and all(s < 3 << 19 for s in spread[:2]) and spread[2] < 5 << 19, spread
    assert [math.ceil(max(rank) / (1 << 20)) for rank in zip(*real, strict=True)] == [806, 806, 804]  # the rig's now
    for compared in (c for _, c in _running_layouts(run)):
        slab = [row["cuda"]["slab_mapped"] - row["weights"]["allocated"] - row["kv_bytes"]["allocated"]
                - row["state"]["allocated"] for row in compared["ranks"]]
        assert all(0 <= extra < 2 << 20 for extra in slab)  # the slab maps its packing to the granule


def test_every_running_layout_of_the_rig_run_holds_its_predicted_pool_within_one_percent():
    """2026-12-06, call 4: the rig file's overheads (806 / 806 / 804 MiB) planned every layout; once serving, the
    pool the card could really hold is within 0.3% of the prediction on each, and the binding rank is the one
    predicted. Before the first request the context is 10 MiB short of a running one: the start reads +1.0%."""
    run = json.loads((ROOT / "benchmarks/results/h100-2026-12-06/call4_rig_h200.json").read_text())
    census = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json").census
    rig = load_rig("reference-h200")
    assert _rig_as_run(run) == rig  # the run planned with the rig file as it is
    errors = {}
    for name, compared in _running_layouts(run):
        pool = compared["pool_tokens"]
        assert compared["exact"] and compared["binding_rank"]["predicted"] == compared["binding_rank"]["real"]
        errors[name] = pool["real_capacity"] / pool["predicted"] - 1
    assert len(errors) == 7 and all(0 <= error < 0.003 for error in errors.values()), errors
    served = run["warmup"]["compare"]["pool_tokens"]
    assert CutPricer(census, rig).price((28, 20, 16)).pool_tokens == served["predicted"]
    assert 0.01 < run["start"]["compare"]["pool_tokens"]["real_vs_predicted"] < 0.011
    assert run["summary"]["load"]["lost"] == 0 and run["summary"]["load"]["finished"] == 28


def test_rank_memory_names_what_sits_beside_each_free_block_of_the_default_pool():
    from benchmarks.rank_memory import layout, pins

    frames = [{"filename": "/x/engine/memory/kv_pool.py", "line": 28, "name": "__init__"},
              {"filename": "/usr/lib/python3/threading.py", "line": 1, "name": "run"}]
    snapshot = {"segments": [
        {"segment_pool_id": (0, 0), "blocks": [
            {"size": 4 << 20, "state": "active_allocated", "frames": frames},
            {"size": 3 << 20, "state": "inactive"},
            {"size": 1 << 20, "state": "active_allocated"}]},
        {"segment_pool_id": (1, 0), "blocks": [  # a graph's private pool: workspace, not slack
            {"size": 2 << 20, "state": "inactive"}, {"size": 2 << 20, "state": "active_allocated"}]}]}
    assert pins(snapshot) == [
        {"free_bytes": 3 << 20, "live_bytes": 4 << 20, "live_is": "before", "allocated_at": ["kv_pool.py:28:__init__"]},
        {"free_bytes": 3 << 20, "live_bytes": 1 << 20, "live_is": "after", "allocated_at": []}]
    config = ModelConfig.from_pretrained(CONFIG_DIR / "reference-hybrid-64.json")
    rig = load_rig("reference-h200")
    built = layout(config, rig, (30, 17, 17), 1)
    assert built.pool_tokens == CutPricer(config.census, rig).price((30, 17, 17)).pool_tokens == 285856
    assert built.layer_range(1) == range(30, 47) and built.max_model_len == rig.shape.max_model_len


@pytest.mark.slow
def test_the_timing_run_measures_every_layout_and_validates_each_held_out(tmp_path):
    """benchmarks/rig_timing.py at toy size on the CPU: every layout measured under the load, the incumbent twice,
    every request accounted for, and each layout predicted by a fit over the others for decode and prefill."""
    done = subprocess.run([sys.executable, "benchmarks/rig_timing.py", "--toy", "--device", "cpu", "--out",
                           str(tmp_path), "--work", str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = json.loads((tmp_path / "rig_timing.json").read_text())
    case = run["case"]
    assert set(run["summary"]["steps"].values()) == {"ok"}
    assert [entry["cut"] for entry in run["layouts"]] == [case["incumbent"], *case["layouts"]]
    for entry in run["layouts"]:
        assert len(entry["decode"]) == case["repeats"] and len(entry["prefill"]) == case["prefill_steps"]
        assert entry["prefill_tokens"] == case["prompt"] and entry["decode_step_count"] >= case["decode_steps"]
    assert run["load"]["lost"] == 0 and run["load"]["unsettled"] == 0
    layouts = {tuple(cut) for cut in [case["incumbent"], *case["layouts"]]}
    for kind in ("decode", "prefill"):
        validation = run["summary"][kind]["validation"]
        assert validation["validated"] and {tuple(row["cut"]) for row in validation["layouts"]} == layouts
        assert all(row["measured_ms"] > 0 and row["predicted_ms"] > 0 for row in validation["layouts"])


def test_the_held_out_timing_table_comes_from_the_runs_raw_samples():
    """docs/benchmarks.md's held-out table (2026-12-06): recomputed from the call's raw per-layout samples with
    today's solvers, the same mean and max error."""
    from solvers.calibration import Sample
    from solvers.timing_validation import validate_timing

    run = json.loads((ROOT / "benchmarks/results/h100-2026-12-06b/call2_rig_timing.json").read_text())
    figures = {}
    for kind in ("decode", "prefill"):
        samples = [Sample(tuple(entry["cut"]), tuple(ms)) for entry in run["layouts"] for ms in entry[kind]]
        validation = validate_timing(samples, 0.141)
        recorded = run["summary"][kind]["validation"]["layouts"]
        assert [h.cut for h in validation.layouts] == [tuple(row["cut"]) for row in recorded]
        assert [h.predicted_ms for h in validation.layouts] == pytest.approx([row["predicted_ms"] for row in recorded])
        figures[kind] = (round(validation.mean_abs_error, 3), round(validation.max_abs_error, 3))
    assert figures == {"decode": (0.007, 0.01), "prefill": (0.076, 0.174)}
    doc = (ROOT / "docs/benchmarks.md").read_text()
    assert "| decode (batch 4) | 0.7% | 1.0% |" in doc and "| prefill (512 tokens) | 7.6% | 17.4% |" in doc


def test_the_quantized_divergence_script_compares_every_module(tmp_path):
    """benchmarks/quant_divergence.py on the CPU (its bf16 run there too): each format's logits and modules, compared
    whole; the CPU's bf16 is its own reference path, so both bf16 runs agree exactly, with any fast path off too."""
    done = subprocess.run([sys.executable, "benchmarks/quant_divergence.py", "--device", "cpu", "--formats",
                           "gptq_asym", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "quant_divergence.json").read_text())["gptq_asym"]
    assert 0 < result["gpu"] == result["cpu_bf16"] < 0.1
    assert set(result["gpu_without"]) == set(quant_divergence.FAST_PATHS)
    assert all(error == result["gpu"] for error in result["gpu_without"].values())
    names = [row["module"] for row in result["gpu_modules"]]
    assert "layers.0.mlp.experts" in names and "lm_head" in names
    assert all(isinstance(row["error"], float) for row in result["gpu_modules"])
