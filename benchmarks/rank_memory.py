"""One rank of the reference rig built at a series of cuts, and what holds the allocator's slack after each build.

    python3 benchmarks/rank_memory.py --out $OUT                  # rank 1 of reference-h200, 4 builds (~100 s)

The slack of a rank (memory it maps that no tensor uses) is what the planner does not price. Weights and pools live
in the rank's slab (engine/memory/slab.py), packed to the granule; what torch's allocator holds beside them
(activations,
graphs, cuBLAS's workspaces) it maps in 20 MiB chunks (expandable segments) and gives back only whole, so a small
tensor that stays can pin part of a chunk. This records, after each build, what the slab maps beyond its packing,
the allocator's pools (engine/memory/device.py) and every free block beside a live one, with the Python frames that
allocated the live one (torch's memory history). Everything goes to <out>/rank_memory.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.rig_h200 import write_config  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.memory.device import cap_cuda_memory, prefer_expandable_segments, reserve_blas_workspaces  # noqa: E402
from engine.memory.host_image import HostImage  # noqa: E402
from engine.ranks.rank import RankLayout, RankWorker  # noqa: E402
from solvers.capacity import CutPricer  # noqa: E402
from solvers.rig import load_rig  # noqa: E402

CUTS = [[28, 20, 16], [30, 17, 17], [31, 16, 17], [28, 20, 16]]
OWN_CODE = ("/engine/", "/benchmarks/", "/fla/")  # the frames worth naming


def layout(config: ModelConfig, rig, cut: tuple[int, ...], rank: int) -> RankLayout:
    """The rank's layout as the driver would make it (engine/control/driver.py, layouts)."""
    prediction = CutPricer(config.census, rig, rig.shape).price(cut)
    row, shape = prediction.ranks[rank], rig.shape
    return RankLayout(cut, prediction.pool_tokens, shape.block_size, shape.max_num_seqs,
                      shape.kv_dtype or config.census.dtype, shape.state_dtype or config.census.dtype,
                      row.budget_bytes, row.overhead_bytes, row.workspace_bytes, row.floor.bytes, row.margin_bytes,
                      max_model_len=shape.max_model_len)


def pins(snapshot: dict) -> list[dict]:
    """Each free block of the default pool beside a live block, with where the live one was allocated."""
    found = []
    for segment in snapshot["segments"]:
        if tuple(segment["segment_pool_id"]) != (0, 0):
            continue
        blocks = segment["blocks"]
        for i, block in enumerate(blocks):
            if block["state"] != "inactive":
                continue
            for j in (i - 1, i + 1):
                if 0 <= j < len(blocks) and blocks[j]["state"] != "inactive":
                    frames = [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in blocks[j].get("frames", [])
                              if any(part in f["filename"] for part in OWN_CODE)]
                    found.append({"free_bytes": block["size"], "live_bytes": blocks[j]["size"],
                                  "live_is": "before" if j < i else "after", "allocated_at": frames[:6]})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--cuts", type=json.loads, default=CUTS, help="JSON list of cuts, built in order")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rig = load_rig("reference-h200")
    device = torch.device("cuda", 0)
    torch.cuda.memory._set_allocator_settings(prefer_expandable_segments())  # as a rank process starts
    torch.cuda.set_device(device)
    cap_cuda_memory(device, rig.ranks[args.rank].memory_bytes)
    reserve_blas_workspaces(device)
    config = ModelConfig.from_pretrained(write_config("reference-hybrid-64", {}, Path("/tmp/seam-rank-memory")))
    started = time.perf_counter()
    image = HostImage.random(config)
    print(f"host image {image.bytes / 1e9:.1f} GB in {time.perf_counter() - started:.1f} s", flush=True)
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    worker = RankWorker(args.rank, rig.size, config, image, device)
    builds = []
    for cut in map(tuple, args.cuts):
        started = time.perf_counter()
        measured = worker.build(layout(config, rig, cut, args.rank))
        seconds = time.perf_counter() - started
        cap_cuda_memory(device, rig.ranks[args.rank].memory_bytes - worker.slab.mapped_bytes)  # as rank_main does
        resident = measured["weights_bytes"] + measured["kv_pool_bytes"] + measured["state_pool_bytes"]
        found = pins(torch.cuda.memory._snapshot())
        builds.append({"cut": cut, "seconds": seconds, "pools": measured["allocator_pools"], "pins": found,
                       "slab_mapped_minus_resident": measured["slab_mapped_bytes"] - resident,
                       "allocated_minus_resident": measured["device_allocated_bytes"] - resident,
                       "reserved_minus_allocated": measured["device_reserved_bytes"]
                       - measured["device_allocated_bytes"],
                       "process_minus_resident": (measured.get("process_used_bytes") or 0) - resident})
        default = measured["allocator_pools"]["default"]
        print(f"{list(cut)} built in {seconds:.1f} s: process - resident "
              f"{(builds[-1]['process_minus_resident']) / 2**20:.1f} MiB, slab - resident "
              f"{builds[-1]['slab_mapped_minus_resident'] / 2**20:.2f} MiB, torch's default pool slack "
              f"{(default['reserved'] - default['allocated']) / 2**20:.1f} MiB in {default['free_count']} free blocks",
              flush=True)
        for frames, count in Counter(tuple(pin["allocated_at"][:2]) for pin in found).most_common(8):
            print(f"    {count} beside {' <- '.join(frames) or '(no frames of ours)'}", flush=True)
    (args.out / "rank_memory.json").write_text(json.dumps({"rank": args.rank, "builds": builds}, default=str))


if __name__ == "__main__":
    main()
