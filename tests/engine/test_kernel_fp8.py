"""The block-scaled FP8 linear (engine/ops/triton_fp8.py): both paths under Triton's interpreter, and its refusals.

The reference is the layout's formula, written here: w[n, k] = float(weight[n, k]) * scale_inv[n // bn, k // bk],
y = x @ w^T in float64. W8A16 runs float32 x against it (within 1e-4 relative) at M = 1, 3, 17 and 64, with N and K
that are not multiples of the block or the tile, a block larger than the matrix, a block whose K is not a multiple of
the tile's (the scale changes inside a tile), a strided x and leading dims. The W8A8 GEMM is checked against the same
formula applied to the x it quantized (quantize_rows' own output: the interpreter's float -> fp8 rounding is not the
GPU's, so the rounding itself is checked bit for bit on the GPU, tests/engine/test_gpu_quant.py, and here only on
values fp8 holds exactly). The path choice and the fp8 tensor-core path's speed belong to the GPU.
"""

import pytest
import torch

from engine.ops.triton_fp8 import QuantTile, fp8_path, triton_fp8_block_linear
from tests.support.interpret import run_interpreted
from tests.support.quant_kernels import FP8, fp8_case, relative
from tests.support.quant_kernels import fp8_reference as reference

W8A16_CASES = [  # rows, N, K, block, tile (None: the shipped one for the rows)
    (1, 40, 300, (16, 32), None),
    (1, 21, 100, (7, 24), QuantTile(1, 8, 64, 4, 1)),  # block K 24 inside 64-wide tiles
    (3, 33, 130, (8, 64), None),
    (17, 70, 96, (128, 128), None),  # the block larger than the whole matrix
    (64, 24, 200, (16, 16), None),
    (5, 50, 160, (32, 48), QuantTile(16, 16, 32, 4, 1)),
    (64, 40, 320, (32, 64), None),  # one scale a row per 64-wide tile, five of them
]


def _report_w8a16() -> None:
    """Run in the interpreter: the relative error of each case, then of a strided x with leading dims."""
    for seed, (rows, n_features, k_features, block, tile) in enumerate(W8A16_CASES):
        x, weight, scale_inv = fp8_case(rows, n_features, k_features, block, seed)
        ours = triton_fp8_block_linear(x, weight, scale_inv, block, path="w8a16", tile=tile)
        assert ours.shape == (rows, n_features) and ours.dtype == x.dtype
        print(relative(ours, reference(x, weight, scale_inv, block)))
    x, weight, scale_inv = fp8_case(6, 19, 2 * 72, (8, 32), 99)
    strided = x.view(2, 3, 2 * 72)[..., ::2]  # [2, 3, 72], every other column
    weight = weight[:, :72].contiguous()
    scale_inv = scale_inv[:, :3].contiguous()
    ours = triton_fp8_block_linear(strided, weight, scale_inv, (8, 32), path="w8a16")
    assert ours.shape == (2, 3, 19)
    print(relative(ours.reshape(6, 19), reference(strided.reshape(6, 72), weight, scale_inv, (8, 32))))


def _report_w8a8() -> None:
    """Run in the interpreter: quantize_rows on values fp8 holds (0: exact), then the W8A8 GEMM's relative error
    against the formula over the x it quantized, per case."""
    from engine.ops.triton_fp8 import quantize_rows

    g = torch.Generator().manual_seed(7)
    levels = torch.randn(5, 96, generator=g).to(FP8).float()
    levels[:, ::32] = 448.0  # each 32-column group's absmax is 448, so its scale is exactly the group's factor
    factors = torch.tensor([0.5, 2.0, 0.25]).repeat_interleave(32)
    q, scales = quantize_rows(levels * factors, 32)
    print(float((q.float() - levels).abs().max() + (scales - factors[::32]).abs().max()))
    for seed, (rows, n_features, k_features, block) in enumerate(
            [(1, 40, 300, (16, 32)), (3, 33, 130, (8, 64)), (17, 70, 96, (128, 128)), (64, 24, 200, (16, 32))]):
        x, weight, scale_inv = fp8_case(rows, n_features, k_features, block, seed)
        ours = triton_fp8_block_linear(x, weight, scale_inv, block, path="w8a8")
        q, scales = quantize_rows(x, block[1])
        x_seen = q.double() * scales.double().repeat_interleave(block[1], 1)[:, :k_features]
        print(relative(ours, reference(x_seen, weight, scale_inv, block)))


def test_w8a16_matches_the_block_formula_in_the_interpreter():
    errors = run_interpreted("import tests.engine.test_kernel_fp8 as t; t._report_w8a16()")
    assert len(errors) == len(W8A16_CASES) + 1
    assert max(errors) < 1e-4, errors


def test_w8a8_multiplies_the_quantized_x_by_the_block_formula_in_the_interpreter():
    quantization_error, *errors = run_interpreted("import tests.engine.test_kernel_fp8 as t; t._report_w8a8()")
    assert quantization_error == 0.0
    assert len(errors) == 4
    assert max(errors) < 1e-4, errors


def test_the_cpu_takes_w8a16():
    x, _, _ = fp8_case(512, 8, 128, (128, 128), 0, dtype=torch.bfloat16)
    assert fp8_path(x, (128, 128)) == "w8a16"


@pytest.mark.parametrize(("change", "message"), [
    (lambda x, w, s, b: (x, w.float(), s, b), "float8_e4m3fn"),
    (lambda x, w, s, b: (x[:, :-1], w, s, b), "K = 64"),
    (lambda x, w, s, b: (x.int(), w, s, b), "bfloat16, float16 or float32"),
    (lambda x, w, s, b: (x, w, s[:, :1], b), r"needs float32 \(2, 2\)"),
    (lambda x, w, s, b: (x, w, s.double(), b), "needs float32"),
    (lambda x, w, s, b: (x, w, s, (32, 0)), "both >= 1"),
])
def test_malformed_inputs_are_refused_with_the_fix_named(change, message):
    x, weight, scale_inv = fp8_case(2, 40, 64, (32, 32), 0)
    with pytest.raises(ValueError, match=message):
        triton_fp8_block_linear(*change(x, weight, scale_inv, (32, 32)))


def test_w8a8_refuses_a_block_its_k_step_cannot_take():
    x, weight, scale_inv = fp8_case(2, 40, 96, (32, 48), 0)
    with pytest.raises(ValueError, match="32, 64, 128 or 256"):
        triton_fp8_block_linear(x, weight, scale_inv, (32, 48), path="w8a8")
