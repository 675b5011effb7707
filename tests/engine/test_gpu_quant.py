"""The quantized linears on the GPU (skipped without CUDA): bf16 at the bench model's projection sizes against the
layouts' formulas in float32, within bf16's rounding; the Hopper W8A8 path and its x quantization bit for bit against
torch's cast; the path choice; capture in a CUDA graph.

    python -m pytest -p no:django -p no:cacheprovider --confcutdir tests/engine tests/engine/test_gpu_quant.py
"""

import pytest
import torch

from engine.loader import load_model
from engine.ops.triton_fp8 import W8A8_MIN_ROWS, fp8_path, quantize_rows, triton_fp8_block_linear
from engine.ops.triton_w4a16 import triton_w4a16_linear
from tests.support.engine_checkpoints import VOCAB, TinyRunner, relative_error
from tests.support.quant_kernels import dense_experts, fp8_case, fp8_reference, relative, w4_case, w4_reference

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
hopper = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                            reason="needs a Hopper GPU (sm_90)")
BF16 = 1e-2  # METHOD: bf16 paths against the fp32 reference within 1e-3 to 1e-2
SHAPES = [(2048, 4096), (12352, 2048), (9216, 2048), (1000, 1000)]  # the bench projections, and a ragged one
ROWS = [1, 3, 16, 17, 64, 512]


@cuda
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_w8a16_in_bf16_on_the_gpu(shape, rows):
    x, weight, scale_inv = fp8_case(rows, *shape, (128, 128), rows, device="cuda", dtype=torch.bfloat16)
    ours = triton_fp8_block_linear(x, weight, scale_inv, (128, 128), path="w8a16")
    assert ours.dtype == torch.bfloat16
    assert relative(ours, fp8_reference(x, weight, scale_inv, (128, 128))) < BF16


@cuda
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("asymmetric", [False, True])
def test_w4a16_in_bf16_on_the_gpu(shape, rows, asymmetric):
    x, qweight, scales, zeros = w4_case(rows, shape[0], shape[1] - shape[1] % 128 or 128, 128, asymmetric, rows,
                                        device="cuda", dtype=torch.bfloat16)
    ours = triton_w4a16_linear(x, qweight, scales, zeros, 128)
    assert ours.dtype == torch.bfloat16
    assert relative(ours, w4_reference(x, qweight, scales, zeros, 128)) < BF16


@cuda
def test_quantize_rows_rounds_as_torchs_cast():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 300, device="cuda", generator=g, dtype=torch.bfloat16) * 3
    q, scales = quantize_rows(x, 128)
    padded = torch.nn.functional.pad(x.float(), (0, 84)).view(37, 3, 128)
    expected_scales = padded.abs().amax(-1).clamp(min=1e-10) / 448.0
    expected = (padded / expected_scales[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(37, 384)[:, :300]
    assert torch.equal(scales, expected_scales)
    assert torch.equal(q.view(torch.uint8), expected.view(torch.uint8))


@hopper
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_w8a8_on_hopper(shape, rows):
    x, weight, scale_inv = fp8_case(rows, *shape, (128, 128), rows, device="cuda", dtype=torch.bfloat16)
    ours = triton_fp8_block_linear(x, weight, scale_inv, (128, 128), path="w8a8")
    q, scales = quantize_rows(x, 128)
    x_seen = q.double() * scales.double().repeat_interleave(128, 1)[:, :shape[1]]
    # Exact products of fp8 values, float32 sums, one bf16 rounding of y.
    assert relative(ours, fp8_reference(x_seen, weight, scale_inv, (128, 128))) < 1e-2
    # x's rounding to fp8 (3 mantissa bits) is what W8A8 gives up against the exact x.
    assert relative(ours, fp8_reference(x, weight, scale_inv, (128, 128))) < 6e-2


@hopper
def test_hopper_takes_w8a8_for_prefill_and_w8a16_for_decode():
    def x(rows):
        return torch.zeros(rows, 256, device="cuda", dtype=torch.bfloat16)

    assert fp8_path(x(W8A8_MIN_ROWS), (128, 128)) == "w8a8"
    assert fp8_path(x(W8A8_MIN_ROWS - 1), (128, 128)) == "w8a16"
    assert fp8_path(x(1), (128, 128)) == "w8a16"
    assert fp8_path(x(512), (128, 96)) == "w8a16"  # a block W8A8's K step cannot take
    assert fp8_path(x(512).float(), (128, 128)) == "w8a16"


@cuda
def test_the_kernels_capture_in_a_cuda_graph():
    x, weight, scale_inv = fp8_case(1, 256, 512, (128, 128), 0, device="cuda", dtype=torch.bfloat16)
    x4, qweight, scales, zeros = w4_case(1, 256, 512, 128, True, 0, device="cuda", dtype=torch.bfloat16)
    expected = (triton_fp8_block_linear(x, weight, scale_inv, (128, 128)),
                triton_w4a16_linear(x4, qweight, scales, zeros, 128))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = (triton_fp8_block_linear(x, weight, scale_inv, (128, 128)),
                   triton_w4a16_linear(x4, qweight, scales, zeros, 128))
    graph.replay()
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))


@cuda
@pytest.mark.parametrize("fmt", ["fp8", "w4_asymmetric"])
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_quantized_experts_in_bf16_on_the_gpu(fmt, tokens):
    """The bench model's expert sizes (hidden 2048, I 512), 32 experts top-8, against the float64 loop."""
    from engine.ops.triton_moe_quant import Fp8Experts, W4Experts, quant_fused_experts

    g = torch.Generator(device="cuda").manual_seed(tokens)
    experts, hidden, inter, top_k = 32, 2048, 512, 8
    parts = []
    for n_features, k_features in ((inter, hidden), (inter, hidden), (hidden, inter)):
        if fmt == "fp8":
            weight = (torch.randn(experts, n_features, k_features, device="cuda", generator=g) * 64).to(
                torch.float8_e4m3fn)
            scale_inv = torch.rand(experts, n_features // 128, k_features // 128, device="cuda", generator=g) * 1e-3
            parts.append(Fp8Experts(weight, scale_inv, (128, 128)))
        else:
            words = dict(dtype=torch.int32, device="cuda", generator=g)
            qweight = torch.randint(-2**31, 2**31 - 1, (experts, n_features, k_features // 8), **words)
            scales = (torch.rand(experts, n_features, k_features // 128, device="cuda", generator=g) * 0.01).bfloat16()
            zeros = torch.randint(-2**31, 2**31 - 1, (experts, k_features // 128, n_features // 8), **words)
            parts.append(W4Experts(qweight, scales, zeros, 128))
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, device="cuda", generator=g)
    ours = quant_fused_experts(x, ids, weights.bfloat16(), *parts)
    gate_w, up_w, down = (dense_experts(part) for part in parts)
    expected = torch.zeros(tokens, top_k, hidden, dtype=torch.float64, device="cuda")
    for e in ids.unique().tolist():
        t, slot = (ids == e).nonzero(as_tuple=True)
        gate, up = x[t].double() @ gate_w[e].T, x[t].double() @ up_w[e].T
        expected[t, slot] = weights[t, slot].double()[:, None] * ((gate * torch.sigmoid(gate) * up) @ down[e].T)
    assert relative(ours, expected) < BF16


@cuda
@pytest.mark.parametrize("fmt", ["fp8", "fp8_partial", "gptq_asym", "awq", "compressed"])
def test_a_quantized_model_on_the_gpu_runs_the_kernels_within_bf16s_error(fmt, quantized_checkpoint):
    """The whole model (its projections through engine/ops/quantized.py's dispatch, so the Triton kernels; its
    experts expert by expert) in bf16 on the GPU, against the same checkpoint in fp32 on the CPU (the reference
    path): no further from it than the CPU's own bf16 run, with room for the kernels' other summation order."""
    folder, _ = quantized_checkpoint(fmt)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1)).tolist()

    def logits(device: str, dtype: torch.dtype, token: int | None = None) -> list[torch.Tensor]:
        """The prefill's logits, then a decode step's on `token` (default: the prefill's argmax). The bf16 runs take
        the reference's token, so that a different argmax never makes the difference."""
        runner = TinyRunner(load_model(folder, device=device, dtype=dtype), device=device)
        first = runner.step({"a": prompt}, all_logits=True)
        token = int(first[-1].argmax()) if token is None else token
        return [first.float().cpu(), runner.step({"a": [token]})[0].float().cpu()]

    reference = logits("cpu", torch.float32)
    token = int(reference[0][-1].argmax())
    cpu_bf16, gpu_bf16 = logits("cpu", torch.bfloat16, token), logits("cuda", torch.bfloat16, token)
    cpu_error = max(relative_error(a, b) for a, b in zip(cpu_bf16, reference, strict=True))
    gpu_error = max(relative_error(a, b) for a, b in zip(gpu_bf16, reference, strict=True))
    assert gpu_error <= max(2 * cpu_error, BF16), (gpu_error, cpu_error)
