"""Where a quantized tiny model on the GPU departs from its fp32 run on the CPU: every module's output, layer by
layer, and the logits (the prefill's and one decode step's) with each of the GPU's fast paths turned off in turn.

tests/engine/test_gpu_quant.py's whole-model test fails for the asymmetric W4 formats (GPTQ, AWQ: 0.52 off against
the CPU's 0.026, docs/benchmarks.md) while each of their quantized linears and experts matches its reference on the
GPU, and the whole model with its quantized kernels (in float16, under TRITON_INTERPRET on the CPU) matches its
reference paths. The path whose removal brings the GPU's error down to the CPU bf16 run's is the one to look at;
the module table names the first module that departs.

    python benchmarks/quant_divergence.py --out $OUT            # on a GPU machine; JSON to $OUT/quant_divergence.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import engine.layers.attention as attention_layer  # noqa: E402
import engine.layers.moe as moe  # noqa: E402
import engine.layers.norm as norm  # noqa: E402
import engine.ops.attention as attention  # noqa: E402
import engine.ops.conv as conv  # noqa: E402
import engine.ops.fused as fused  # noqa: E402
import engine.ops.gdn as gdn  # noqa: E402
import engine.ops.linear as linear  # noqa: E402
import engine.ops.paged_decode as paged_decode  # noqa: E402
import engine.ops.quantized as quantized  # noqa: E402
from engine.loader import load_model  # noqa: E402
from tests.support.engine_checkpoints import VOCAB, TinyRunner, reference_model, relative_error  # noqa: E402
from tests.support.quant_checkpoints import write_quantized  # noqa: E402

DEPTH = 3  # module names with at most this many dots are hooked (layers.0.mlp.experts)
# Each fast path as the module attributes whose None sends it to the reference (each guard tests `is not None`), or
# False for torch.compile's switch.
FAST_PATHS = {
    "quantized linears": [(quantized, "triton_fp8_block_linear"), (quantized, "triton_w4a16_linear")],
    "quantized experts": [(moe, "quant_fused_experts"), (moe, "quant_routed_experts")],
    "bf16 experts and routing": [(moe, "fused_experts"), (moe, "routed_experts"), (moe, "fits_routing_kernels"),
                                 (moe, "fits_router_gemv"), (moe, "normed_router_partials")],
    "norms": [(norm, "triton_rms_norm"), (norm, "triton_gated_rms_norm")],
    "gdn (fla, decode)": [(gdn, "_fla_chunk"), (gdn, "_fla_recurrent"), (gdn, "gdn_decode_in_place")],
    "conv": [(conv, "triton_conv_decode"), (conv, "triton_conv_prefill")],
    "attention": [(attention_layer, "triton_qk_norm_rotary_write"), (attention, "triton_write_kv"),
                  (paged_decode, "triton_paged_decode")],
    "gemv": [(linear, "triton_gemv")],
    "torch.compile fusion": [(fused, "enabled")],
}


def run(folder: Path, device: str, dtype: torch.dtype, prompt: list[int], token: int | None = None
        ) -> tuple[torch.Tensor, dict, int]:
    """The prefill's logits then one decode step's on `token` (default: the prefill's argmax; the runs under test
    take the reference's, so a different argmax never makes the difference), each hooked module's first output (all
    moved to the CPU in float32), and the token."""
    model = load_model(folder, device=device, dtype=dtype)
    outputs: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name and name.count(".") <= DEPTH:
            def keep(_, __, out, name=name):
                tensor = out[0] if isinstance(out, tuple) else out
                if isinstance(tensor, torch.Tensor):
                    outputs.setdefault(name, tensor.detach().float().cpu())
            module.register_forward_hook(keep)
    runner = TinyRunner(model, device=device)
    prefill = runner.step({"a": prompt}, all_logits=True)
    token = int(prefill[-1].argmax()) if token is None else token
    return torch.cat([prefill.float().cpu(), runner.step({"a": [token]}).float().cpu()]), outputs, token


@contextlib.contextmanager
def without(path: str) -> Iterator[None]:
    """One fast path turned off (its kernels None, or fusion False) for the block, then restored."""
    saved = [(module, name, getattr(module, name)) for module, name in FAST_PATHS[path]]
    try:
        for module, name, value in saved:
            setattr(module, name, False if isinstance(value, bool) else None)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def compare(ours: dict, reference: dict) -> list[dict]:
    rows = []
    for name, expected in reference.items():
        got = ours.get(name)
        if got is None:
            continue
        if got.dim() == expected.dim() + 1 and got.shape[-1] == expected.shape[-1]:
            got = got.sum(1)  # the fused MoE's weighted parts, which the next norm sums
        rows.append({"module": name, "error": relative_error(got, expected) if got.shape == expected.shape
                     else f"shapes {list(got.shape)} vs {list(expected.shape)}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--formats", default="gptq_asym,compressed_asym,compressed,fp8")
    parser.add_argument("--device", default="cuda", help="where the bf16 run under test goes (cpu: a check of this "
                                                         "script)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = reference_model("qwen3_next_moe")
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    result = {}
    for fmt in args.formats.split(","):
        folder, _ = write_quantized(model, Path(tempfile.mkdtemp()), fmt)
        reference, reference_outputs, token = run(folder, "cpu", torch.float32, prompt)
        gpu, gpu_outputs, _ = run(folder, args.device, torch.bfloat16, prompt, token)
        cpu_bf16, cpu_outputs, _ = run(folder, "cpu", torch.bfloat16, prompt, token)
        errors = {}
        for path in FAST_PATHS:
            with without(path):
                errors[path] = relative_error(run(folder, args.device, torch.bfloat16, prompt, token)[0], reference)
        result[fmt] = {"gpu": relative_error(gpu, reference), "cpu_bf16": relative_error(cpu_bf16, reference),
                       "gpu_without": errors, "decode_token": token,
                       "gpu_modules": compare(gpu_outputs, reference_outputs),
                       "cpu_bf16_modules": compare(cpu_outputs, reference_outputs)}
        print(fmt, {k: v for k, v in result[fmt].items() if not k.endswith("modules")}, flush=True)
        (args.out / "quant_divergence.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
