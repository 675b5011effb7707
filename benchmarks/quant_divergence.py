"""Where a quantized tiny model on the GPU departs from its fp32 run on the CPU: every module's output, layer by
layer, and the logits with the quantized layers' kernels and with their torch reference paths on the GPU.

tests/engine/test_gpu_quant.py's whole-model test fails for the asymmetric W4 formats (GPTQ, AWQ: 0.52 off against
the CPU's 0.026, docs/benchmarks.md) while each of their quantized linears and experts matches its reference on the
GPU; this names the first module that does not.

    python benchmarks/quant_divergence.py --out $OUT            # on a GPU machine; JSON to $OUT/quant_divergence.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import engine.layers.moe as moe  # noqa: E402
import engine.ops.quantized as quantized  # noqa: E402
from engine.loader import load_model  # noqa: E402
from tests.support.engine_checkpoints import VOCAB, TinyRunner, reference_model, relative_error  # noqa: E402
from tests.support.quant_checkpoints import write_quantized  # noqa: E402

DEPTH = 3  # module names with at most this many dots are hooked (layers.0.mlp.experts)


def run(folder: Path, device: str, dtype: torch.dtype, prompt: list[int]) -> tuple[torch.Tensor, dict]:
    """The prefill's logits and each hooked module's first output (both moved to the CPU in float32)."""
    model = load_model(folder, device=device, dtype=dtype)
    outputs: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name and name.count(".") <= DEPTH:
            def keep(_, __, out, name=name):
                tensor = out[0] if isinstance(out, tuple) else out
                if isinstance(tensor, torch.Tensor):
                    outputs.setdefault(name, tensor.detach().float().cpu())
            module.register_forward_hook(keep)
    logits = TinyRunner(model, device=device).step({"a": prompt}, all_logits=True)
    return logits.float().cpu(), outputs


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
        reference, reference_outputs = run(folder, "cpu", torch.float32, prompt)
        gpu, gpu_outputs = run(folder, args.device, torch.bfloat16, prompt)
        cpu_bf16, cpu_outputs = run(folder, "cpu", torch.bfloat16, prompt)
        kernel_serves, has_kernels = quantized._kernel_serves, moe.QuantizedExperts.has_kernels
        quantized._kernel_serves = lambda x: False
        moe.QuantizedExperts.has_kernels = property(lambda self: False)
        try:
            gpu_reference_paths, _ = run(folder, args.device, torch.bfloat16, prompt)
        finally:
            quantized._kernel_serves, moe.QuantizedExperts.has_kernels = kernel_serves, has_kernels
        result[fmt] = {"gpu": relative_error(gpu, reference), "cpu_bf16": relative_error(cpu_bf16, reference),
                       "gpu_reference_paths": relative_error(gpu_reference_paths, reference),
                       "gpu_modules": compare(gpu_outputs, reference_outputs),
                       "cpu_bf16_modules": compare(cpu_outputs, reference_outputs)}
        print(fmt, {k: v for k, v in result[fmt].items() if not k.endswith("modules")}, flush=True)
        (args.out / "quant_divergence.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
