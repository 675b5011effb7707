"""Ranks on separate GPUs over NCCL (issue 8), in one device call.

    python3 benchmarks/multi_gpu.py --out $OUT                      # one rank per visible GPU (N >= 2), NCCL
    python benchmarks/multi_gpu.py --toy --device cpu --out /tmp/x  # the same steps on the CPU demo rig, gloo

Steps, each guarded by its own time budget (a failure or timeout is recorded and the run goes on; the whole run stays
inside --budget-s, and a watchdog writes the record and stops the services if it does not): a random Qwen3-Next
checkpoint; the engine service (`python -m engine serve`) with one rank per GPU; greedy tokens of a few prompts;
prefill and decode tokens/s at the incumbent cut and two others (each reached by a live cut change); the solvers'
timing model calibrated at the incumbent and held against the other two; one live cut change under streaming load,
every request accounted for; then the same engine on one rank on cuda:0 for the same greedy tokens. Everything goes to
<out>/multi_gpu.json, the log (the services' output too) to <out>/multi_gpu.log.
"""

from __future__ import annotations

import os

# NVLink multicast stays off (the device README: it can take the host's shared GPUs down). Set before torch and NCCL
# start, and inherited by the service and its rank processes.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in MULTICAST_OFF.items():
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import multi_gpu_case as cases  # noqa: E402
from benchmarks.multi_gpu_measure import predictions, throughput  # noqa: E402
from benchmarks.multi_gpu_service import HttpEngine, Service, change  # noqa: E402
from benchmarks.rig_load import Load  # noqa: E402
from benchmarks.rig_steps import Record, Steps, arm_watchdog, setup_logging  # noqa: E402
from solvers.rig import load_rig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--toy", action="store_true", help="the CPU demo rig and checkpoint (a check of this script)")
    parser.add_argument("--gpus", type=int, help="ranks, one per GPU (default: every visible GPU)")
    parser.add_argument("--budget-s", type=float, default=510.0, help="the whole run's time budget")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seam-multi-gpu"), help="checkpoint and rig files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setup_logging(args.out / "multi_gpu.log")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP call (the polling) would drown the log
    gpus = (args.gpus or torch.cuda.device_count()) if args.device == "cuda" else 0
    record = Record(args.out / "multi_gpu.json", {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv,
        "command": shlex.join([sys.executable, *sys.argv]), "budget_s": args.budget_s,
        "environment": cases.environment(args.device)})
    refusal = refuse_to_run(args, gpus)
    if refusal:
        record.data["refused"] = refusal
        record.save()
        print(refusal, file=sys.stderr, flush=True)
        sys.exit(2)
    case = cases.toy_case() if args.toy else cases.full_case(gpus, args.work)
    record.data["case"] = case
    live: list[Service] = []  # the services running now: the watchdog stops them
    arm_watchdog(record, args.budget_s + 30, lambda: [service.stop(10) for service in list(live)])
    steps = Steps(record, args.budget_s)
    try:
        run(case, args, record, steps, live)
    finally:
        for service in list(live):  # a run cut short by an error: no service outlives it
            service.stop()
    record.data["summary"] = summary(record.data)
    record.save()
    print(json.dumps(record.data["summary"], indent=1, default=str), flush=True)


def refuse_to_run(args: argparse.Namespace, gpus: int) -> str | None:
    """A multicast variable set otherwise than off, the service's packages missing, or fewer than two GPUs for the full
    run: nothing is started."""
    unsafe = {name: os.environ[name] for name, value in MULTICAST_OFF.items() if os.environ[name] != value}
    if unsafe:
        return f"NVLink multicast must stay off: {unsafe} set in the environment (want {MULTICAST_OFF})"
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        return f"the engine service needs {missing}: carry their wheels (.whl, docs/benchmarks.md)"
    if args.toy != (args.device == "cpu"):
        return "--toy runs on the CPU (--device cpu); the full run on CUDA GPUs"
    if args.device == "cuda" and not 2 <= gpus <= torch.cuda.device_count():
        return f"the full run needs 2 or more CUDA GPUs: asked for {gpus}, {torch.cuda.device_count()} visible"
    return None


def run(case: dict, args: argparse.Namespace, record: Record, steps: Steps, live: list[Service]) -> None:
    data, budgets, needs = record.data, case["budgets"], case["needs"]
    keep = needs["single"]  # the single-GPU reference's time is kept through the multi-rank steps
    folder = args.work / ("demo" if case["model"] == "demo" else "hybrid-{num_hidden_layers}x{num_experts}".format(
        **case["model"]))
    data["checkpoint"] = steps.run("checkpoint", budgets["checkpoint"], cases.write_checkpoint, case, folder,
                                   engine=False, need_s=needs["checkpoint"])
    no_checkpoint = None if data["checkpoint"] else "no checkpoint"
    data["planner"] = steps.run("planner", 60, cases.planner_view, folder, case["rig"],
                                [case["incumbent"], *case["cuts"]], engine=False, skip=no_checkpoint, need_s=5)
    multi: dict = data.setdefault("multi", {"rig": case["rig"]})
    service = steps.run("start multi", budgets["start"], start, "multi", folder, case["rig"], case["incumbent"], live,
                        budgets["start"] - 5, multi, skip=no_checkpoint, need_s=needs["start"], reserve_s=keep)
    engine = HttpEngine(service.url, folder) if service else None
    down = None if engine else "the multi-rank service did not start"
    tokens = data.setdefault("tokens", {})
    tokens["multi"] = steps.run("tokens multi", budgets["tokens"], greedy, engine, case["check"], tokens, skip=down,
                                need_s=needs["tokens"], reserve_s=keep)
    data["warmup"] = {}  # one untimed run: a GPU rank compiles its kernels in its first steps
    steps.run("warmup", budgets["warmup"], throughput, engine, case["incumbent"], case["batch"], case["prompt"],
              case["gen"], 1, data["warmup"], skip=down, need_s=needs["warmup"], reserve_s=keep)
    data["throughput"] = []
    for cut in [case["incumbent"], *case["cuts"]]:
        row: dict = {"cut": cut}
        data["throughput"].append(row)
        steps.run("cut " + ",".join(map(str, cut)), budgets["cut"], measure_at, engine, cut, case, budgets["cut"] / 2,
                  row, skip=down, need_s=needs["cut"], reserve_s=keep)
    measured = [row for row in data["throughput"] if "decode_tok_s" in row]
    calibrated = measured and measured[0]["cut"] == case["incumbent"]
    data["prediction"] = steps.run("prediction", 10, predictions, measured, load_rig(case["rig"]).noise_floor,
                                   engine=False, skip=None if calibrated else "the incumbent was not measured")
    data["live_change"] = {}
    steps.run("live change", budgets["live_change"], change_under_load, engine, case, budgets["live_change"] - 10,
              data["live_change"], skip=down, need_s=needs["live_change"], reserve_s=keep)
    stop(live, engine, multi)
    single: dict = data.setdefault("single", {"rig": case["single_rig"]})
    service = steps.run("start single", budgets["start"], start, "single", folder, case["single_rig"],
                        case["single_cut"], live, budgets["start"] - 5, single, engine=False, skip=no_checkpoint,
                        need_s=needs["start"])
    engine = HttpEngine(service.url, folder) if service else None
    tokens["single"] = steps.run("tokens single", budgets["tokens"], greedy, engine, case["check"], tokens,
                                 engine=False, skip=None if engine else "the single-rank service did not start")
    stop(live, engine, single)
    if tokens["multi"] is not None and tokens["single"] is not None:
        tokens["tokens_equal"] = tokens["multi"] == tokens["single"]
        tokens["first_difference"] = first_differences(tokens["multi"], tokens["single"])
    else:
        tokens["tokens_equal"] = None


def first_differences(multi: list[list[int]], single: list[list[int]]) -> list[int | None]:
    """Where each prompt's tokens first part (None: equal): near-flat logits of random weights flip on a rounding."""
    return [next((i for i in range(max(len(ours), len(theirs))) if ours[i:i + 1] != theirs[i:i + 1]), None)
            for ours, theirs in zip(multi, single, strict=True)]


def start(label: str, folder: Path, rig: str, cut: list[int], live: list[Service], timeout_s: float,
          out: dict) -> Service:
    started = time.perf_counter()
    service = Service(label, folder, rig, cut, live)
    out["command"] = service.command
    service.wait_ready(timeout_s)
    engine = HttpEngine(service.url, folder)
    state = engine.state()
    engine.close()
    out.update(start_s=round(time.perf_counter() - started, 3), cut=state["cut"], pool_tokens=state["pool_tokens"],
               binding_rank=state["binding_rank"], devices=[spec.device for spec in load_rig(rig).ranks],
               notes=state["notes"], ranks=len(service.ranks),
               rank_environments=service.rank_environments(tuple(MULTICAST_OFF)))
    return service


def greedy(engine: HttpEngine, check: dict, out: dict) -> list[list[int]]:
    """Greedy tokens of the same seeded prompts, one request at a time (every engine compared sees the same batches)."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, engine.config.vocab_size, (check["prompt"],), generator=generator).tolist()
               for _ in range(check["prompts"])]
    out["prompts"] = prompts
    return [engine.complete(prompt, check["tokens"]) for prompt in prompts]


def measure_at(engine: HttpEngine, cut: list[int], case: dict, change_budget_s: float, out: dict) -> None:
    """Move to `cut` (a live change with nothing in flight) unless it serves already, then time it."""
    if engine.state()["cut"] != cut:
        out["change"] = {}
        change(engine, cut, None, change_budget_s, out["change"])
    throughput(engine, cut, case["batch"], case["prompt"], case["gen"], case["repeats"], out)


def change_under_load(engine: HttpEngine, case: dict, budget_s: float, out: dict) -> None:
    """Back to the incumbent (or, if it serves already, to the first other cut) while requests stream; every request
    is then accounted for, and one submitted after the change must finish (serving resumed)."""
    target = case["incumbent"] if engine.state()["cut"] != case["incumbent"] else case["cuts"][0]
    load = Load(engine, **case["load"])
    try:
        change(engine, target, load, budget_s, out)
        after = load.now()
        deadline = time.monotonic() + budget_s / 2
        while time.monotonic() < deadline and not any(
                r["submitted"] > after and r.get("outcome") == "finished" for r in list(load.requests)):
            time.sleep(0.1)
        out["finished_after_change"] = sum(1 for r in list(load.requests)
                                           if r["submitted"] > after and r.get("outcome") == "finished")
    finally:
        out["load"] = load.close(timeout=60.0)
        if "in_flight_at_apply" in out:
            out["in_flight_outcomes"] = load.outcomes(out["in_flight_at_apply"])


def stop(live: list[Service], engine: HttpEngine | None, out: dict) -> None:
    """Stop the running service whatever the budget says (no step may skip it: the next one needs the GPU), bounded
    by Service.stop's own waits; what happened goes to `out`."""
    started = time.perf_counter()
    if engine is not None:
        engine.close()
    for service in list(live):
        try:
            out["exit_code"] = service.stop()
        except Exception as error:  # recorded, never raised: the run goes on
            out["stop_error"] = f"{type(error).__name__}: {error}"
        live.remove(service)
    out["stop_s"] = round(time.perf_counter() - started, 3)


def summary(data: dict) -> dict:
    """The figures the docs table: steps, tokens, tok/s per cut with the prediction, the live change, the ranks' env."""
    live_change = data.get("live_change") or {}
    predicted = {tuple(entry["cut"]): entry for entry in (data.get("prediction") or {}).get("cuts", [])}
    cuts = [{"cut": row["cut"], **{key: row.get(key) for key in ("prefill_tok_s", "decode_tok_s")},
             **{f"{phase}_measured_vs_predicted": predicted.get(tuple(row["cut"]), {}).get(phase, {}).get(
                 "measured_vs_predicted") for phase in ("prefill", "decode")}} for row in data.get("throughput", [])]
    return {"steps": {name: step["status"] for name, step in data.get("steps", {}).items()},
            "devices": (data.get("multi") or {}).get("devices"),
            "tokens_equal": (data.get("tokens") or {}).get("tokens_equal"), "cuts": cuts,
            "live_change": {key: live_change.get(key) for key in ("target", "status", "seconds",
                                                                  "finished_after_change")}
            | {"load": {k: v for k, v in (live_change.get("load") or {}).items() if k != "requests"}},
            "rank_environments": (data.get("multi") or {}).get("rank_environments")}


if __name__ == "__main__":
    main()
