"""The reference rig at full size on one H200: predicted vs measured per rank, live cut and shape changes under load,
and a ladder switch against its predicted cost. One device call; everything goes to one JSON file.

    python benchmarks/rig_h200.py --out $OUT                       # reference-h200 rig, reference-hybrid-64 (~53 GB)
    python benchmarks/rig_h200.py --out /tmp/x --device cpu        # the same script at toy size, on a CPU

The checkpoint is random and never written to disk: HostImage.random fills the shared host image in place.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.config import ModelConfig  # noqa: E402
from engine.driver import PipelineDriver  # noqa: E402
from engine.host_image import HostImage  # noqa: E402
from engine.sampler import SamplingParams  # noqa: E402
from solvers.ladder import price_ladder, switch_cost_s  # noqa: E402
from solvers.rig import load_rig  # noqa: E402

FULL = {"config": "reference-hybrid-64", "rig": "reference-h200", "incumbent": [28, 20, 16],
        "moves": [[30, 17, 17], [31, 16, 17], [32, 15, 17], [33, 15, 16]], "refused": [[27, 21, 16], [35, 15, 14]],
        "shape": {"max_num_seqs": 4, "max_model_len": 65536}, "prompt": 512, "tokens": 24}
TOY = {"config": "demo-hybrid-16", "rig": "cpu-demo", "incumbent": [7, 5, 4], "moves": [[8, 4, 4], [6, 6, 4]],
       "refused": [[3, 12, 1]], "shape": {"max_num_seqs": 6}, "prompt": 16, "tokens": 6}


def write_config(name: str, folder: Path) -> Path:
    config = json.loads((ROOT / "solvers/configs" / f"{name}.json").read_text())
    config.pop("_comment", None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


class Load:
    """Keeps `width` requests in flight from a thread, in waves; counts what finished and what failed. Paused, it
    lets its wave finish and submits nothing until resumed (the probe talks to the ranks only while they idle)."""

    def __init__(self, driver: PipelineDriver, prompt: int, tokens: int, width: int = 4):
        self.driver, self.prompt, self.tokens, self.width = driver, prompt, tokens, width
        self.finished, self.failed, self.stop = 0, [], threading.Event()
        self.running, self.idle = threading.Event(), threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def pause(self) -> None:
        self.running.clear()
        self.idle.wait()

    def resume(self) -> None:
        self.idle.clear()
        self.running.set()

    def _run(self) -> None:
        vocab = self.driver.config.vocab_size
        generator = torch.Generator().manual_seed(0)
        while not self.stop.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.1)
                continue
            handles = [self.driver.submit(torch.randint(0, vocab, (self.prompt,), generator=generator).tolist(),
                                          SamplingParams(max_tokens=self.tokens, ignore_eos=True))
                       for _ in range(self.width)]
            for handle in handles:
                if not handle.wait(timeout=600):
                    self.failed.append("no answer in 600 s")
                elif handle.error:
                    self.failed.append(handle.error)
                else:
                    self.finished += 1

    def close(self) -> dict:
        self.running.set()
        self.stop.set()
        self.thread.join(timeout=900)
        return {"finished": self.finished, "failed": self.failed}


def per_rank(driver: PipelineDriver) -> list[dict]:
    """The planner's row beside what the rank measured, for every rank of the current layout."""
    return [{"predicted": row, "measured": measured}
            for row, measured in zip(driver.prediction.table(), driver.measured, strict=True)]


def probe(driver: PipelineDriver) -> list[dict | None]:
    """How much more each capped rank's allocator would really hand out, beside the planner's slack."""
    chunk = 64 << 20
    return driver.call_all("probe", [chunk] * driver.rig.size)


def wait(driver: PipelineDriver, op_id: str) -> dict:
    while (op := driver.operation(op_id))["phase"] != "done" or driver.phase not in ("serving", "broken"):
        time.sleep(0.2)  # the op reads done a moment before the engine is serving again
    return op


def move(driver: PipelineDriver, kind: str, target: dict, load: Load | None = None) -> dict:
    started = time.perf_counter()
    planned = driver.plan({"kind": kind, "target": target, "incumbent_fingerprint": driver.fingerprint()})
    if not planned["feasible"]:
        return {"kind": kind, "target": target, "feasible": False, "reasons": planned["reasons"],
                "predicted": planned["plan"]["predicted"]}
    op = wait(driver, driver.apply(planned["plan"], planned["plan_hash"]))
    seconds = time.perf_counter() - started
    if load is not None:
        load.pause()
    probes = probe(driver)
    if load is not None:
        load.resume()
    return {"kind": kind, "target": target, "feasible": True, "seconds": seconds, "status": op["status"],
            "error": op["error"], "predicted": op["predicted"], "measured": op["measured"], "ranks": per_rank(driver),
            "probe": probes}


def rig_run(case: dict, folder: Path, device: str, out: dict, save) -> dict:
    rig = load_rig(case["rig"])
    if device == "cpu":
        rig = replace(rig, ranks=tuple(replace(spec, device="cpu") for spec in rig.ranks))
    config = ModelConfig.from_pretrained(folder)
    started = time.perf_counter()
    image = HostImage.random(config)
    out.update(image_bytes=image.bytes, image_s=time.perf_counter() - started, rig=case["rig"])
    started = time.perf_counter()
    driver = PipelineDriver(folder, rig, cut=tuple(case["incumbent"]), image=image)
    out["start_s"] = time.perf_counter() - started
    out["shared_device"] = driver.shared_device
    out["cuts"] = [{"kind": "start", "target": {"cut": case["incumbent"]}, "feasible": True, "status": "succeeded",
                    "predicted": {"pool_tokens": driver.prediction.pool_tokens,
                                  "binding_rank": driver.prediction.binding_rank},
                    "ranks": per_rank(driver), "probe": probe(driver)}]
    print("started", out["start_s"], flush=True)
    save()
    load = Load(driver, case["prompt"], case["tokens"])
    try:
        for cut in case["moves"] + case["refused"]:
            out["cuts"].append(move(driver, "cut", {"cut": cut}, load))
            save()
            print("cut", cut, out["cuts"][-1].get("status"), out["cuts"][-1].get("seconds"), flush=True)
        out["shape"] = move(driver, "shape", case["shape"], load)
        print("shape", out["shape"].get("status"), flush=True)
        time.sleep(2)
        out["snapshot"] = driver.snapshot()
    finally:
        out["load"] = load.close()
        driver.shutdown()
    return out


def ladder_run(case: dict, folder: Path, device: str) -> dict:
    """A ladder move on the same rig (a smaller model: two rung images of the full one would not fit host RAM)."""
    rig = load_rig(case["rig"])
    if device == "cpu":
        rig = replace(rig, ranks=tuple(replace(spec, device="cpu") for spec in rig.ranks))
    config = ModelConfig.from_pretrained(folder)
    rungs = [tuple(case["ladder"][0]), tuple(case["ladder"][1])]
    image = HostImage.random(config, rungs=rungs)
    driver = PipelineDriver(folder, rig, cut=rungs[0], ladder=rungs, image=image)
    try:
        ladder = price_ladder(config.census, rig, rungs, driver.shape)
        result = move(driver, "ladder", {"rung": list(rungs[1])})
        result["predicted_switch_cost_s"] = switch_cost_s(ladder, rungs[1])
        result["image_bytes"] = list(ladder.image_bytes)
        back = move(driver, "ladder", {"rung": list(rungs[0])})
        result["back"] = {key: back.get(key) for key in ("status", "seconds", "measured")}
    finally:
        driver.shutdown()
    return result


def h2d_bandwidth(gib: float) -> dict:
    """Host (shared, unpinned, like the image) to device copy: the link the ladder's switch really uses."""
    host = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(int(gib * 2**30)))
    host.fill_(1)
    device = torch.empty_like(host, device="cuda")
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"bytes": host.numel(), "median_s": sorted(times)[2], "bytes_per_s": host.numel() / sorted(times)[2]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-ladder", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    case = TOY if args.device == "cpu" else FULL
    work = Path("/tmp/seam-rig")
    shutil.rmtree(work, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv, "case": case}
    save = lambda: (args.out / "rig_h200.json").write_text(json.dumps(result, indent=1, default=str))  # noqa: E731
    if args.device == "cuda":
        result["h2d"] = h2d_bandwidth(4.0)
    result["rig"] = {}
    rig_run(case, write_config(case["config"], work / case["config"]), args.device, result["rig"], save)
    save()
    if not args.skip_ladder:
        small = {**case, "ladder": [[16, 16, 16], [18, 15, 15]] if args.device == "cuda" else [[7, 5, 4], [8, 4, 4]]}
        name = "reference-hybrid-48" if args.device == "cuda" else case["config"]
        folder = write_config(case["config"], work / name)
        if args.device == "cuda":  # the bench model's size: 48 layers, 32 experts
            data = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**data, "num_hidden_layers": 48, "num_experts": 32}))
        result["ladder"] = ladder_run(small, folder, args.device)
        save()
    print(json.dumps(summary(result), indent=1))


def summary(result: dict) -> dict:
    rows = []
    for item in result["rig"]["cuts"]:
        measured, probes = item.get("measured") or {}, item.get("probe") or []
        rows.append({"target": item["target"], "status": item.get("status"), "feasible": item["feasible"],
                     "pool_predicted": (item.get("predicted") or {}).get("pool_tokens"),
                     "binding_predicted": (item.get("predicted") or {}).get("binding_rank"),
                     "pool_measured": measured.get("pool_tokens"), "binding_measured": measured.get("binding_rank"),
                     "probe_headroom_gib": [p and round(p["headroom_bytes"] / 2**30, 2) for p in probes],
                     "reasons": item.get("reasons")})
    ladder = result.get("ladder") or {}
    return {"cuts": rows, "load": result["rig"]["load"], "shape": result["rig"].get("shape", {}).get("status"),
            "ladder": {key: ladder.get(key) for key in ("status", "seconds", "predicted_switch_cost_s")}
            | {"measured_switch": (ladder.get("measured") or {}).get("switch_s")}}


if __name__ == "__main__":
    main()
