"""Load a HuggingFace safetensors checkpoint into a layer range of the model.

Reads a single `model.safetensors` or a sharded `model.safetensors.index.json`, and only the tensors the range
owns (its layers; the embeddings on the first range; final norm and lm_head on the last). MoE experts load from
either layout: per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` (what `save_pretrained` writes) or fused
3-D `mlp.experts.gate_up_proj` / `down_proj` (what transformers 5 holds in memory). Every name and shape is
checked against the model before any tensor is read, and all problems are reported at once.

A quantized checkpoint (fp8 block-scaled, GPTQ, AWQ, compressed-tensors pack-quantized; its config's
quantization_config) fills the quantized linears the model was built with: each says which checkpoint tensors make
its parameters and how they are repacked into the engine's layout (engine/layers/quantized.py), experts from their
per-expert tensors. The values those layouts cannot hold (an act-order g_idx, zero points of a symmetric checkpoint
that are not 8) are checked, with the names and shapes, before any parameter is filled.
"""

from __future__ import annotations

import json
import re
import zlib
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.errors import EngineLoadError
from engine.layers.quantized import (
    CheckpointPlan,
    QuantizedLinear,
    TensorCheck,
    TensorSource,
    checkpoint_format,
    keep_stored_dtypes,
)
from engine.models import RangeCausalLM, model_class

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Checkpoint tensors no model here uses: multi-token-prediction heads, rotary caches of old exports.
_IGNORED = re.compile(r"^mtp\.|rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERTS = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_MAX_LISTED = 20


@dataclass
class LoadReport:
    folder: str
    files: list[str]
    expert_layout: str | None  # per_expert | fused | None (no MoE layer in the range)
    tensors: int = 0  # checkpoint tensors read
    bytes: int = 0  # bytes of the loaded parameters
    checksums: dict[str, int] = field(default_factory=dict)  # parameter name -> crc32 of its bytes, when asked


def checkpoint_files(folder: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as error:
            raise EngineLoadError(f"{index}: not a readable safetensors index ({error})") from error
        files = {name: folder / file for name, file in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise EngineLoadError(f"{index}: shard {path.name} is listed but missing from {folder}")
        return files
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise EngineLoadError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")
    with safe_open(single, framework="pt") as handle:
        return {name: single for name in handle.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def _checkpoint_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(set(files.values())):
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                if files.get(name) == path:
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def _quantized_plan(model: RangeCausalLM) -> tuple[CheckpointPlan, bool]:
    """The quantized linears' sources and checks, by model parameter name; whether any is a stack of experts."""
    plan, experts = CheckpointPlan(), False
    quantization = model.config.census.quantization
    for name, module in model.named_modules():
        if not isinstance(module, QuantizedLinear):
            continue
        prefix = f"model.{name}"
        if module.experts:  # layers.3.mlp.experts.up_proj <- model.layers.3.mlp.experts.{e}.up_proj
            head, leaf = prefix.rsplit(".", 1)
            prefix, experts = f"{head}.*.{leaf}", True
        own = module.checkpoint_plan(prefix, checkpoint_format(quantization))
        plan.sources.update({f"{name}.{param}": source for param, source in own.sources.items()})
        plan.checks += own.checks
    return plan, experts


def _plan(model: RangeCausalLM, available: set[str]) -> tuple[dict[str, TensorSource], list[TensorCheck], str | None]:
    """Parameter name -> its checkpoint source(s), choosing each MoE layer's expert layout from what is present;
    the checks on checkpoint values."""
    config = model.config
    quantized, quantized_experts = _quantized_plan(model)
    plan: dict[str, TensorSource] = dict(quantized.sources)
    layout = "per_expert" if quantized_experts else None
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        if name in plan:
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            plan[name] = TensorSource(["model.embed_tokens.weight"], [shape])
        elif name.startswith("lm_head."):
            plan[name] = TensorSource([name], [shape])
        elif (match := _EXPERTS.match(name)) and f"model.{name}" not in available:
            prefix, kind = f"model.{match.group(1)}", match.group(2)
            experts = range(shape[0])
            if kind == "gate_up_proj":
                half = (shape[1] // 2, shape[2])
                names = [f"{prefix}.{e}.{proj}.weight" for e in experts for proj in ("gate_proj", "up_proj")]
                plan[name] = TensorSource(names, [half] * len(names), lambda ts: torch.stack(
                    [torch.cat(ts[i:i + 2]) for i in range(0, len(ts), 2)]))
            else:
                names = [f"{prefix}.{e}.down_proj.weight" for e in experts]
                plan[name] = TensorSource(names, [shape[1:]] * len(names), torch.stack)
            layout = "per_expert"
        else:
            plan[name] = TensorSource([f"model.{name}"], [shape])
            if _EXPERTS.match(name):
                layout = "fused"
    return plan, quantized.checks, layout


def _owned(name: str, model: RangeCausalLM) -> bool:
    """Whether a checkpoint tensor is this range's to load (a tensor no range owns counts as everyone's)."""
    if match := _LAYER.match(name):
        index = int(match.group(1))
        return model.start <= index < model.stop or not 0 <= index < model.config.num_layers
    if name == "model.embed_tokens.weight":
        return model.is_first or (model.is_last and model.config.tie_word_embeddings)
    if name in ("model.norm.weight", "lm_head.weight"):
        return model.is_last and not (name == "lm_head.weight" and model.config.tie_word_embeddings)
    return True


def _problems(plan: dict[str, TensorSource], checks: list[TensorCheck], shapes: dict[str, tuple[int, ...]],
              model: RangeCausalLM) -> list[str]:
    expected = {
        name: shape for source in plan.values() for name, shape in zip(source.names, source.shapes, strict=True)
    }
    optional = {check.name: check.shape for check in checks if not check.required}
    expected.update({check.name: check.shape for check in checks if check.required})
    problems = [f"missing tensor {name} (expected shape {list(shape)})"
                for name, shape in expected.items() if name not in shapes]
    expected.update({name: shape for name, shape in optional.items() if name in shapes})
    problems += [f"unexpected tensor {name} (shape {list(shape)})" for name, shape in shapes.items()
                 if name not in expected and not _IGNORED.search(name) and _owned(name, model)
                 and not (name == "lm_head.weight" and model.config.tie_word_embeddings)]
    problems += [f"shape mismatch for {name}: expected {list(shape)}, got {list(shapes[name])}"
                 for name, shape in expected.items() if name in shapes and shapes[name] != shape]
    return problems


def _value_problems(checks: list[TensorCheck], files: dict[str, Path]) -> list[str]:
    """What the checked checkpoint tensors (small: a g_idx, zero points) hold that the engine cannot; each shard
    opened once (a large MoE checkpoint has a check per expert projection)."""
    problems = []
    for path in sorted({files[check.name] for check in checks if check.name in files}):
        with safe_open(path, framework="pt") as handle:
            for check in checks:
                if files.get(check.name) == path and (problem := check.problem(handle.get_tensor(check.name))):
                    problems.append(f"{check.name}: {problem}")
    return problems


def load_weights(model: RangeCausalLM, folder: str | Path, checksums: bool = False) -> LoadReport:
    """Fill every parameter of `model` from the checkpoint in `folder`; EngineLoadError names every problem."""
    files = checkpoint_files(folder)
    shapes = _checkpoint_shapes(files)
    plan, checks, layout = _plan(model, set(shapes))
    problems = _problems(plan, checks, shapes, model)
    problems = problems or _value_problems(checks, files)
    if problems:
        listed = "\n  ".join(problems[:_MAX_LISTED])
        more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise EngineLoadError(
            f"{folder}: checkpoint does not fit layers [{model.start}, {model.stop}) of the "
            f"{model.config.family} model ({len(problems)} problem(s)):\n  {listed}{more}"
        )
    needed = {files[name] for source in plan.values() for name in source.names}
    report = LoadReport(str(folder), sorted(path.name for path in needed), layout,
                        tensors=sum(len(source.names) for source in plan.values()))
    params = dict(model.named_parameters())
    # Every shard stays open (safetensors maps files lazily) so that at most one parameter's tensors are in host
    # memory at a time, even when a layer's experts straddle shards.
    with ExitStack() as stack, torch.no_grad():
        handles = {path: stack.enter_context(safe_open(path, framework="pt")) for path in sorted(needed)}
        for name, source in plan.items():
            param = params[name]
            value = source.combine([handles[files[n]].get_tensor(n) for n in source.names]).to(param.dtype)
            if checksums:
                report.checksums[name] = zlib.crc32(value.contiguous().view(torch.uint8).numpy())
            param.copy_(value)
            report.bytes += param.numel() * param.element_size()
    return report


def build_model(config: ModelConfig, start: int = 0, stop: int | None = None, device: torch.device | str = "cpu",
                dtype: torch.dtype | None = None) -> RangeCausalLM:
    """An uninitialised model for the range: built on the meta device, then given real (empty) storage."""
    with torch.device("meta"):
        model = model_class(config)(config, start, stop)
    model = model.to(dtype=dtype or config.torch_dtype)
    keep_stored_dtypes(model)  # fp8 weights and their fp32 scales keep their format's dtypes
    model = model.to_empty(device=device)
    model.tie_weights()
    return model.requires_grad_(False).eval()


def load_model(folder: str | Path, start: int = 0, stop: int | None = None, *, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, checksums: bool = False) -> RangeCausalLM:
    """Config + census from `folder/config.json`, the model for [start, stop), its weights; report on `.load_report`."""
    config = ModelConfig.from_pretrained(folder)
    model = build_model(config, start, stop, device, dtype)
    model.load_report = load_weights(model, folder, checksums)
    return model
