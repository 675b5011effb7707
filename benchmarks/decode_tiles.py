"""Tile choices of the small-batch decode kernels, measured on one GPU: which tile to ship, and whether it beats
cuBLAS at all.

- the projections' GEMV (engine/ops/triton_gemv.py) against F.linear (cuBLAS) at one row (batch 1), for the bench
  model's decode projections: GDN's out_proj and attention's o_proj [2048, 4096], GDN's merged in_proj
  [12352, 2048], attention's merged qkv [9216, 2048], the router-sized lm_head slice is left out (cuBLAS reads the
  full lm_head at ~4.2 TB/s already);
- the MoE's two grouped kernels (engine/ops/triton_moe.py) at batch 1 and 8 (9 and 72 pairs over 33 experts, the
  shared expert included) with their tile variants, each kernel timed alone.
Each figure is a CUDA graph's replay (benchmarks/kernel_speed.py's device_time), as bytes per second and as a ratio to
the peer in the same run (cuBLAS; the shipped tile for the MoE). Every launch reads the next of enough weight copies
that none is still in L2 when it comes round (kernel_speed's cold_copies): a decode step reads each layer's weights
once, from HBM. Timed L2-hot (one weight, every launch) the same tiles ranked differently and ran up to 1.6x faster
than they do in the step (cuBLAS's L2-hot time is kept beside, as cublas_hot_s).

    python benchmarks/decode_tiles.py --out $OUT    # writes decode_tiles.json and prints the best tiles
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.kernel_speed import EXPERTS, HIDDEN, MOE_INTER, TOP_K, cold_copies, cycling, device_time  # noqa: E402

PROJECTIONS = {"out_proj": (2048, 4096), "gdn_in_proj": (12352, 2048), "attn_qkv": (9216, 2048)}


def gemv_rows() -> list[dict]:
    from engine.ops.triton_gemv import GemvTile, tile_for, triton_gemv

    tiles = [GemvTile(n, k, 4, stages) for n, k, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024),
                                                                               (1, 2, 3, 4))]
    tiles += [GemvTile(n, k, 8) for n, k in itertools.product((4, 8, 16, 32), (256, 512, 1024))]
    rows = []
    for name, (n_features, k_features) in PROJECTIONS.items():
        weight = torch.randn(n_features, k_features, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, k_features, device="cuda", dtype=torch.bfloat16)  # the GEMV takes one row (batch 1)
        reference = F.linear(x.float(), weight.float())
        cold = cycling(cold_copies(weight))
        cublas = device_time(lambda x=x, cold=cold: F.linear(x, cold()))
        cublas_hot = device_time(lambda x=x, weight=weight: F.linear(x, weight))
        timed = []
        for tile in tiles:
            seconds = device_time(lambda x=x, cold=cold, tile=tile: triton_gemv(x, cold(), tile))
            error = float((triton_gemv(x, weight, tile).float() - reference).abs().max())
            timed.append({"tile": [tile.block_n, tile.block_k, tile.num_warps, tile.num_stages], "s": seconds,
                          "max_error": error})
        timed.sort(key=lambda row: row["s"])
        moved = weight.numel() * weight.element_size()
        chosen = tile_for(k_features)
        shipped = next(row for row in timed if row["tile"] == [chosen.block_n, chosen.block_k, chosen.num_warps,
                                                               chosen.num_stages])
        rows.append({"projection": name, "shape": [n_features, k_features], "cublas_s": cublas,
                     "cublas_bytes_per_s": moved / cublas, "cublas_hot_s": cublas_hot, "shipped_s": shipped["s"],
                     "shipped_over_cublas": shipped["s"] / cublas, "best": timed[:4],
                     "best_bytes_per_s": moved / timed[0]["s"], "cublas_error": float(
                         (F.linear(x, weight).float() - reference).abs().max())})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def moe_tile_rows() -> list[dict]:
    from engine.ops.triton_moe import CONFIGS, TileConfig, align, down_weighted, gate_up_silu, num_blocks_for

    experts = EXPERTS + 1  # the shared expert stacked as expert E
    gate_up = torch.randn(experts, 2 * MOE_INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(experts, HIDDEN, MOE_INTER, device="cuda", dtype=torch.bfloat16) * 0.02
    rows, slots = [], TOP_K + 1
    for batch in (1, 8):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        routed = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOP_K] for _ in range(batch)])
        expert_ids = torch.cat([routed, torch.full((batch, 1), EXPERTS, device="cuda")], 1)
        weights = torch.rand(batch * slots, device="cuda", dtype=torch.bfloat16)
        shipped = CONFIGS[16]
        pairs, blocks = align(expert_ids, experts, 16, num_blocks_for(batch * slots, experts, 16))[:2]
        hit = len(torch.unique(expert_ids))
        h = gate_up_silu(x, gate_up, pairs, blocks, slots, shipped)
        for kernel in ("gate_up", "down"):
            moved = hit * (2 if kernel == "gate_up" else 1) * HIDDEN * MOE_INTER * 2
            cold = cycling(cold_copies(gate_up if kernel == "gate_up" else down, moved))
            timed = []
            for n, k, warps, stages in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (3, 4)):
                if kernel == "gate_up":
                    config = TileConfig(16, n, k, shipped.down_n, shipped.down_k, warps, stages, shipped.down_stages)
                    seconds = device_time(lambda c=config, x=x, p=pairs, b=blocks, cold=cold: gate_up_silu(
                        x, cold(), p, b, slots, c))
                else:
                    config = TileConfig(16, shipped.gate_n, shipped.gate_k, n * 2, k, warps, shipped.gate_stages,
                                        stages)
                    seconds = device_time(lambda c=config, h=h, p=pairs, b=blocks, w=weights, cold=cold: down_weighted(
                        h, cold(), p, b, w, c))
                timed.append({"n": n if kernel == "gate_up" else n * 2, "k": k, "warps": warps, "stages": stages,
                              "s": seconds})
            timed.sort(key=lambda row: row["s"])
            same = ((shipped.gate_n, shipped.gate_k, shipped.gate_stages) if kernel == "gate_up"
                    else (shipped.down_n, shipped.down_k, shipped.down_stages))
            shipped_s = next(row["s"] for row in timed if (row["n"], row["k"], row["stages"]) == same
                             and row["warps"] == shipped.num_warps)
            rows.append({"kernel": kernel, "batch": batch, "experts_hit": hit, "bytes": moved, "shipped_s": shipped_s,
                         "shipped_bytes_per_s": moved / shipped_s, "best": timed[:4],
                         "best_bytes_per_s": moved / timed[0]["s"], "best_over_shipped": timed[0]["s"] / shipped_s})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def norm_rows() -> list[dict]:
    """The layer's input norm at batch 1 (engine/ops/triton_norm.py) by warps: plain (the first layer's) and with the
    MoE's nine weighted parts summed into the residual (every later layer's), from L2 as in the step (the parts were
    just written)."""
    from engine.ops.triton_norm import _launch_shape, triton_rms_norm

    weight = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    rows = []
    for case, parts in (("plain", None), ("moe_parts", TOP_K + 1)):
        x = torch.randn(1, *(() if parts is None else (parts,)), HIDDEN, device="cuda", dtype=torch.bfloat16)
        residual = None if parts is None else torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
        summed = None if residual is None else torch.empty_like(residual)  # out of place: every launch the same

        def normed(warps: int, x: torch.Tensor = x, residual: torch.Tensor | None = residual,
                   summed: torch.Tensor | None = summed) -> torch.Tensor:
            return triton_rms_norm(x, weight, 1e-6, True, residual, summed, num_warps=warps)

        timed = sorted(({"warps": warps, "s": device_time(lambda w=warps: normed(w))} for warps in (1, 2, 4, 8, 16)),
                       key=lambda row: row["s"])
        shipped = _launch_shape(HIDDEN, parts or 1)[1]
        shipped_s = next(row["s"] for row in timed if row["warps"] == shipped)
        rows.append({"case": case, "shipped_warps": shipped, "shipped_s": shipped_s, "best": timed,
                     "best_over_shipped": timed[0]["s"] / shipped_s})
        print(json.dumps(rows[-1]), flush=True)
    return rows


SWEEPS = {"gemv": gemv_rows, "moe_tiles": moe_tile_rows, "norm": norm_rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sweeps", default=",".join(SWEEPS), help=f"comma-separated, of {', '.join(SWEEPS)}")
    args = parser.parse_args()
    unknown = set(args.sweeps.split(",")) - set(SWEEPS)
    if unknown:
        parser.error(f"--sweeps: no sweep named {', '.join(sorted(unknown))} (choose from {', '.join(SWEEPS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "card": torch.cuda.get_device_name(),
                    "torch": torch.__version__}
    for name in args.sweeps.split(","):
        measure = SWEEPS[name]
        try:
            result[name] = measure()
        except Exception as error:  # one sweep's failure must not hide the other's figures
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        (args.out / "decode_tiles.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
