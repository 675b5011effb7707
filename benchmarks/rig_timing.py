"""The timing model against the reference rig at full size (issue 29, item 3), in one device call.

    python3 benchmarks/rig_timing.py --out $OUT                     # reference-h200, reference-hybrid-64 (~57 GB)
    python benchmarks/rig_timing.py --toy --device cpu --out /tmp/x # the same steps at toy size on a CPU (the tests)

The engine starts at the incumbent and moves through the case's layouts under one load (`width` requests of `prompt`
tokens, each generating `tokens`, in waves), back to the incumbent at the end (an A-vs-A repeat). At each layout the
load pauses, the layout's stage log starts afresh, and the rig serves until it has logged `decode_steps` decode steps
at the full batch, cut into `repeats` chunks (each chunk's per-rank median one sample); then, the load paused,
`prefill_steps` prompts of `prompt` tokens go through one at a time, each prefill step one sample. Then
solvers.timing_validation predicts every layout from a fit over the others (leave one layout out), for decode and
prefill apart, and solvers.timing_fit checks every layout against the fit over all of them. Everything goes to
<out>/rig_timing.json, the log to <out>/rig_timing.log.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import rig_engine  # noqa: E402
from benchmarks.rig_h200 import environment, rig_for, write_config  # noqa: E402
from benchmarks.rig_load import Load  # noqa: E402
from benchmarks.rig_steps import Record, Steps, begin_run, run_arguments  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.control.driver import PipelineDriver  # noqa: E402
from engine.memory.host_image import HostImage  # noqa: E402
from engine.runtime.sampler import SamplingParams  # noqa: E402
from solvers.calibration import Sample  # noqa: E402
from solvers.timing_fit import fit_timing  # noqa: E402
from solvers.timing_validation import validate_timing  # noqa: E402

# Nine layouts the planner accepts on reference-h200 (every rank's layer count moved both ways from the incumbent,
# one to four layers a move), then the incumbent again.
FULL = {"config": "reference-hybrid-64", "overrides": {}, "rig": "reference-h200", "incumbent": [28, 20, 16],
        "layouts": [[29, 18, 17], [30, 17, 17], [32, 16, 16], [31, 19, 14], [30, 20, 14], [28, 17, 19],
                    [27, 19, 18], [26, 20, 18], [25, 20, 19], [28, 20, 16]],
        "prompt": 512, "tokens": 48, "width": 4, "decode_steps": 160, "prefill_steps": 8, "repeats": 4,
        # seconds a step may take (2026-12-06: start 66-116 s and warm-up 49-154 s, less with Triton's cache)
        "budgets": {"image": 120, "start": 300, "warmup": 240, "move": 90, "measure": 60, "shutdown": 60},
        "needs": {"start": 120, "warmup": 150, "move": 25, "measure": 10, "shutdown": 20}}
TOY = {"config": "demo-hybrid-16", "overrides": {}, "rig": "cpu-demo", "incumbent": [7, 5, 4],
       "layouts": [[8, 4, 4], [6, 6, 4], [7, 4, 5], [9, 3, 4], [6, 5, 5], [8, 5, 3], [5, 6, 5], [7, 5, 4]],
       "prompt": 16, "tokens": 12, "width": 4, "decode_steps": 24, "prefill_steps": 3, "repeats": 3,
       "budgets": {"image": 60, "start": 120, "warmup": 120, "move": 60, "measure": 60, "shutdown": 60},
       "needs": {"start": 20, "warmup": 10, "move": 5, "measure": 5, "shutdown": 5}}


def collect(driver: PipelineDriver, load: Load, case: dict, budget_s: float, out: dict) -> None:
    """The layout's stage times: decode steps at the full batch under the load, in `repeats` chunks; then, with the
    load paused, `prefill_steps` prompts of `prompt` tokens one at a time, each one prefill step of that size."""
    deadline = time.monotonic() + budget_s
    if not load.pause(timeout=budget_s / 2):
        raise TimeoutError("the load's wave did not finish")
    # The steps logged since the layout changed mix the requests the change caught in flight; the load is idle now.
    driver.stages.clear()
    load.resume()
    while len(decode := _steps(driver, "decode", case["width"])) < case["decode_steps"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(decode)} decode steps at batch {case['width']} within {budget_s:.0f} s")
        time.sleep(0.05)
    chunk = len(decode) // case["repeats"]
    out.update(cut=list(driver.cut), decode_batch=case["width"], decode_step_count=len(decode),
               decode=[_median(decode[i * chunk:(i + 1) * chunk]) for i in range(case["repeats"])])
    if not load.pause(timeout=max(deadline - time.monotonic(), 1.0)):
        raise TimeoutError("the load's wave did not finish before the prefill steps")
    try:
        driver.stages.clear()
        vocab = driver.config.vocab_size
        for i in range(case["prefill_steps"]):  # alone in the engine: every prefill step holds exactly one prompt
            prompt = [(7919 * (i + 1) * (j + 1)) % vocab for j in range(case["prompt"])]
            if not driver.submit(prompt, SamplingParams(max_tokens=1)).wait(timeout=deadline - time.monotonic()):
                raise TimeoutError(f"prefill request {i} unanswered within the step's budget")
        out.update(prefill_tokens=case["prompt"], prefill=_steps(driver, "prefill", case["prompt"]))
    finally:
        load.resume()


def _steps(driver: PipelineDriver, kind: str, tokens: int) -> list[list[float]]:
    """Per-rank stage ms of the logged steps of `kind` with exactly `tokens` tokens."""
    return [ms for logged_kind, count, ms, _host_ms in list(driver.stages.steps)
            if logged_kind == kind and count == tokens]


def _median(steps: list[list[float]]) -> list[float]:
    return [round(statistics.median(rank), 4) for rank in zip(*steps, strict=True)]


def analyse(layouts: list[dict], kind: str, noise_floor: float, incumbent: list[int]) -> dict | None:
    """Leave-one-layout-out validation and the in-sample check of one kind of step."""
    samples = [Sample(tuple(entry["cut"]), tuple(ms)) for entry in layouts if entry.get(kind) for ms in entry[kind]]
    if not samples:
        return None
    fit = fit_timing(samples, tuple(incumbent), noise_floor)
    return {"samples": len(samples), "validation": validate_timing(samples, noise_floor).to_dict(),
            "fit": fit.to_dict()}


def main() -> None:
    args = run_arguments(__doc__, 540.0).parse_args()
    case = TOY if args.toy else FULL
    record, live = begin_run(args, "rig_timing", case, environment(args.device))
    run(case, args, record, Steps(record, args.budget_s), live)
    record.save()
    print(json.dumps(record.data.get("summary"), indent=1, default=str), flush=True)


def run(case: dict, args, record: Record, steps: Steps, live: list) -> None:
    data, budgets, needs = record.data, case["budgets"], case["needs"]
    reserve = needs["shutdown"]
    folder = write_config(case["config"], case["overrides"], args.work / case["config"])
    rig = rig_for(case["rig"], args.device)
    image = steps.run("image", budgets["image"], HostImage.random, ModelConfig.from_pretrained(folder), engine=False)
    data["start"] = {}
    driver = steps.run("start", budgets["start"], rig_engine.start, folder, rig, case["incumbent"], image,
                       data["start"], live, skip=None if image else "no host image", need_s=needs["start"],
                       reserve_s=reserve)
    down = None if driver else "the engine did not start"
    data["warmup"] = {}
    steps.run("warmup", budgets["warmup"], rig_engine.warmup, driver, case["prompt"], case["tokens"], case["width"],
              data["warmup"], skip=down, need_s=needs["warmup"], reserve_s=reserve)
    load = Load(driver, case["prompt"], case["tokens"], case["width"]) if driver else None
    data["layouts"] = []
    for index, cut in enumerate([case["incumbent"], *case["layouts"]]):
        entry: dict = {"target": cut}
        data["layouts"].append(entry)
        if index:  # the first is the incumbent the engine started at
            moved = steps.run(f"move {index} " + ",".join(map(str, cut)), budgets["move"], rig_engine.change, driver,
                              "cut", {"cut": cut}, load, budgets["move"] - 5, entry.setdefault("change", {}),
                              skip=down, need_s=needs["move"], reserve_s=reserve)
            if entry["change"].get("status") != "succeeded":
                entry["skipped"] = f"the move did not succeed ({moved!r}, {entry['change'].get('error')})"
                continue
        steps.run(f"measure {index} " + ",".join(map(str, cut)), budgets["measure"], collect, driver, load, case,
                  budgets["measure"] - 5, entry, skip=down, need_s=needs["measure"], reserve_s=reserve)
        record.save()
    if driver is not None:
        data["load"] = {k: v for k, v in load.close(timeout=30.0).items() if k != "requests"}
        steps.run("shutdown", budgets["shutdown"], driver.shutdown, engine=False, need_s=needs["shutdown"])
        live.remove(driver)
    measured = [entry for entry in data["layouts"] if entry.get("decode")]
    data["summary"] = {"layouts_measured": len({tuple(e["cut"]) for e in measured}),
                       "steps": {name: step["status"] for name, step in data.get("steps", {}).items()},
                       **{kind: analyse(measured, kind, rig.noise_floor, case["incumbent"])
                          for kind in ("decode", "prefill")}}


if __name__ == "__main__":
    main()
