"""The quantized linears' kernels (engine/ops/triton_fp8.py, engine/ops/triton_w4a16.py) against bf16, on one GPU.

For the bench model's dense projections (benchmarks/decode_tiles.py's: GDN's out_proj and attention's o_proj
[2048, 4096], GDN's merged in_proj [12352, 2048], attention's merged qkv [9216, 2048]) at M rows (1, 16, 64, 128, 512
by default: 1, 64 and 512 asked for, 16 and 128 to place the W8A8 crossover), each of:
  bf16_linear  engine.ops.linear.linear (the Triton GEMV at one row, cuBLAS otherwise), bf16 weight
  bf16_cublas  F.linear
  fp8_w8a16    block-scaled fp8 (128 x 128), dequantized in the kernel
  fp8_w8a8     the same weight, x quantized per token and 128 columns, fp8 tensor cores (Hopper only)
  w4a16        4-bit, groups of 128 along K, asymmetric (zeros packed along N)
Each time is the median of CUDA-event timings of a captured CUDA graph's replay (benchmarks/kernel_speed.py's
device_time, 50 launches a graph), every launch reading the next of enough weight copies that none is still in L2
(kernel_speed's cold_copies: a step reads each layer's weights once, from HBM). Bytes are those really moved: x,
the weight, its scales and zeros read, y written (W8A8 adds its quantized x written and read back); `copy_fraction` is
those bytes per second over a device-to-device copy's (read + written) on the same card. The quantized weights are
random bytes with random scales: the timing does not depend on their values. Then the bench model's experts through
the fused MoE (bf16, FP8, W4; one copy of the weights, not rotated: L2 may hold part of them). A sweep of the
decode tiles (M = 1 and 16) follows, to pick engine/ops/triton_fp8.py's dequant_tile. Results go to quant_kernels.json.

    python benchmarks/quant_kernels.py --out $OUT              # CUDA only; about three minutes on an H100
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.decode_tiles import PROJECTIONS  # noqa: E402
from benchmarks.kernel_speed import COLD_BYTES, copy_time, device_time  # noqa: E402
from engine.ops.linear import linear  # noqa: E402
from engine.ops.triton_fp8 import QuantTile, dequant_tile, fp8_path, triton_fp8_block_linear  # noqa: E402
from engine.ops.triton_w4a16 import triton_w4a16_linear  # noqa: E402

BLOCK = (128, 128)
GROUP = 128
ROWS = (1, 16, 64, 128, 512)
Weights = tuple[torch.Tensor, ...]


def bf16_weights(n_features: int, k_features: int) -> Weights:
    return (torch.randn(n_features, k_features, device="cuda", dtype=torch.bfloat16) * 0.02,)


def fp8_weights(n_features: int, k_features: int) -> Weights:
    weight = (torch.randn(n_features, k_features, device="cuda") * 64).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(-(-n_features // BLOCK[0]), -(-k_features // BLOCK[1]), device="cuda") * 1e-4
    return weight, scale_inv


def w4_weights(n_features: int, k_features: int) -> Weights:
    words = dict(dtype=torch.int32, device="cuda")
    groups = k_features // GROUP
    qweight = torch.randint(-2**31, 2**31 - 1, (n_features, k_features // 8), **words)
    scales = torch.rand(n_features, groups, device="cuda", dtype=torch.bfloat16) * 0.002
    zeros = torch.randint(-2**31, 2**31 - 1, (groups, -(-n_features // 8)), **words)
    return qweight, scales, zeros


def nbytes(tensors: Weights) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def cold(weights: Weights) -> Callable[[], Weights]:
    """A function returning the next of enough copies of `weights` that cycling through them reads HBM."""
    copies = [tuple(t.clone() for t in weights) for _ in range(max(2, -(-COLD_BYTES // nbytes(weights))))]
    turn = itertools.count()
    return lambda: copies[next(turn) % len(copies)]


VARIANTS: dict[str, tuple[Callable[[int, int], Weights], Callable]] = {
    "bf16_linear": (bf16_weights, lambda x, w: linear(x, *w)),
    "bf16_cublas": (bf16_weights, lambda x, w: F.linear(x, *w)),
    "fp8_w8a16": (fp8_weights, lambda x, w: triton_fp8_block_linear(x, *w, BLOCK, path="w8a16")),
    "fp8_w8a8": (fp8_weights, lambda x, w: triton_fp8_block_linear(x, *w, BLOCK, path="w8a8")),
    "w4a16": (w4_weights, lambda x, w: triton_w4a16_linear(x, *w, GROUP)),
}


def is_hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def speed_rows(copy_bytes_per_s: float, rows_list: tuple[int, ...]) -> list[dict]:
    results = []
    for name, (n_features, k_features) in PROJECTIONS.items():
        for variant, (make, run) in VARIANTS.items():
            if variant == "fp8_w8a8" and not is_hopper():
                continue
            weights = make(n_features, k_features)
            rotation = cold(weights)
            outputs = {}
            for rows in rows_list:
                x = torch.randn(rows, k_features, device="cuda", dtype=torch.bfloat16)
                moved = nbytes(weights) + x.numel() * 2 + rows * n_features * 2  # x read, y written
                if variant == "fp8_w8a8":
                    moved += 2 * rows * k_features  # the quantized x written and read back
                seconds = device_time(lambda x=x, rotation=rotation, run=run: run(x, rotation()))
                outputs[rows] = run(x, weights)
                row = {"projection": name, "shape": [n_features, k_features], "variant": variant, "rows": rows,
                       "s": seconds, "us": seconds * 1e6, "bytes": moved, "bytes_per_s": moved / seconds,
                       "copy_fraction": moved / seconds / copy_bytes_per_s,
                       "tflops": 2 * rows * n_features * k_features / seconds / 1e12}
                if variant == "fp8_w8a8":  # the same weight through W8A16: how far x's fp8 rounding moves y
                    exact = triton_fp8_block_linear(x, *weights, BLOCK, path="w8a16").float()
                    row["relative_to_w8a16"] = float((outputs[rows].float() - exact).norm() / exact.norm())
                if variant.startswith("fp8"):
                    row["fp8_path_serves"] = fp8_path(x, BLOCK)
                results.append(row)
                print(json.dumps(row), flush=True)
            del weights, rotation
    return results


SWEEP_TILES = {1: [QuantTile(1, n, k, w, 3) for n, k, w in itertools.product((4, 8, 16, 32), (128, 256, 512), (4, 8))],
               16: [QuantTile(16, n, k, 4, s) for n, k, s in itertools.product((16, 32, 64), (64, 128), (3, 4))]}


def tile_rows() -> list[dict]:
    """The decode tiles of both dequantizing kernels, fastest first per (format, projection, rows)."""
    results = []
    for fmt, make in (("fp8_w8a16", fp8_weights), ("w4a16", w4_weights)):
        for name, (n_features, k_features) in PROJECTIONS.items():
            weights = make(n_features, k_features)
            rotation = cold(weights)
            for rows, tiles in SWEEP_TILES.items():
                x = torch.randn(rows, k_features, device="cuda", dtype=torch.bfloat16)
                if fmt == "w4a16":
                    def run(tile, x=x, rotation=rotation):
                        return triton_w4a16_linear(x, *rotation(), GROUP, tile=tile)
                else:
                    def run(tile, x=x, rotation=rotation):
                        return triton_fp8_block_linear(x, *rotation(), BLOCK, path="w8a16", tile=tile)
                timed = sorted(({"tile": [t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages],
                                 "us": device_time(lambda t=t: run(t)) * 1e6} for t in tiles), key=lambda r: r["us"])
                shipped = dequant_tile(rows)
                shipped_us = next(r["us"] for r in timed if r["tile"] == [
                    shipped.block_m, shipped.block_n, shipped.block_k, shipped.num_warps, shipped.num_stages])
                row = {"format": fmt, "projection": name, "rows": rows, "shipped_us": shipped_us, "best": timed[:4],
                       "best_over_shipped": timed[0]["us"] / shipped_us, "weight_bytes": nbytes(weights)}
                results.append(row)
                print(json.dumps(row), flush=True)
            del weights, rotation
    return results


def expert_rows(copy_bytes_per_s: float) -> list[dict]:
    """The bench model's experts (32, hidden 2048, I 512, top-8) through the fused MoE, bf16 (triton_moe) against FP8
    and W4 (triton_moe_quant), at batch 1, 8 and 64 (align included); bytes: the hit experts' weights."""
    from benchmarks.kernel_speed import EXPERTS, HIDDEN, MOE_INTER, TOP_K
    from engine.ops.triton_moe import fused_experts
    from engine.ops.triton_moe_quant import Fp8Experts, W4Experts, quant_fused_experts

    def stacked(make: Callable[[int, int], Weights], n_features: int, k_features: int) -> Weights:
        parts = [make(n_features, k_features) for _ in range(EXPERTS)]
        return tuple(torch.stack(tensors) for tensors in zip(*parts, strict=True))

    # bf16 holds gate and up as one [E, 2I, hidden] tensor (triton_moe); the quantized formats apart, as loaded.
    formats = {
        "bf16": lambda g, u, d: (lambda gate_up: lambda x, i, w: fused_experts(x, i, w, gate_up, d[0]))(
            torch.cat([g[0], u[0]], 1)),
        "fp8_w8a16": lambda g, u, d: (lambda x, i, w: quant_fused_experts(
            x, i, w, Fp8Experts(*g, BLOCK), Fp8Experts(*u, BLOCK), Fp8Experts(*d, BLOCK))),
        "w4a16": lambda g, u, d: (lambda x, i, w: quant_fused_experts(
            x, i, w, W4Experts(*g, GROUP), W4Experts(*u, GROUP), W4Experts(*d, GROUP))),
    }
    makers = {"bf16": bf16_weights, "fp8_w8a16": fp8_weights, "w4a16": w4_weights}
    results = []
    for fmt, bind in formats.items():
        gate, up = (stacked(makers[fmt], MOE_INTER, HIDDEN) for _ in range(2))
        down = stacked(makers[fmt], HIDDEN, MOE_INTER)
        run = bind(gate, up, down)
        per_expert = (nbytes(gate) + nbytes(up) + nbytes(down)) / EXPERTS
        for batch in (1, 8, 64):
            x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOP_K] for _ in range(batch)])
            weights = torch.rand(batch, TOP_K, device="cuda", dtype=torch.bfloat16)
            moved = len(torch.unique(ids)) * per_expert
            seconds = device_time(lambda x=x, ids=ids, weights=weights, run=run: run(x, ids, weights))
            row = {"format": fmt, "batch": batch, "us": seconds * 1e6, "bytes": moved,
                   "copy_fraction": moved / seconds / copy_bytes_per_s}
            results.append(row)
            print(json.dumps(row), flush=True)
        del gate, up, down
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values")
    parser.add_argument("--sections", default="speed,experts,decode_tiles",
                        help="comma-separated, of speed, experts, decode_tiles")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the kernels are timed on the device)")
    args.out.mkdir(parents=True, exist_ok=True)
    copy_bytes = 1 << 30
    copy_bytes_per_s = copy_bytes / copy_time(copy_bytes)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "card": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
                    "torch": torch.__version__, "copy_bytes_per_s": copy_bytes_per_s, "block": list(BLOCK),
                    "group_size": GROUP}
    known = {"speed": lambda: speed_rows(copy_bytes_per_s, tuple(int(r) for r in args.rows.split(","))),
             "experts": lambda: expert_rows(copy_bytes_per_s), "decode_tiles": tile_rows}
    unknown = set(args.sections.split(",")) - set(known)
    if unknown:
        parser.error(f"--sections: no section named {', '.join(sorted(unknown))} (choose from {', '.join(known)})")
    sections = [(name, known[name]) for name in args.sections.split(",")]
    for name, measure in sections:
        try:
            result[name] = measure()
        except Exception as error:  # one section's failure must not hide the other's figures
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        (args.out / "quant_kernels.json").write_text(json.dumps(result, indent=1))
    speed = result.get("speed") if isinstance(result.get("speed"), list) else []
    print(f"{'projection':12} {'variant':12} {'M':>4} {'us':>8} {'copy%':>6}")
    for row in speed:
        print(f"{row['projection']:12} {row['variant']:12} {row['rows']:>4} {row['us']:8.1f} "
              f"{100 * row['copy_fraction']:6.1f}")


if __name__ == "__main__":
    main()
