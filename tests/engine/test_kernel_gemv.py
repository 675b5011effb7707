"""The projections' GEMV (engine/ops/triton_gemv.py) and its dispatch (engine/ops/linear.py).

Under Triton's interpreter on the CPU: float32 against a float64 matmul, with a strided x, feature counts that are not
multiples of the tile, and several tiles; on a GPU: bf16 at the bench model's projection sizes against float32,
within bf16's rounding of the output. The dispatch keeps F.linear wherever the GEMV does not serve (CPU, float32, a
bias, more than one row), so the CPU reference is untouched.
"""

import pytest
import torch
import torch.nn.functional as F

from engine.ops.linear import gemv_serves, linear
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _report_gemv() -> None:
    """Run in the interpreter: prints the relative error of each case, then the rejected shape's flag."""
    from engine.ops.triton_gemv import GemvTile, tile_for, triton_gemv

    g = torch.Generator().manual_seed(0)
    for n_features, k_features, tile in ((40, 300, GemvTile(8, 128, 4)), (96, 1024, GemvTile(32, 256, 4)),
                                         (7, 64, GemvTile(4, 64, 1)), (20, 4096, None), (33, 2048, None)):
        x = torch.randn(1, 2 * k_features, generator=g)[:, ::2]  # a strided view: the kernel reads x's stride
        weight = torch.randn(n_features, k_features, generator=g)
        ours = triton_gemv(x, weight, tile)
        reference = x.double() @ weight.double().T
        print(float((ours.double() - reference).norm() / reference.norm()))
    print(tile_for(4096).block_k)
    try:
        triton_gemv(torch.zeros(2, 8), torch.zeros(4, 8))
        print(0.0)
    except ValueError:
        print(1.0)


def test_the_gemv_matches_a_float64_matmul_in_the_interpreter():
    *errors, long_rows_step, rejected = run_interpreted("import tests.engine.test_kernel_gemv as t; t._report_gemv()")
    assert len(errors) == 5
    assert max(errors) < 1e-6, errors
    assert long_rows_step == 1024  # the measured tile for K = 4096 (a K the loop covers in four steps)
    assert rejected == 1.0  # more rows than the GEMV serves is an error, not a silent wrong answer


def test_linear_keeps_f_linear_where_the_gemv_does_not_serve():
    g = torch.Generator().manual_seed(1)
    x, weight, bias = torch.randn(2, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    assert not gemv_serves(x, weight)  # CPU
    assert torch.equal(linear(x, weight), F.linear(x, weight))
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


@cuda
@pytest.mark.parametrize("shape", [(2048, 4096), (12352, 2048), (9216, 2048)])
def test_the_gemv_on_the_gpu(shape):
    g = torch.Generator(device="cuda").manual_seed(shape[0])
    x = torch.randn(1, shape[1], device="cuda", generator=g).bfloat16()
    weight = (torch.randn(*shape, device="cuda", generator=g) * 0.02).bfloat16()
    assert gemv_serves(x, weight) and not gemv_serves(x.float(), weight.float())
    ours = linear(x, weight)
    reference = F.linear(x.float(), weight.float())
    # One bf16 rounding of the output (2^-8 relative) on top of float32 accumulation in another order.
    assert torch.allclose(ours.float(), reference, rtol=2 ** -7, atol=1e-3), (ours.float() - reference).abs().max()
    assert not gemv_serves(torch.zeros(2, shape[1], device="cuda", dtype=torch.bfloat16), weight)
