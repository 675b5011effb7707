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


def _report_shared() -> None:
    """In the interpreter: a shared expert as slot E (its own tensors, a leading dim of 1) beside the routed ones."""
    g = torch.Generator().manual_seed(2)
    for make in (lambda n, k: fp8_experts(n, k, (16, 16), g), lambda n, k: w4_experts(n, k, 16, True, g)):
        routed = [make(INTER, HIDDEN), make(INTER, HIDDEN), make(HIDDEN, INTER)]
        own = [make(INTER, HIDDEN), make(INTER, HIDDEN), make(HIDDEN, INTER)]
        shared = [type(part)(*(t[:1] if isinstance(t, torch.Tensor) else t for t in vars(part).values()))
                  for part in own]
        for tokens in (1, 5):
            x = torch.randn(tokens, HIDDEN, generator=g)
            ids = torch.rand(tokens, EXPERTS, generator=g).topk(TOP_K, dim=-1).indices
            ids = torch.cat([ids, torch.full((tokens, 1), EXPERTS)], 1)  # slot TOP_K: the shared expert, id E
            weights = torch.rand(tokens, TOP_K + 1, generator=g)
            ours = quant_fused_experts(x, ids, weights, *routed, shared=tuple(shared))
            dense_all = [torch.cat([dense(r), dense(s)]) for r, s in zip(routed, shared, strict=True)]
            expected = looped(x, ids, weights.double(), *dense_all)
            print(float((ours.double() - expected).norm() / expected.norm()))


def test_a_shared_expert_rides_as_slot_e_from_its_own_tensors_in_the_interpreter():
    errors = run_interpreted("import tests.engine.test_kernel_moe_quant as t; t._report_shared()")
    assert len(errors) == 4
    assert max(errors) < 1e-4, errors


def test_a_shared_expert_of_another_shape_is_refused():
    g = torch.Generator().manual_seed(3)
    routed = [fp8_experts(INTER, HIDDEN, (16, 16), g), fp8_experts(INTER, HIDDEN, (16, 16), g),
              fp8_experts(HIDDEN, INTER, (16, 16), g)]
    wide = [fp8_experts(2 * INTER, HIDDEN, (16, 16), g), fp8_experts(2 * INTER, HIDDEN, (16, 16), g),
            fp8_experts(HIDDEN, 2 * INTER, (16, 16), g)]
    shared = tuple(Fp8Experts(part.weight[:1], part.scale_inv[:1], part.block) for part in wide)
    x, ids, weights = torch.randn(2, HIDDEN), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1)
    with pytest.raises(ValueError, match="shared expert"):
        quant_fused_experts(x, ids, weights, *routed, shared=shared)


def _report_layer(fmt: str) -> None:
    """In the interpreter: a quantized checkpoint's MoE layer on the fused path (shared expert as slot E, the router
    merged with its gate) against the same layer's reference path (the expert loop, the shared expert's own MLP)."""
    import tempfile
    from pathlib import Path

    import torch.nn.functional as F

    from engine.layers.moe import SparseMoE
    from engine.loader import load_model
    from tests.support.engine_checkpoints import reference_model
    from tests.support.quant_checkpoints import write_quantized

    # The shared expert as wide as a routed one (Qwen3-Next's 512 and 512), so it fits a slot.
    model = reference_model("qwen3_next_moe", shared_expert_intermediate_size=32)
    folder, _ = write_quantized(model, Path(tempfile.mkdtemp()), fmt)
    moe = next(m for m in load_model(folder).modules() if isinstance(m, SparseMoE))
    x = torch.randn(5, moe.gate.in_features, generator=torch.Generator().manual_seed(4))
    expected = moe(x)
    moe.merge_projections()
    print(float(moe.experts.has_shared_slot))
    parts = moe.experts.triton_parts(x, moe.top_k, moe.norm_topk_prob, logits=F.linear(x, moe.router_weight))
    print(float((parts.sum(1) - expected).norm() / expected.norm()))


@pytest.mark.parametrize("fmt", ["fp8", "gptq_asym"])
def test_a_quantized_moe_layer_runs_its_shared_expert_in_the_fused_kernels(fmt):
    has_slot, error = run_interpreted(f"import tests.engine.test_kernel_moe_quant as t; t._report_layer({fmt!r})")
    assert has_slot == 1.0
    assert error < 1e-4
