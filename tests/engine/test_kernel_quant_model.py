"""A whole quantized model on its kernels under Triton's interpreter: every quantized linear through the dense
kernels and the experts (routing included) through the fused MoE kernels, as a GPU runs them, against the same model
on the reference paths.

The GPU's whole-model test (tests/engine/test_gpu_quant.py) compares with other kernels in play too (fla, norms,
attention); this one holds the quantized kernels alone, in the model's own strides, sizes and layer order. It runs in
float16: the interpreter's bfloat16 tl.dot is wrong (numpy has no bfloat16), float16's is exact.
"""

import pytest

from tests.support.interpret import run_interpreted

FORMATS = ["fp8", "gptq_asym", "awq", "compressed", "compressed_asym"]


def _report_model(fmt: str) -> None:
    """In the interpreter: the prefill's logits and one decode step's, on the kernels and on the reference paths."""
    import tempfile
    from pathlib import Path

    import torch

    import engine.layers.moe as moe
    import engine.ops.quantized as quantized
    from engine.loader import load_model
    from tests.support.engine_checkpoints import VOCAB, TinyRunner, reference_model, relative_error
    from tests.support.quant_checkpoints import write_quantized

    folder, _ = write_quantized(reference_model("qwen3_next_moe"), Path(tempfile.mkdtemp()), fmt)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1)).tolist()

    def logits() -> torch.Tensor:
        runner = TinyRunner(load_model(folder, dtype=torch.float16))
        prefill = runner.step({"a": prompt}, all_logits=True)
        return torch.cat([prefill, runner.step({"a": [int(prefill[-1].argmax())]})]).float()

    reference = logits()
    # The CPU's dispatch opened to the kernels, as CUDA's is (engine/ops/quantized.py, engine/layers/moe.py).
    quantized._kernel_serves = lambda x: x.dtype == torch.float16
    moe.QuantizedExperts.runs_triton = lambda self, x: x.dtype == torch.float16 and self.has_kernels
    calls = {"linears": 0, "experts": 0}
    for name, counted in (("triton_fp8_block_linear", "linears"), ("triton_w4a16_linear", "linears")):
        kernel = getattr(quantized, name)
        setattr(quantized, name, lambda *a, kernel=kernel, counted=counted, **k: (
            calls.__setitem__(counted, calls[counted] + 1), kernel(*a, **k))[1])
    for name in ("quant_fused_experts", "quant_routed_experts"):
        kernel = getattr(moe, name)
        setattr(moe, name, lambda *a, kernel=kernel, **k: (calls.__setitem__("experts", calls["experts"] + 1),
                                                           kernel(*a, **k))[1])
    ours = logits()
    print(calls["linears"])
    print(calls["experts"])
    print(relative_error(ours, reference))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_model_on_its_kernels_matches_its_reference_paths(fmt):
    linears, experts, error = run_interpreted(
        f"import tests.engine.test_kernel_quant_model as t; t._report_model({fmt!r})")
    assert linears > 0 and experts > 0  # the kernels really ran, both kinds
    assert error < 5e-3, error
