"""Frontier benchmark: exact Pareto search time and result size at 3x64, 4x80 and 8x128.

3x64 is the reference rig with reference-hybrid-64, also timed against brute-force enumeration of
all 1,953 cuts (the peer). 4x80 and 8x128 are synthetic uneven rigs with Qwen3-Next-style censuses
(reference-hybrid-64's config with num_hidden_layers changed); 8x128 has ~1.1e11 cuts, so it has no
brute-force peer. Run: `.venv/bin/python benchmarks/frontier.py [--json] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solvers.capacity import CutPricer  # noqa: E402
from solvers.census import CONFIG_DIR, census_from_config, load_census  # noqa: E402
from solvers.frontier import compute_frontier  # noqa: E402
from solvers.frontier_search import CutSearch, time_key  # noqa: E402
from solvers.rig import load_rig, proportional_split, rig_from_dict  # noqa: E402
from solvers.timing import calibrate  # noqa: E402

# Uneven cards (GiB) and measured-looking ms per layer: big-and-fast next to small-and-slow.
SYNTHETIC = {
    4: {"memory": [32, 20, 24, 20], "ms_per_layer": [1.8, 7.7, 3.1, 7.3]},
    8: {"memory": [32, 20, 20, 24, 16, 24, 20, 20], "ms_per_layer": [1.8, 7.7, 7.3, 3.1, 5.0, 2.4, 6.2, 4.4]},
}


def synthetic_census(num_layers: int):
    config = json.loads((CONFIG_DIR / "reference-hybrid-64.json").read_text())
    config["num_hidden_layers"] = num_layers
    return census_from_config(config, name=f"reference-hybrid-{num_layers}")


def synthetic_rig(ranks: int, num_layers: int):
    spec = SYNTHETIC[ranks]
    incumbent = proportional_split(num_layers, spec["memory"])
    rank_list = []
    for i, (memory, ms) in enumerate(zip(spec["memory"], spec["ms_per_layer"], strict=True)):
        rank_list.append({
            "name": f"gpu{i}-{memory}g", "memory": f"{memory}GiB", "overhead": "600MiB", "h2d_bandwidth": "13GB/s",
            "corridor": {"band": "1024MiB", "tolerance": 0.2}, "stage_ms": round(ms * incumbent[i], 3),
            "seam_reserve": {"estimate": {"staging": "512MiB", "graphs": "256MiB", "allocator": "256MiB"},
                             "uncertainty": "500MiB"},
        })
    return rig_from_dict({
        "name": f"synthetic-{ranks}x{num_layers}", "incumbent_cut": list(incumbent), "ranks": rank_list,
        "shape": {"max_model_len": 32768, "max_num_seqs": 8, "max_num_batched_tokens": 4096, "kv_dtype": "bf16"},
    })


def brute_force(model, rig) -> tuple[int, int]:
    """The peer: price every cut, keep the non-dominated (pipelined, pool) pairs. Returns (pairs, refused)."""
    pricer = CutPricer(model, rig)
    incumbent, _ = rig.incumbent_for(model.num_layers)
    timing = calibrate(incumbent, rig.stage_ms, noise_floor=rig.noise_floor)
    layers, pairs, refused = model.num_layers, set(), 0
    for a in range(1, layers - 1):
        for b in range(1, layers - a):
            cut = (a, b, layers - a - b)
            priced = pricer.price(cut)
            if priced.reasons:
                refused += 1
            else:
                pairs.add((time_key(timing.pipelined_ms(cut)), priced.pool_tokens))
    best, front = -1, 0
    for _, pool in sorted(pairs, key=lambda pair: (pair[0], -pair[1])):
        if pool > best:
            best, front = pool, front + 1
    return front, refused


def timed(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def run(repeat: int) -> list[dict]:
    cases = [("3x64", load_census("reference-hybrid-64"), load_rig("reference"))]
    for n, layers in ((4, 80), (8, 128)):
        cases.append((f"{n}x{layers}", synthetic_census(layers), synthetic_rig(n, layers)))
    rows = []
    for label, model, rig in cases:
        seconds, frontier = timed(lambda model=model, rig=rig: compute_frontier(model, rig), repeat)
        # The share spent building the per-rank allowed-token matrices through CutPricer.allowed_tokens.
        timing = calibrate(frontier.incumbent.cut, rig.stage_ms, noise_floor=rig.noise_floor)
        pricing_s, _ = timed(lambda model=model, rig=rig, timing=timing: CutSearch(
            CutPricer(model, rig), timing.ms_per_layer, timing.fixed_ms), repeat)
        row = {"case": label, "rig": rig.name, "model": model.name, "cuts": frontier.total_cuts,
               "refused_total": frontier.refused_total, "points": len(frontier.points), "frontier_s": round(seconds, 4),
               "pricing_s": round(pricing_s, 4), "peer_s": None, "peer_points": None, "ratio": None}
        if rig.size == 3:
            peer_s, (peer_points, peer_refused) = timed(lambda model=model, rig=rig: brute_force(model, rig), repeat)
            assert (peer_points, peer_refused) == (len(frontier.points), frontier.refused_total), "peer disagrees"
            row.update(peer_s=round(peer_s, 4), peer_points=peer_points, ratio=round(peer_s / seconds, 2))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best time is reported")
    args = parser.parse_args()
    rows = run(args.repeat)
    if args.json:
        machine = f"{os.cpu_count()}-core {platform.machine()} CPU, Python {platform.python_version()}"
        print(json.dumps({"machine": machine, "rows": rows}, indent=2))
        return
    header = (f"{'case':<7}{'cuts':>16}{'refused':>16}{'points':>8}{'frontier s':>12}{'pricing s':>11}"
              f"{'brute s':>10}{'ratio':>8}")
    print(header)
    for row in rows:
        peer = "-" if row["peer_s"] is None else f"{row['peer_s']:.4f}"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{row['case']:<7}{row['cuts']:>16,}{row['refused_total']:>16,}{row['points']:>8}"
              f"{row['frontier_s']:>12.4f}{row['pricing_s']:>11.4f}{peer:>10}{ratio:>8}")


if __name__ == "__main__":
    main()
