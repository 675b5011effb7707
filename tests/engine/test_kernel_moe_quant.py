"""The fused MoE over quantized experts (engine/ops/triton_moe_quant.py) under Triton's interpreter.

Both formats against a float64 expert loop over weights dequantized by the dense tests' formulas
(tests/engine/test_kernel_fp8.py, tests/engine/test_kernel_w4a16.py): each token's slots through silu(x g^T) * (x u^T)
then d^T, times the routing weight. Outputs are compared whole (every pair's row), at 1, 5 and 40 tokens (one expert
taking runs longer than a block, experts left unhit), fp8 with blocks that do not divide the sizes, W4 symmetric and
asymmetric, scale blocks and groups that lie inside a tile, span several or cross them (each of the tile helpers'
three ways to load scales); and the malformed experts are refused.
"""

import pytest
import torch

from engine.ops.triton_moe_quant import Fp8Experts, W4Experts, quant_fused_experts
from tests.support.interpret import run_interpreted
from tests.support.quant_kernels import dense_experts as dense

HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 6, 2


def fp8_experts(n_features: int, k_features: int, block: tuple[int, int], g: torch.Generator) -> Fp8Experts:
    weight = (torch.randn(EXPERTS, n_features, k_features, generator=g) * 64).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(EXPERTS, -(-n_features // block[0]), -(-k_features // block[1]), generator=g) * 1e-3
    return Fp8Experts(weight, scale_inv, block)


def w4_experts(n_features: int, k_features: int, group_size: int, asymmetric: bool,
               g: torch.Generator) -> W4Experts:
    words = dict(dtype=torch.int32, generator=g)
    qweight = torch.randint(-2**31, 2**31 - 1, (EXPERTS, n_features, k_features // 8), **words)
    scales = torch.rand(EXPERTS, n_features, k_features // group_size, generator=g) * 0.02
    zeros = (torch.randint(-2**31, 2**31 - 1, (EXPERTS, k_features // group_size, -(-n_features // 8)), **words)
             if asymmetric else None)
    return W4Experts(qweight, scales, zeros, group_size)


def looped(x, ids, weights, gate_w: torch.Tensor, up_w: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The weighted parts [tokens, slots, hidden], one (token, slot) at a time, in float64."""
    out = torch.zeros(*ids.shape, x.shape[1], dtype=torch.float64)
    for t in range(ids.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[t, slot])
            gate, up = x[t].double() @ gate_w[e].T, x[t].double() @ up_w[e].T
            out[t, slot] = weights[t, slot] * ((gate * torch.sigmoid(gate) * up) @ down[e].T)
    return out


def _report() -> None:
    """Run in the interpreter: the relative error of each (format, tokens) case."""
    g = torch.Generator().manual_seed(0)
    # Blocks and groups that cross the tiles, lie inside them (one scale a row) and span several (the reshape).
    formats = [
        [fp8_experts(INTER, HIDDEN, (16, 48), g), fp8_experts(INTER, HIDDEN, (16, 48), g),
         fp8_experts(HIDDEN, INTER, (24, 16), g)],
        [fp8_experts(INTER, HIDDEN, (16, 128), g), fp8_experts(INTER, HIDDEN, (16, 128), g),
         fp8_experts(HIDDEN, INTER, (32, 32), g)],
        [w4_experts(INTER, HIDDEN, 16, True, g), w4_experts(INTER, HIDDEN, 16, True, g),
         w4_experts(HIDDEN, INTER, 8, True, g)],
        [w4_experts(INTER, HIDDEN, 32, False, g), w4_experts(INTER, HIDDEN, 32, False, g),
         w4_experts(HIDDEN, INTER, 32, False, g)],
        [w4_experts(INTER, HIDDEN, 64, True, g), w4_experts(INTER, HIDDEN, 64, True, g),
         w4_experts(HIDDEN, INTER, 32, True, g)],
    ]
    for experts in formats:
        # 40 tokens on the 64-row tile: K steps of 64, inside a 64- or 128-wide group or block.
        for tokens, ids, block_m in ((1, None, None), (5, None, None), (40, torch.tensor([[2, 0]] * 40), 64)):
            x = torch.randn(tokens, HIDDEN, generator=g)
            if ids is None:
                ids = torch.rand(tokens, EXPERTS, generator=g).topk(TOP_K, dim=-1).indices
            weights = torch.rand(tokens, TOP_K, generator=g)
            ours = quant_fused_experts(x, ids, weights, *experts, block_m=block_m)
            expected = looped(x, ids, weights.double(), *(dense(part) for part in experts))
            print(float((ours.double() - expected).norm() / expected.norm()))


def test_quantized_experts_match_the_expert_loop_in_the_interpreter():
    errors = run_interpreted("import tests.engine.test_kernel_moe_quant as t; t._report()")
    assert len(errors) == 15
    assert max(errors) < 1e-4, errors


def test_malformed_experts_are_refused():
    g = torch.Generator().manual_seed(1)
    x, ids, weights = torch.randn(2, HIDDEN), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1)
    gate, up = fp8_experts(INTER, HIDDEN, (16, 16), g), fp8_experts(INTER, HIDDEN, (16, 16), g)
    down = fp8_experts(HIDDEN, INTER, (16, 16), g)
    with pytest.raises(ValueError, match="float32"):
        quant_fused_experts(x, ids, weights, Fp8Experts(gate.weight, gate.scale_inv[:, :1], (16, 16)), up, down)
    with pytest.raises(ValueError, match="hidden"):
        quant_fused_experts(x[:, :-8], ids, weights, gate, up, down)
    with pytest.raises(ValueError, match="one format, block"):
        quant_fused_experts(x, ids, weights, gate, fp8_experts(INTER, HIDDEN, (32, 16), g), down)
    w4 = w4_experts(INTER, HIDDEN, 16, True, g)
    with pytest.raises(ValueError, match="multiple of 8"):
        quant_fused_experts(x, ids, weights, W4Experts(w4.qweight, w4.scales, w4.zeros, 12), w4, down)
    with pytest.raises(ValueError, match="ceil"):
        quant_fused_experts(x, ids, weights, W4Experts(w4.qweight, w4.scales, w4.zeros[..., :-1], 16), w4, down)
    with pytest.raises(ValueError, match="one format"):
        quant_fused_experts(x, ids, weights, w4, gate, down)
