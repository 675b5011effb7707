"""Our Triton kernels against their peers, in one process on one GPU: each timed with CUDA events over many launches,
as bytes moved per second and as a ratio to the peer measured in the same run.

- the conv prefill (engine/ops/triton_conv_prefill.py) at 64 x 512 tokens vs a device-to-device copy of the same
  bytes (its floor: it reads every input and writes every output once);
- the GDN decode kernel's tile choices at batch 1 and 64 vs a copy of the state bytes it reads and writes;
- one MoE layer's routed + shared experts at batch 1, 8 and 64 (engine/layers/moe.py, as the engine runs it) vs the
  copy time of the expert bytes a step must read;
- the MoE routing launches alone (engine/ops/triton_route.py) at batch 1 to 512: from x and the merged router
  [33, 2048] (its GEMV split over `router_chunks` hidden chunks, as the engine runs it), and from the logits, beside
  the router GEMV they replace.
Every time is a CUDA graph's replay (device time, not Python's launches).

    python benchmarks/kernel_speed.py --out $OUT    # writes kernel_speed.json and prints a table
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

# The bench model's widths (benchmarks/gpu.py: reference-hybrid-64 at 48 layers, 32 experts top-8).
HIDDEN, EXPERTS, TOP_K, MOE_INTER = 2048, 32, 8, 512
GROUPS, SEGMENTS, GROUP_WIDTH = 16, (128, 128, 256), 768  # GDN's grouped projection: q, k, v, z per key-head group


def device_time(run, launches: int = 50) -> float:
    """Median seconds per launch of `run`, captured `launches` times in one CUDA graph and replayed: device time
    only (timed launch by launch from Python, a small kernel measures Triton's launcher, not itself)."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            run()
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / launches)
    return sorted(times)[2]


COLD_BYTES = 256 << 20  # a rotation this large leaves nothing of a copy in the H200's 50 MB L2 when it comes round


def cold_copies(tensor: torch.Tensor, read_bytes: int | None = None) -> list[torch.Tensor]:
    """Copies of `tensor` enough that cycling through them reads HBM, not L2, as a decode step reads each layer's
    weights once: `read_bytes` (a launch's reads, the whole tensor by default) times the copies passes COLD_BYTES."""
    read_bytes = read_bytes or tensor.numel() * tensor.element_size()
    return [tensor.clone() for _ in range(max(2, -(-COLD_BYTES // read_bytes)))]


def cycling(tensors: list[torch.Tensor]):
    """A function returning the next of `tensors` each call, round and round (a captured graph's launches each take
    the next copy)."""
    turn = itertools.count()
    return lambda: tensors[next(turn) % len(tensors)]


def copy_time(num_bytes: int) -> float:
    """A device-to-device copy that reads and writes num_bytes / 2 each: the floor for moving num_bytes."""
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return device_time(lambda: dst.copy_(src), launches=10)


def conv_row(prompts: int = 64, prompt_len: int = 512) -> dict:
    from engine.ops.conv import conv_prefill, ungroup
    from engine.ops.triton_conv_prefill import triton_conv_prefill

    tokens, channels = prompts * prompt_len, GROUPS * sum(SEGMENTS)
    x = torch.randn(tokens, GROUPS, GROUP_WIDTH, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(channels, 4, device="cuda", dtype=torch.bfloat16)
    state = torch.zeros(prompts, channels, 3, device="cuda", dtype=torch.bfloat16)
    spans = [(i * prompt_len, (i + 1) * prompt_len, i, False) for i in range(prompts)]
    out = torch.empty(tokens, channels, device="cuda", dtype=torch.bfloat16)
    ours = device_time(lambda: triton_conv_prefill(x, weight, state, spans, SEGMENTS, out=out), launches=10)
    # Correctness beside the timing: the first span against the PyTorch reference.
    reference, _ = conv_prefill(ungroup(x[:prompt_len], SEGMENTS).float(), weight.float(), None)
    moved = 2 * tokens * channels * x.element_size()
    floor = copy_time(moved)
    return {"tokens": tokens, "channels": channels, "kernel_s": ours, "bytes": moved, "bytes_per_s": moved / ours,
            "copy_floor_s": floor, "times_floor": ours / floor,
            "first_span_max_error": float((out[:prompt_len].float() - reference).abs().max())}


def gdn_decode_rows(key_heads: int = 16, heads: int = 32, dim: int = 128) -> list[dict]:
    """The GDN decode kernel's tile choices (value columns per program, warps) at batch 1 and 64: state bytes read
    and written per second, and the ratio to a copy of the same bytes."""
    from engine.ops.triton_gdn import triton_gdn_decode

    rows = []
    for seqs in (1, 64):
        state = torch.randn(seqs, heads, dim, dim, device="cuda", dtype=torch.bfloat16) * 0.01
        q, k = (torch.randn(seqs, key_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(seqs, heads, dim, device="cuda", dtype=torch.bfloat16)
        b, a = (torch.randn(seqs, heads, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        a_log, dt_bias = torch.zeros(heads, device="cuda"), torch.zeros(heads, device="cuda")
        slots = torch.arange(seqs, device="cuda")
        moved = 2 * state.numel() * state.element_size()
        floor = copy_time(moved)
        args = (q, k, v, b, a, a_log, dt_bias, state, slots)
        for tile in ((32, 4), (64, 4), (64, 8), (128, 8), (16, 2)):
            seconds = device_time(lambda args=args, tile=tile: triton_gdn_decode(*args, tile=tile))
            rows.append({"seqs": seqs, "tile": tile, "kernel_s": seconds, "bytes_per_s": moved / seconds,
                         "times_floor": seconds / floor})
    return rows


def moe_rows() -> list[dict]:
    from engine.layers.merge import merge_projections
    from engine.layers.moe import SparseMoE

    layer = SparseMoE(HIDDEN, EXPERTS, TOP_K, MOE_INTER, True, MOE_INTER).to("cuda", torch.bfloat16)
    for param in layer.parameters():
        torch.nn.init.normal_(param, std=0.02)
    merge_projections(layer)
    expert_bytes = 3 * HIDDEN * MOE_INTER * 2
    rows = []
    for batch in (1, 8, 64):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            seconds = device_time(lambda x=x: layer(x))
        hit = len(torch.unique(torch.topk(F.linear(x, layer.gate.weight).float(), TOP_K).indices))
        read = (hit + 1) * expert_bytes  # the experts hit and the shared expert
        rows.append({"batch": batch, "layer_s": seconds, "experts_hit": hit, "bytes": read,
                     "bytes_per_s": read / seconds, "copy_floor_s": copy_time(read)})
    return rows


def routing_rows() -> list[dict]:
    from engine.ops.triton_moe import num_blocks_for, pick_block_m
    from engine.ops.triton_route import route_and_align
    from engine.ops.triton_router import router_chunks

    weight = torch.randn(EXPERTS + 1, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02  # the shared gate's row last
    rows = []
    for batch in (1, 8, 64, 256, 512):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        logits = F.linear(x, weight)
        pairs = batch * (TOP_K + 1)
        block_m = pick_block_m(pairs, EXPERTS + 1)  # as routed_experts picks it
        args = (TOP_K, True, block_m, num_blocks_for(pairs, EXPERTS + 1, block_m), True)
        inside = device_time(lambda x=x, args=args: route_and_align(x, *args, router_weight=weight))
        from_logits = device_time(lambda logits=logits, args=args: route_and_align(logits, *args))
        rows.append({"batch": batch, "routing_with_gemv_s": inside, "router_chunks": router_chunks(EXPERTS, HIDDEN),
                     "routing_from_logits_s": from_logits,
                     "router_gemv_s": device_time(lambda x=x: F.linear(x, weight))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "card": torch.cuda.get_device_name(),
                    "torch": torch.__version__}
    for name, measure in (("conv_prefill", conv_row), ("gdn_decode", gdn_decode_rows), ("moe_layer", moe_rows),
                          ("routing", routing_rows)):
        try:
            result[name] = measure()
        except Exception as error:  # one kernel's failure must not hide the others' figures
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        print(name, json.dumps(result[name], indent=1), flush=True)
        (args.out / "kernel_speed.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
