"""What the multi-GPU run runs: the model, the rigs, the cuts and the sizes, full size (one rank per GPU) or toy (the
CPU demo rig, gloo); the checkpoint it serves, the planner's view of its cuts, and the facts of the machine.

The full-size rig is derived from the machine's GPU count rather than read from a rig file per count: one rank per
visible GPU in h200x8.json's rank spec (overhead, corridor, seam reserve, shape), with a budget of at most
BUDGET_MIB a rank. The same script then serves x2, x4 and x8 alike, and the single-GPU reference gets the same
per-rank spec and budget on cuda:0. The budget is capped because the engine sizes its KV pool to fill it: a
smaller pool keeps the start and every rebuild quick and leaves the card room for the single-GPU reference's
context beside a rank that is still shutting down.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist

from engine.config import ModelConfig
from solvers.capacity import CutPricer
from solvers.rig import RIG_DIR, load_rig

# reference-hybrid-64's architecture at 16 layers (4 gated attention + 12 Gated DeltaNet) and 32 experts: ~5.6 GB of
# bf16 weights, a few GB on each GPU, written by transformers itself (benchmarks/gpu.py's make_checkpoint).
FULL_MODEL = {"num_hidden_layers": 16, "num_experts": 32}
BUDGET_MIB = 48 * 1024
TEMPLATE_RIG = "h200x8"
# Step budgets (s) and what each step usually needs; the single-GPU reference keeps `single` for itself.
FULL_BUDGETS = {"checkpoint": 150, "start": 240, "tokens": 90, "warmup": 120, "cut": 90, "live_change": 150}
FULL_NEEDS = {"checkpoint": 60, "start": 90, "tokens": 20, "warmup": 30, "cut": 30, "live_change": 60, "single": 150}
TOY_BUDGETS = {"checkpoint": 60, "start": 90, "tokens": 60, "warmup": 60, "cut": 60, "live_change": 90}
TOY_NEEDS = {"checkpoint": 5, "start": 10, "tokens": 5, "warmup": 5, "cut": 5, "live_change": 10, "single": 20}
MULTICAST_NAMES = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def toy_case() -> dict:
    """The CPU demo rig (three gloo ranks) on the demo checkpoint, against the one-rank CPU rig."""
    return {"model": "demo", "rig": "cpu-demo", "single_rig": "cpu-single", "incumbent": [7, 5, 4],
            "cuts": [[8, 4, 4], [9, 3, 4]], "single_cut": [16], "batch": 2, "prompt": 16, "gen": 6, "repeats": 2,
            "check": {"prompts": 2, "prompt": 12, "tokens": 8},
            "load": {"prompt": 16, "tokens": 6, "width": 4}, "budgets": TOY_BUDGETS, "needs": TOY_NEEDS}


def full_case(gpus: int, work: Path) -> dict:
    """One rank per GPU, the incumbent an even split, the other cuts k layers moved between the end ranks."""
    layers = FULL_MODEL["num_hidden_layers"]
    incumbent = [layers // gpus + (1 if rank < layers % gpus else 0) for rank in range(gpus)]
    k = max(1, min(incumbent) // 4)
    first_heavy, last_heavy = list(incumbent), list(incumbent)
    first_heavy[0], first_heavy[-1] = first_heavy[0] + k, first_heavy[-1] - k
    last_heavy[0], last_heavy[-1] = last_heavy[0] - k, last_heavy[-1] + k
    work.mkdir(parents=True, exist_ok=True)
    multi, single = work / f"rig-{gpus}gpu.json", work / "rig-1gpu.json"
    multi.write_text(json.dumps(derived_rig(gpus, incumbent), indent=1))
    single.write_text(json.dumps(derived_rig(1, [layers]), indent=1))
    return {"model": FULL_MODEL, "rig": str(multi), "single_rig": str(single), "incumbent": incumbent,
            "cuts": [first_heavy, last_heavy], "single_cut": [layers], "batch": 8, "prompt": 512, "gen": 32,
            "repeats": 3, "check": {"prompts": 4, "prompt": 64, "tokens": 16},
            "load": {"prompt": 512, "tokens": 24, "width": 4}, "budgets": FULL_BUDGETS, "needs": FULL_NEEDS}


def derived_rig(gpus: int, incumbent: list[int]) -> dict:
    template = json.loads((RIG_DIR / f"{TEMPLATE_RIG}.json").read_text())
    ranks = []
    for index in range(gpus):
        card_mib = torch.cuda.get_device_properties(index).total_memory // 2**20
        ranks.append({**template["ranks"][0], "name": f"h200-{index}", "device": f"cuda:{index}",
                      "memory": f"{min(BUDGET_MIB, card_mib)}MiB"})
    return {"name": f"h200x{gpus}-issue8", "description": f"{gpus} of this machine's GPUs, one rank each, in "
            f"{TEMPLATE_RIG}'s rank spec with a budget of at most {BUDGET_MIB} MiB a rank (benchmarks/multi_gpu.py)",
            "incumbent_cut": incumbent, "noise_floor": template["noise_floor"], "shape": template["shape"],
            "ranks": ranks}


def write_checkpoint(case: dict, folder: Path) -> dict:
    """The demo checkpoint (toy), or a random Qwen3-Next checkpoint written by transformers on cuda:0 in a process of
    its own (its allocator's cache would otherwise hold the card); an existing one is reused."""
    if (folder / "config.json").is_file():
        return {"folder": str(folder), "reused": True}
    if case["model"] == "demo":
        from engine.demo import make_demo_checkpoint

        return make_demo_checkpoint(folder, force=True)
    from benchmarks import gpu

    return {"folder": str(folder), "overrides": case["model"],
            **gpu.in_fresh_process(gpu.make_checkpoint, folder, case["model"], "cuda")}


def planner_view(folder: Path, rig: str, cuts: list[list[int]]) -> list[dict]:
    """The planner's verdict on each cut the run serves: pool, binding rank, or why it is refused."""
    census, loaded = ModelConfig.from_pretrained(folder).census, load_rig(rig)
    rows = []
    for cut in cuts:
        priced = CutPricer(census, loaded, loaded.shape).price(cut)
        rows.append({"cut": cut, "feasible": priced.feasible, "pool_tokens": priced.pool_tokens,
                     "binding_rank": priced.binding_rank, "attention_split": list(priced.attention_split),
                     "reasons": list(priced.reasons)})
    return rows


def environment(device: str) -> dict:
    facts: dict = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
                   "multicast_env": {name: os.environ.get(name) for name in MULTICAST_NAMES}}
    if device == "cuda" and torch.cuda.is_available():
        facts["cards"] = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else None
        facts["nvidia_smi"] = _output(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                                       "--format=csv"])
        facts["topology"] = _output(["nvidia-smi", "topo", "-m"])  # how the GPUs are linked: not yet recorded here
    try:
        import fla

        facts["fla"] = fla.__version__
    except ImportError:
        facts["fla"] = None
    return facts


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{command[0]}: {error}"
