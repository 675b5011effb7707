"""The bench checkpoint in the two quantized formats operators run, for benchmarks/gpu.py's quantized rows.

- `fp8`: block-scaled FP8 as Qwen publishes Qwen3-Next-80B-A3B-FP8 (`weight` in e4m3, one fp32 `weight_scale_inv`
  per 128 x 128 block; the router, the shared expert's gate and GDN's in_proj_ba stay bf16, listed per layer in
  `modules_to_not_convert`).
- `w4a16`: compressed-tensors pack-quantized, symmetric int4 in groups of 128 inputs (`weight_packed`,
  `weight_scale` at the model dtype, `weight_shape`), the router and the shared expert's gate ignored.

Every 2-D weight of a decoder layer converts but those kept; embeddings, norms and lm_head stay as they are. The
quantization runs on `device` one tensor at a time, shard by shard, so a 14 GB checkpoint converts in seconds on a
GPU and never needs more than one shard in host memory.

    python benchmarks/quantize_checkpoint.py /tmp/seam-bench-ckpt /tmp/seam-bench-ckpt-fp8 fp8
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMATS = ("fp8", "w4a16")
FP8_BLOCK = (128, 128)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
W4_GROUP = 128
W4_MAX = 7  # symmetric int4: -8..7, stored plus 8
_KEPT = ("mlp.gate", "mlp.shared_expert_gate")
_KEPT_FP8 = (*_KEPT, "linear_attn.in_proj_ba")


def quantization_config(fmt: str, num_layers: int, group: int) -> dict:
    if fmt == "fp8":
        kept = ["lm_head"] + [f"model.layers.{i}.{module}" for i in range(num_layers) for module in _KEPT_FP8]
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(FP8_BLOCK), "modules_to_not_convert": kept}
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": group, "symmetric": True,
               "dynamic": False, "actorder": None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized", "weights": weights,
                                          "input_activations": None, "output_activations": None}},
            "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]}


def fp8_block(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """weight [N, K] -> e4m3 weight and the fp32 inverse scale of each block (partial blocks at the edges)."""
    rows, cols = weight.shape
    br, bc = FP8_BLOCK
    grid = (-(-rows // br), -(-cols // bc))
    padded = weight.new_zeros(grid[0] * br, grid[1] * bc)
    padded[:rows, :cols] = weight
    blocks = padded.view(grid[0], br, grid[1], bc)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    stored = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view_as(padded)[:rows, :cols]
    return {"weight": stored.to(torch.float8_e4m3fn), "weight_scale_inv": scale}


def w4a16_packed(weight: torch.Tensor, group: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """weight [N, K] -> compressed-tensors' pack-quantized int4: eight values a word along K, nibble i of word j
    holding input 8 j + i, each value stored plus 8."""
    rows, cols = weight.shape
    grouped = weight.view(rows, cols // group, group)
    scale = (grouped.abs().amax(-1) / W4_MAX).clamp(min=1e-8).to(dtype)
    q = (grouped / scale.float()[..., None]).round().clamp(-8, W4_MAX).to(torch.int64) + 8
    shifts = torch.arange(0, 32, 4, device=weight.device)
    words = (q.view(rows, cols // 8, 8) << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same bits, as int32
    return {"weight_packed": words, "weight_scale": scale, "weight_shape": torch.tensor([rows, cols])}


def converts(name: str, tensor_rank: int, kept: tuple[str, ...]) -> bool:
    return name.startswith("model.layers.") and name.endswith(".weight") and tensor_rank == 2 \
        and not name.removesuffix(".weight").endswith(kept)


def group_for(config: dict) -> int:
    """128, or for a model too small for it (the bench's toy) the largest power of two dividing every input width."""
    widths = [config["hidden_size"], config.get("moe_intermediate_size") or config["hidden_size"],
              config.get("shared_expert_intermediate_size") or config["hidden_size"]]
    group = W4_GROUP
    while any(width % group for width in widths):
        group //= 2
    return group


def quantize(source: Path, dest: Path, fmt: str, device: str = "cuda") -> dict:
    """Write `source` (a bf16 checkpoint) to `dest` in `fmt`; returns what was written."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    started = time.perf_counter()
    config = json.loads((source / "config.json").read_text())
    group = group_for(config)
    kept = _KEPT_FP8 if fmt == "fp8" else _KEPT
    dest.mkdir(parents=True, exist_ok=True)
    index_path = source / "model.safetensors.index.json"
    shards = sorted({*json.loads(index_path.read_text())["weight_map"].values()}) if index_path.is_file() \
        else ["model.safetensors"]
    weight_map, converted, written = {}, 0, 0
    for shard in shards:
        tensors = {}
        with safe_open(source / shard, "pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                tensor = reader.get_tensor(name)
                if not converts(name, tensor.dim(), kept):
                    tensors[name] = tensor
                    continue
                weight = tensor.to(device, torch.float32)
                parts = fp8_block(weight) if fmt == "fp8" else w4a16_packed(weight, group, tensor.dtype)
                prefix = name.removesuffix(".weight")
                tensors.update({f"{prefix}.{leaf}": value.contiguous().cpu() for leaf, value in parts.items()})
                converted += 1
        save_file(tensors, dest / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        written += sum(t.numel() * t.element_size() for t in tensors.values())
    if index_path.is_file():
        (dest / index_path.name).write_text(json.dumps({"metadata": {"total_size": written},
                                                        "weight_map": weight_map}, indent=1))
    quant = quantization_config(fmt, config["num_hidden_layers"], group)
    (dest / "config.json").write_text(json.dumps({**config, "quantization_config": quant}, indent=1))
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (source / extra).is_file():
            shutil.copy(source / extra, dest / extra)
    return {"format": fmt, "group_size": group if fmt == "w4a16" else None, "converted_linears": converted,
            "bytes": written, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("format", choices=FORMATS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(json.dumps(quantize(args.source, args.dest, args.format, args.device)))


if __name__ == "__main__":
    main()
