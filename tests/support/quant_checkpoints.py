"""Quantized checkpoints of a tiny reference model, written here in each format the engine reads, with the
dequantized checkpoint of the same weights beside each (the parity reference transformers loads).

The packing is written from each library's own code (read, not imported: AutoGPTQ's v1 pack, AutoAWQ's GEMM pack,
compressed-tensors' pack_to_int32), independently of the engine's unpacking, so a mistake in either shows up as a
parity failure. Which linears convert follows the quantizers' usual choice: every 2-D weight of a decoder layer but
the router (`mlp.gate`) and the shared expert's gate (and for fp8, as Qwen publishes it, GDN's in_proj_ba).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from tests.support.engine_checkpoints import save_checkpoint

GROUP = 16  # divides every in_features of the tiny models (32, 48, 64, 96)
# fp8 blocks: 16 x 16 divides every matrix; 32 x 32 leaves partial blocks (out 48, in 48 and 96), which transformers'
# dequantizing load (5.25) gets wrong (it infers the block from the scale grid), so only the engine reads those.
BLOCKS = {"fp8": (16, 16), "fp8_partial": (32, 32)}
FP8_MAX = 448.0
FORMATS = ("fp8", "fp8_partial", "gptq", "gptq_asym", "awq", "compressed", "compressed_asym")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_KEPT = ("mlp.gate", "mlp.shared_expert_gate")
_FP8_KEPT = (*_KEPT, "linear_attn.in_proj_ba")  # Qwen's fp8 checkpoints keep GDN's small projection too


def quantization_config(fmt: str, num_layers: int) -> dict:
    """The quantization_config each library writes for these choices."""
    if fmt in BLOCKS:  # as Qwen publishes it: the unconverted modules listed per layer
        kept = ["lm_head"] + [f"model.layers.{i}.{module}" for i in range(num_layers) for module in _FP8_KEPT]
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(BLOCKS[fmt]), "modules_to_not_convert": kept}
    if fmt.startswith("gptq"):
        return {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                "sym": fmt == "gptq", "checkpoint_format": "gptq", "static_groups": False, "true_sequential": True}
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    symmetric = fmt == "compressed"
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "pack-quantized", "input_activations": None,
                "output_activations": None, "weights": {
                    "num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP,
                    "symmetric": symmetric, "dynamic": False, "actorder": None}}},
            "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]}


def write_quantized(model: transformers.PreTrainedModel, folder: Path, fmt: str) -> tuple[Path, Path]:
    """(quantized checkpoint, dequantized reference checkpoint) of `model`'s weights, under `folder`."""
    plain = save_checkpoint(model, folder / "plain")
    state = load_file(plain / "model.safetensors")
    quantized, dequantized = {}, dict(state)
    for name, weight in state.items():
        if not converts(name, weight, _FP8_KEPT if fmt in BLOCKS else _KEPT):
            quantized[name] = weight
            continue
        tensors, dequantized[name] = QUANTIZERS[fmt](weight.float())
        quantized.update({f"{name.removesuffix('.weight')}.{leaf}": t.contiguous() for leaf, t in tensors.items()})
    config = json.loads((plain / "config.json").read_text())
    for out, tensors, quant in ((folder / fmt, quantized, quantization_config(fmt, config["num_hidden_layers"])),
                                (folder / f"{fmt}-dequantized", dequantized, None)):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant} if quant else config))
        if (plain / "generation_config.json").exists():
            shutil.copy(plain / "generation_config.json", out)
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return folder / fmt, folder / f"{fmt}-dequantized"


def converts(name: str, tensor: torch.Tensor, kept: tuple[str, ...]) -> bool:
    return name.startswith("model.layers.") and name.endswith(".weight") and tensor.dim() == 2 \
        and not name.removesuffix(".weight").endswith(kept)


# --- the quantizers: (checkpoint tensors by leaf name, the dequantized weight in float32) -------------------------

def _fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[dict, torch.Tensor]:
    rows, cols = weight.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = weight.abs()
    amax = padded.unflatten(0, (grid[0], block[0])).unflatten(2, (grid[1], block[1])).amax((1, 3))
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    expanded = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    stored = (weight / expanded).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"weight": stored, "weight_scale_inv": scale}, stored.float() * expanded


def _int4(weight: torch.Tensor, symmetric: bool, scale_dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] 0..15, scale [N, K / G] (in scale_dtype), zero [N, K / G] and the dequantized weight."""
    groups = weight.unflatten(1, (-1, GROUP))
    if symmetric:
        scale = (groups.abs().amax(-1) / 7).clamp(min=1e-8).to(scale_dtype)
        zero = torch.full_like(scale, 8, dtype=torch.int64)
    else:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8).to(scale_dtype)
        zero = (-low / scale.float()).round().clamp(1, 14).long()  # GPTQ v1 cannot store a zero point of 0
    q = ((groups / scale.float()[..., None]).round() + zero[..., None]).clamp(0, 15).long()
    dequantized = ((q - zero[..., None]).float() * scale.float()[..., None]).flatten(1)
    return q.flatten(1), scale, zero, dequantized


def _pack(values: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """[R, C] values 0..15 -> [R, C / 8] int32: nibble i of word j holds column 8 j + order[i] (numpy, as the
    libraries pack)."""
    array = values.numpy().astype(np.uint32)
    packed = np.zeros((array.shape[0], array.shape[1] // 8), dtype=np.uint32)
    for i, column in enumerate(order):
        packed |= array[:, column::8] << (4 * i)
    return torch.from_numpy(packed.view(np.int32))


def _gptq(weight: torch.Tensor, symmetric: bool) -> tuple[dict, torch.Tensor]:
    """AutoGPTQ's v1 layout: qweight [K / 8, N] packed along K, qzeros [K / G, N / 8] stored minus one."""
    q, scale, zero, dequantized = _int4(weight, symmetric, torch.float16)
    k = weight.shape[1]
    return {"qweight": _pack(q).t(),
            "qzeros": _pack((zero - 1).t().contiguous()), "scales": scale.t(),
            "g_idx": (torch.arange(k) // GROUP).to(torch.int32)}, dequantized


def _awq(weight: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """AutoAWQ's GEMM layout: qweight [K, N / 8] and qzeros [K / G, N / 8] packed along N in AWQ_ORDER."""
    q, scale, zero, dequantized = _int4(weight, False, torch.float16)
    return {"qweight": _pack(q.t().contiguous(), AWQ_ORDER), "qzeros": _pack(zero.t().contiguous(), AWQ_ORDER),
            "scales": scale.t()}, dequantized


def _compressed(weight: torch.Tensor, symmetric: bool) -> tuple[dict, torch.Tensor]:
    """compressed-tensors pack-quantized: weight_packed [N, K / 8], zero points packed along N (dim 0)."""
    q, scale, zero, dequantized = _int4(weight, symmetric, weight.dtype)
    tensors = {"weight_packed": _pack(q), "weight_scale": scale, "weight_shape": torch.tensor(weight.shape)}
    if not symmetric:
        tensors["weight_zero_point"] = _pack(zero.t().contiguous()).t()
    return tensors, dequantized


QUANTIZERS = {
    "fp8": lambda w: _fp8(w, BLOCKS["fp8"]),
    "fp8_partial": lambda w: _fp8(w, BLOCKS["fp8_partial"]),
    "gptq": lambda w: _gptq(w, True),
    "gptq_asym": lambda w: _gptq(w, False),
    "awq": _awq,
    "compressed": lambda w: _compressed(w, True),
    "compressed_asym": lambda w: _compressed(w, False),
}


def altered_copy(source: Path, dest: Path, tensors: Callable[[dict], None] | None = None,
                 quantization: dict | None = None) -> Path:
    """A copy of a checkpoint with its tensors edited in place by `tensors` and its quantization_config updated."""
    dest.mkdir(parents=True, exist_ok=True)
    state = load_file(source / "model.safetensors")
    if tensors is not None:
        tensors(state)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {**config["quantization_config"], **(quantization or {})}
    (dest / "config.json").write_text(json.dumps(config))
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
    return dest
