"""The W4A16 linear (engine/ops/triton_w4a16.py) under Triton's interpreter against the layout's formula, and its
refusals.

The reference unpacks the words here, as the layout says: q(n, k) = (qweight[n, k // 8] >> 4 (k % 8)) & 0xF,
z(g, n) = (zeros[g, n // 8] >> 4 (n % 8)) & 0xF (8 without zeros), w = (q - z) * scales[n, k // G], y = x @ w^T in
float64. The words are random over all 32 bits (the top nibble's sign bit included). Float32 x within 1e-4 relative at
M = 1, 3, 17 and 64, symmetric and asymmetric, N not a multiple of 8 (the zeros' last word half used) nor of the tile,
K not a multiple of the tile, group sizes 8 to 128 (24: a group not a power of two), a strided x with leading dims.
"""

import pytest
import torch

from engine.ops.triton_fp8 import QuantTile
from engine.ops.triton_w4a16 import triton_w4a16_linear
from tests.support.interpret import run_interpreted
from tests.support.quant_kernels import relative, w4_case
from tests.support.quant_kernels import w4_reference as reference

CASES = [  # rows, N, K, group size, asymmetric, tile (None: the shipped one for the rows)
    (1, 40, 256, 32, False, None),
    (1, 37, 192, 64, True, None),
    (1, 21, 96, 8, True, QuantTile(1, 8, 64, 4, 1)),
    (3, 33, 96, 8, True, None),
    (3, 16, 128, 128, False, None),
    (17, 70, 128, 64, True, None),
    (17, 9, 48, 24, False, None),
    (64, 24, 48, 24, True, None),
    (64, 50, 160, 32, False, QuantTile(16, 16, 64, 4, 1)),
]


def _report() -> None:
    """Run in the interpreter: the relative error of each case, then of a strided x with leading dims."""
    for seed, (rows, n_features, k_features, group_size, asymmetric, tile) in enumerate(CASES):
        x, qweight, scales, zeros = w4_case(rows, n_features, k_features, group_size, asymmetric, seed)
        ours = triton_w4a16_linear(x, qweight, scales, zeros, group_size, tile=tile)
        assert ours.shape == (rows, n_features) and ours.dtype == x.dtype
        print(relative(ours, reference(x, qweight, scales, zeros, group_size)))
    x, qweight, scales, zeros = w4_case(6, 19, 64, 16, True, 99)
    strided = torch.randn(2, 3, 128)[..., ::2]
    ours = triton_w4a16_linear(strided, qweight, scales, zeros, 16)
    assert ours.shape == (2, 3, 19)
    print(relative(ours.reshape(6, 19), reference(strided.reshape(6, 64), qweight, scales, zeros, 16)))


def test_w4a16_matches_the_layout_formula_in_the_interpreter():
    errors = run_interpreted("import tests.engine.test_kernel_w4a16 as t; t._report()")
    assert len(errors) == len(CASES) + 1
    assert max(errors) < 1e-4, errors


@pytest.mark.parametrize(("change", "message"), [
    (lambda x, q, s, z, gs: (x, q, s, z, 12), "multiple of 8"),
    (lambda x, q, s, z, gs: (x, q, s, z, 48), "divides K"),
    (lambda x, q, s, z, gs: (x, q, s, z, 0), "multiple of 8"),
    (lambda x, q, s, z, gs: (x, q.long(), s, z, gs), "int32 \\[N, K/8\\]"),
    (lambda x, q, s, z, gs: (x[:, :-8], q, s, z, gs), "K = 64"),
    (lambda x, q, s, z, gs: (x, q, s.double(), z, gs), "need torch.float32"),
    (lambda x, q, s, z, gs: (x, q, s[:, :1], z, gs), r"\(40, 2\)"),
    (lambda x, q, s, z, gs: (x, q, s, z[:, :-1], gs), r"\(2, 5\)"),
    (lambda x, q, s, z, gs: (x, q, s, z.long(), gs), "int32 \\[K/G, ceil\\(N/8\\)\\]"),
])
def test_malformed_inputs_are_refused_with_the_fix_named(change, message):
    x, qweight, scales, zeros = w4_case(2, 40, 64, 32, True, 0)
    with pytest.raises(ValueError, match=message):
        triton_w4a16_linear(*change(x, qweight, scales, zeros, 32))
