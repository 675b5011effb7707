"""The reference rig at full size on one H200 (issue 7, item 3, and the ladder switch of item 4), in one device call.

    python3 benchmarks/rig_h200.py --out $OUT                     # reference-h200, reference-hybrid-64 (~57 GB)
    python benchmarks/rig_h200.py --toy --device cpu --out /tmp/x # the same steps at toy size on a CPU (the tests)

Steps, each guarded by its own time budget (a failure or timeout is recorded and the run goes on; the whole run
stays inside --budget-s, and a watchdog writes the record and exits if it does not): the host-to-device copy rate;
the random checkpoint made in place in shared host memory (HostImage.random, never on disk); the engine refusing to
start at the planner's refused cuts; the incumbent started, compared per rank, warmed up and compared again; the
refused cuts refused by the engine's plan and apply; live cut changes under load, back to the incumbent, and a shape
change under load, each compared per rank and every request accounted for; then a two-rung ladder on a smaller model,
each switch timed against its predicted cost; last, the model converted to block-scaled FP8 as Qwen publishes it
(QUANTIZED) started at the incumbent, warmed up and compared per rank again (--skip-quantized leaves it out).
Everything goes to <out>/rig_h200.json, the log to <out>/rig_h200.log.
"""

from __future__ import annotations

import gc
import json
import platform
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import rig_engine  # noqa: E402
from benchmarks.rig_load import Load  # noqa: E402
from benchmarks.rig_steps import Record, Steps, begin_run, run_arguments  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.control.operations import host_ram_available  # noqa: E402
from engine.memory.host_image import HostImage  # noqa: E402
from solvers.census import CONFIG_DIR  # noqa: E402
from solvers.frontier import compute_frontier  # noqa: E402
from solvers.rig import Rig, load_rig  # noqa: E402

# Qwen's fp8 checkpoints: 128 x 128 blocks, the routers, the shared experts' gates, GDN's small in_proj_ba and lm_head
# kept at the model dtype (bare module names: every layer's).
QUANTIZED = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["lm_head", "mlp.gate", "mlp.shared_expert_gate", "linear_attn.in_proj_ba"]}
# Moves: frontier cuts of the planner, the first one the change that ran out of memory on 2026-12-02, the last one
# back to the incumbent. Refused: a pool too small for one sequence, and a rank over its budget (two reasons).
FULL = {"config": "reference-hybrid-64", "overrides": {}, "rig": "reference-h200", "incumbent": [28, 20, 16],
        "moves": [[30, 17, 17], [31, 16, 17], [32, 15, 17], [33, 15, 16], [28, 20, 16]],
        "refused": [[27, 21, 16], [26, 22, 16]], "shape": {"max_num_seqs": 4, "max_model_len": 40960},
        "prompt": 512, "tokens": 24, "width": 4,
        # two rung images of the full model would not fit the host's RAM: the bench model's size (48 layers)
        "ladder": {"overrides": {"num_hidden_layers": 48, "num_experts": 32}, "rungs": [[16, 16, 16], [18, 15, 15]]},
        # seconds a step may take, and what it usually needs (2026-12-04: image 12-20 s, start 99-116 s and warm-up
        # 116-142 s, the ranks capturing decode graphs at build and compiling kernels)
        "budgets": {"h2d": 40, "image": 120, "refused_at_start": 30, "start": 300, "warmup": 240,
                    "refused_by_engine": 30, "move": 120, "shape": 120, "shutdown": 60, "ladder": 240,
                    "quantized": 300},
        "needs": {"start": 120, "warmup": 150, "move": 20, "shape": 20, "shutdown": 20, "ladder": 120,
                  "quantized": 200}}
# The same steps on the CPU demo rig: [7,5,4] -> [8,4,4] grows rank 1's pool past what its budget could hold beside
# the old one, the case that ran out of memory on the H200; the ladder model has another depth than the rig's incumbent.
TOY = {"config": "demo-hybrid-16", "overrides": {}, "rig": "cpu-demo", "incumbent": [7, 5, 4],
       "moves": [[8, 4, 4], [9, 3, 4], [7, 5, 4]], "refused": [[3, 12, 1], [1, 1, 14]],
       "shape": {"max_num_seqs": 4, "max_model_len": 4096}, "prompt": 16, "tokens": 6, "width": 4,
       "ladder": {"overrides": {"num_hidden_layers": 12}, "rungs": [[5, 4, 3], [6, 3, 3]]},
       "budgets": {"h2d": 40, "image": 60, "refused_at_start": 30, "start": 120, "warmup": 120,
                   "refused_by_engine": 30, "move": 90, "shape": 90, "shutdown": 60, "ladder": 180, "quantized": 180},
       "needs": {"start": 20, "warmup": 10, "move": 5, "shape": 5, "shutdown": 5, "ladder": 20, "quantized": 30}}


def write_config(name: str, overrides: dict, folder: Path) -> Path:
    config = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    config.pop("_comment", None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, **overrides}))
    return folder


def rig_for(name: str, device: str) -> Rig:
    rig = load_rig(name)
    if device == "cpu":
        rig = replace(rig, ranks=tuple(replace(spec, device="cpu") for spec in rig.ranks))
    return rig


def environment(device: str) -> dict:
    facts = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
             "host_ram_available": host_ram_available()}
    if device == "cuda":
        facts["card"] = torch.cuda.get_device_name()
        facts["total_memory"] = torch.cuda.get_device_properties(0).total_memory
    try:
        import fla

        facts["fla"] = fla.__version__
    except ImportError:
        facts["fla"] = None
    return facts


def frontier_cuts(folder: Path, rig: Rig) -> list[list[int]]:
    return [list(point.cut) for point in compute_frontier(ModelConfig.from_pretrained(folder).census, rig).points]


def main() -> None:
    parser = run_arguments(__doc__, 510.0)
    parser.add_argument("--skip-ladder", action="store_true",
                        help="the rig's steps only, with the ladder's time left to them (a ladder measured before)")
    parser.add_argument("--skip-quantized", action="store_true", help="leave out the FP8 model's start")
    args = parser.parse_args()
    case = TOY if args.toy else FULL
    record, live = begin_run(args, "rig_h200", case, environment(args.device))
    steps = Steps(record, args.budget_s)
    run_rig(case, args, record, steps, live)
    if not args.skip_ladder:
        run_ladder(case, args, record, steps, live)
    if not args.skip_quantized:
        steps.run("quantized", case["budgets"]["quantized"], run_quantized, case, args, record.data, live,
                  engine=False, need_s=case["needs"]["quantized"])
    record.data["summary"] = summary(record.data)
    record.save()
    print(json.dumps(record.data["summary"], indent=1, default=str), flush=True)


def run_rig(case: dict, args, record: Record, steps: Steps, live: list) -> None:
    data, budgets, needs = record.data, case["budgets"], case["needs"]
    # the rig's steps leave the ladder and the quantized model the time they need
    ladder_reserve = (needs["shutdown"] + (0 if args.skip_ladder else needs["ladder"])
                      + (0 if args.skip_quantized else needs["quantized"]))
    if args.device == "cuda" and not args.skip_ladder:  # the host link is what a ladder switch uses
        data["h2d"] = steps.run("h2d", budgets["h2d"], rig_engine.h2d_bandwidth, 4.0, engine=False)
    folder = write_config(case["config"], case["overrides"], args.work / case["config"])
    rig = rig_for(case["rig"], args.device)
    data["frontier"] = frontier_cuts(folder, rig)
    config = ModelConfig.from_pretrained(folder)
    image = steps.run("image", budgets["image"], HostImage.random, config, engine=False)
    data["image"] = {"bytes": image.bytes if image else None, "seconds": data["steps"]["image"].get("seconds")}
    data["refused_at_start"] = []
    steps.run("refused_at_start", budgets["refused_at_start"], rig_engine.refused_at_start, folder, rig,
              case["refused"], image, data["refused_at_start"], engine=False)
    data["start"] = {}
    driver = steps.run("start", budgets["start"], rig_engine.start, folder, rig, case["incumbent"], image,
                       data["start"], live, skip=None if image else "no host image", need_s=needs["start"],
                       reserve_s=ladder_reserve)
    down = None if driver else "the engine did not start"
    data["warmup"] = {}
    steps.run("warmup", budgets["warmup"], rig_engine.warmup, driver, case["prompt"], case["tokens"], case["width"],
              data["warmup"], skip=down, need_s=needs["warmup"], reserve_s=ladder_reserve)
    data["refused_by_engine"] = []
    steps.run("refused_by_engine", budgets["refused_by_engine"], rig_engine.refused_by_engine, driver,
              case["refused"], data["refused_by_engine"], skip=down)
    load = Load(driver, case["prompt"], case["tokens"], case["width"]) if driver else None
    data["cuts"] = []
    for cut in case["moves"]:
        entry = {"on_frontier": cut in data["frontier"]}
        data["cuts"].append(entry)
        steps.run("cut " + ",".join(map(str, cut)), budgets["move"], rig_engine.change, driver, "cut", {"cut": cut},
                  load, budgets["move"] - 5, entry, skip=down, need_s=needs["move"], reserve_s=ladder_reserve)
    data["shape"] = {}
    steps.run("shape", budgets["shape"], rig_engine.change, driver, "shape", case["shape"], load,
              budgets["shape"] - 5, data["shape"], skip=down, need_s=needs["shape"], reserve_s=ladder_reserve)
    if driver is not None:
        data["snapshot_phase"] = driver.phase
        steps.run("shutdown", budgets["shutdown"], stop_rig, driver, load, data, live, engine=False,
                  need_s=needs["shutdown"])
    del driver, image, load
    gc.collect()  # the full image (57 GB) goes before the ladder's is made


def stop_rig(driver, load: Load, data: dict, live: list) -> None:
    """Account for every request, then stop the ranks: the ladder's ranks need the card's memory next."""
    try:
        data["load"] = load.close(timeout=30.0)
        for entry in [*data["cuts"], data["shape"]]:
            if "in_flight_at_apply" in entry:
                entry["in_flight_outcomes"] = load.outcomes(entry["in_flight_at_apply"])
    finally:
        stop_driver(driver, live)


def stop_driver(driver, live: list) -> None:
    """Stop the driver and its ranks, and take it off the watchdog's list."""
    driver.shutdown()
    # An operation stuck past its step's budget may still be restoring (and restarting ranks): end it too.
    driver.loop.join(timeout=30.0)
    for process in driver.ranks.processes:
        if process.is_alive():
            process.kill()
    live.remove(driver)


def run_quantized(case: dict, args, data: dict, live: list) -> None:
    """The model as block-scaled FP8 (its host image random in the formats' own dtypes): started at the incumbent,
    each rank's allocation compared with the planner's prediction, then again after a wave of requests."""
    overrides = {**case["overrides"], "quantization_config": QUANTIZED}
    folder = write_config(case["config"], overrides, args.work / (case["config"] + "-fp8"))
    rig = rig_for(case["rig"], args.device)
    out = data["quantized"] = {"quantization_config": QUANTIZED, "start": {}, "warmup": {}}
    image = HostImage.random(ModelConfig.from_pretrained(folder))
    out["image_bytes"] = image.bytes
    driver = rig_engine.start(folder, rig, case["incumbent"], image, out["start"], live)
    try:
        rig_engine.warmup(driver, case["prompt"], case["tokens"], case["width"], out["warmup"])
    finally:
        stop_driver(driver, live)


def run_ladder(case: dict, args, record: Record, steps: Steps, live: list) -> None:
    data, ladder = record.data, case["ladder"]
    folder = write_config(case["config"], ladder["overrides"], args.work / (case["config"] + "-ladder"))
    data["ladder"] = {"host_ram_available": host_ram_available()}
    steps.run("ladder", case["budgets"]["ladder"], rig_engine.ladder_switch, folder, rig_for(case["rig"], args.device),
              ladder["rungs"], data.get("h2d"), data["ladder"], live, engine=False, need_s=case["needs"]["ladder"])


def summary(data: dict) -> dict:
    """The figures the docs table: one row per cut, the refusals, the requests, the ladder."""
    rows = []
    start = data.get("start") or {}
    served = [{"target": {"cut": start.get("cut")}, "status": "served", **data["warmup"]}] \
        if (data.get("warmup") or {}).get("compare") else []
    for entry in [{"target": {"cut": start.get("cut")}, "status": "started", **start}, *served, *data.get("cuts", [])]:
        compared = entry.get("compare") or {}
        rows.append({"cut": (entry.get("target") or {}).get("cut"), "status": entry.get("status"),
                     "seconds": entry.get("seconds"), "pool": compared.get("pool_tokens"),
                     "binding": compared.get("binding_rank"), "exact": compared.get("exact"),
                     "error": entry.get("error")})
    ladder = data.get("ladder") or {}
    return {"steps": {name: step["status"] for name, step in data.get("steps", {}).items()}, "cuts": rows,
            "refused_at_start": [(r["cut"], r.get("agree")) for r in data.get("refused_at_start", [])],
            "quantized": {moment: ((data.get("quantized") or {}).get(moment) or {}).get("compare", {}).get("exact")
                          for moment in ("start", "warmup")},
            "refused_by_engine": [(r["cut"], r.get("agree")) for r in data.get("refused_by_engine", [])],
            "shape": (data.get("shape") or {}).get("status"),
            "load": {k: v for k, v in (data.get("load") or {}).items() if k != "requests"},
            "ladder": {name: {k: (ladder.get(name) or {}).get(k) for k in
                              ("status", "seconds", "switch_s", "predicted_switch_cost_s", "switch_vs_predicted")}
                       for name in ("up", "back")} | {"predicted_at_measured_h2d_s":
                                                       ladder.get("predicted_at_measured_h2d_s")}}


if __name__ == "__main__":
    main()
