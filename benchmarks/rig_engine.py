"""What the rig run asks of the engine: start it, see it refuse, warm it up, change its layout (under load), probe
its ranks, move on a ladder. Each function fills in its own part of the run's record as it goes, so a step cut off
by its budget still leaves what it saw.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.rig_compare import compare, transition
from benchmarks.rig_load import Load
from contracts.control import LayoutFigures, OperationStatus
from engine.config import ModelConfig
from engine.control.driver import PipelineDriver
from engine.control.protocol import ApplyRefused
from engine.errors import EngineError
from engine.memory.device import pin_host_buffer
from engine.memory.host_image import HostImage
from engine.runtime.sampler import SamplingParams
from solvers.capacity import CutPricer
from solvers.ladder import switch_cost_s
from solvers.rig import Rig

PROBE_CHUNK = 64 << 20


def probe(driver: PipelineDriver, load: Load | None = None) -> list:
    """How much more each capped CUDA rank's allocator really hands out (None per CPU rank); the ranks idle."""
    try:
        if load is not None and not load.pause(timeout=60.0):
            return ["the load did not pause within 60 s: not probed"] * driver.rig.size
        return driver.ranks.call_all("probe", [PROBE_CHUNK] * driver.rig.size)
    finally:
        if load is not None:
            load.resume()


def refused_at_start(folder: Path, rig: Rig, cuts: list[list[int]], image: HostImage | None, out: list) -> None:
    """Starting the engine at a cut the planner refuses must fail with the planner's own reasons."""
    census = ModelConfig.from_pretrained(folder).census
    for cut in cuts:
        planner = CutPricer(census, rig, rig.shape).price(cut)
        row = {"cut": cut, "planner_reasons": list(planner.reasons)}
        out.append(row)
        try:
            driver = PipelineDriver(folder, rig, cut=tuple(cut), image=image)
        except EngineError as error:
            row["engine_error"] = str(error)
            row["agree"] = bool(planner.reasons) and all(reason in str(error) for reason in planner.reasons)
        else:
            driver.shutdown()
            row.update(engine_error=None, agree=False)


def start(folder: Path, rig: Rig, cut: list[int], image: HostImage, out: dict, live: list) -> PipelineDriver:
    started = time.perf_counter()
    driver = PipelineDriver(folder, rig, cut=tuple(cut), image=image)
    live.append(driver)
    out.update(seconds=time.perf_counter() - started, shared_device=driver.ranks.shared_device, cut=cut)
    probes = probe(driver)
    out["compare"] = compare(driver.prediction, driver.measured, probes)
    return driver


def warmup(driver: PipelineDriver, prompt: int, tokens: int, width: int, out: dict) -> None:
    """One wave before anything is timed: a GPU rank compiles its kernels in its first steps."""
    started = time.perf_counter()
    handles = [driver.submit(list(range(1 + i, prompt + 1 + i)), SamplingParams(max_tokens=tokens, ignore_eos=True))
               for i in range(width)]
    for handle in handles:
        handle.wait()
    out.update(seconds=time.perf_counter() - started, finish_reasons=[h.finish_reason for h in handles],
               errors=[h.error for h in handles if h.error])
    # The start was measured before the first request; a rank that has served holds its whole CUDA context (the
    # prefill kernels load at the first request), which is what the planner's overhead prices: measured again now.
    out["compare"] = compare(driver.prediction, driver.ranks.call_all("measure", [None] * driver.rig.size))


def refused_by_engine(driver: PipelineDriver, cuts: list[list[int]], out: list) -> None:
    """The engine's /control/plan calls these cuts infeasible with the planner's reasons; /control/apply refuses."""
    for cut in cuts:
        planner = CutPricer(driver.census, driver.rig, driver.shape).price(cut)
        planned = driver.plan({"kind": "cut", "target": {"cut": cut}, "incumbent_fingerprint": driver.fingerprint()})
        row = {"cut": cut, "planner_reasons": list(planner.reasons), "plan_feasible": planned.feasible,
               "plan_reasons": list(planned.reasons)}
        out.append(row)
        try:
            driver.apply(planned.plan.to_dict(), planned.plan_hash)
            row["apply"] = {"refused": False}
        except ApplyRefused as error:
            row["apply"] = {"refused": True, "status": error.status, "message": str(error)}
        engine_text = " ".join(planned.reasons) + " " + row["apply"].get("message", "")
        row["agree"] = (not planned.feasible and row["apply"]["refused"] and bool(planner.reasons)
                        and all(reason in engine_text for reason in planner.reasons))


def _pool(figures: LayoutFigures | None) -> dict | None:
    return None if figures is None else {"pool_tokens": figures.pool_tokens, "binding_rank": figures.binding_rank}


def change(driver: PipelineDriver, kind: str, target: dict, load: Load | None, budget_s: float, out: dict) -> None:
    """Plan and apply one operation (under load when given), wait for it, and set the prediction beside what the
    ranks allocated; the requests in flight when it was applied are listed for the final account."""
    before = driver.prediction
    planned = driver.plan({"kind": kind, "target": target, "incumbent_fingerprint": driver.fingerprint()})
    out.update(kind=kind, target=target, feasible=planned.feasible, plan_reasons=list(planned.reasons))
    if not planned.feasible:
        return
    if load is not None:
        out["streaming_at_apply"] = load.streaming(timeout=min(60.0, budget_s / 3))
        out["in_flight_at_apply"] = load.in_flight()
    preempted = driver.scheduler.preemptions
    started = time.perf_counter()
    op_id = driver.apply(planned.plan.to_dict(), planned.plan_hash)
    out["operation_id"] = op_id
    deadline = time.monotonic() + budget_s
    while (op := driver.operation(op_id)).phase != "done" or driver.phase not in ("serving", "broken"):
        if time.monotonic() > deadline:
            out.update(status=op.status.value, phase=op.phase, error="not done within the step's budget")
            raise TimeoutError(f"operation {op_id} still {op.phase} after {budget_s:.0f} s")
        time.sleep(0.05)  # the op reads done a moment before the engine serves again
    out.update(seconds=time.perf_counter() - started, status=op.status.value, error=op.error, notes=list(op.notes),
               engine_phase=driver.phase, predicted=_pool(op.predicted),
               preempted=driver.scheduler.preemptions - preempted)
    if op.status != OperationStatus.SUCCEEDED:
        out["previous"] = _pool(op.previous)
        return
    if kind == "cut":
        out["transition"] = transition(driver.census, before, driver.prediction)
    if op.measured.switch_s is not None:
        out["switch_s"] = op.measured.switch_s
    out["compare"] = compare(driver.prediction, driver.measured, probe(driver, load))


def ladder_switch(folder: Path, rig: Rig, rungs: list[list[int]], h2d: dict | None, out: dict, live: list) -> None:
    """Arm a two-rung ladder, move to the second rung and back, each switch timed against its predicted cost."""
    config = ModelConfig.from_pretrained(folder)
    started = time.perf_counter()
    image = HostImage.random(config, rungs=[tuple(r) for r in rungs])
    out.update(image_bytes=image.bytes, image_s=time.perf_counter() - started)
    started = time.perf_counter()
    driver = PipelineDriver(folder, rig, cut=tuple(rungs[0]), ladder=[tuple(r) for r in rungs], image=image)
    live.append(driver)
    out.update(start_s=time.perf_counter() - started, notes=driver.notes)
    try:
        ladder = driver.ladder()
        out.update(rungs=rungs, image_bytes_per_rank=list(ladder.image_bytes),
                   h2d_bytes_per_s_rig=list(ladder.h2d_bytes_per_s))
        if h2d is not None:  # the same formula at the link measured in this run, shared by the ranks copying at once
            shared = [h2d["bytes_per_s"] / rig.size] * rig.size
            out["predicted_at_measured_h2d_s"] = max(size / rate for size, rate in
                                                     zip(ladder.image_bytes, shared, strict=True))
        for name, rung in (("up", rungs[1]), ("back", rungs[0])):
            move: dict = {}
            out[name] = move
            change(driver, "ladder", {"rung": rung}, None, 180.0, move)
            move["predicted_switch_cost_s"] = switch_cost_s(ladder, rung)
            move["copy_s"] = [m.get("copy_s") for m in driver.measured]
            if move.get("switch_s"):
                move["switch_vs_predicted"] = round(move["switch_s"] / move["predicted_switch_cost_s"], 3)
    finally:
        driver.shutdown()
        live.remove(driver)


def h2d_bandwidth(gib: float) -> dict:
    """Host (shared memory, like the image) to device copy rate, pageable and pinned; `bytes_per_s` is the one a
    ladder switch uses here: pinned, as the ranks pin their rung images, unless CUDA refused to pin."""
    host = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(int(gib * 2**30)))
    host.fill_(1)
    device = torch.empty_like(host, device="cuda")
    result = {"bytes": host.numel(), "pageable": _median_copy_s(device, host)}
    pin_error = pin_host_buffer(host)
    if pin_error is None:
        result["pinned"] = _median_copy_s(device, host)
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())  # before the buffer goes
    else:
        result["pinned"] = pin_error
    used = result["pinned"] if pin_error is None else result["pageable"]
    result.update(median_s=used["median_s"], bytes_per_s=used["bytes_per_s"])
    return result


def _median_copy_s(device: torch.Tensor, host: torch.Tensor) -> dict:
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        device.copy_(host)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    median = sorted(times)[2]
    return {"median_s": median, "bytes_per_s": host.numel() / median}
