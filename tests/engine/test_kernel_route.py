"""Routing and alignment in one launch (engine/ops/triton_route.py) and the MoE layer that uses it.

CPU, under Triton's interpreter: the kernel against `route` + `align` (the same experts a token, the same weights,
and exactly align's arrays, so align's invariants hold), with and without the shared expert's slot; its tie rule; the
whole layer on the new routing (its parts summed) against the float64 expert loop. Outputs come from torch.empty
filled with NaN / the largest integer (torch's fill_uninitialized_memory), so an unwritten element fails. CUDA (the
lead's H200): bf16 at Qwen3-Next's sizes, the layer against fp32, the layer inside a CUDA graph, and its kernel count.
"""

import copy

import pytest
import torch
from engine_checkpoints import relative_error
from interpret import run_interpreted
from torch import nn

from engine.layers.moe import SparseMoE

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16 = 1e-2
FP32 = 1e-5


def poison_empty() -> None:
    """torch.empty returns NaN (floats) and the largest value (integers): what the kernel leaves unwritten shows."""
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def compare(logits: torch.Tensor, top_k: int, norm: bool, block_m: int, shared: bool = False) -> list[float]:
    """[ids differ, weight error, aligned arrays differ] of route_and_align against route + align (with `shared`,
    the logits' last column is the shared gate's: against route + with_shared_slot + align over E + 1 experts)."""
    from engine.layers.moe import route, with_shared_slot
    from engine.ops.triton_moe import align, num_blocks_for
    from engine.ops.triton_route import route_and_align

    tokens, num_experts = logits.shape[0], logits.shape[1] - shared
    num_blocks = num_blocks_for(tokens * (top_k + shared), num_experts + shared, block_m)
    ids, weights, sorted_ids, block_expert, used = route_and_align(logits, top_k, norm, block_m, num_blocks, shared)
    ref_ids, ref_weights = route(logits[:, :num_experts], top_k, norm)
    if shared:
        ref_ids, ref_weights = with_shared_slot(ref_ids, ref_weights, logits[:, num_experts:], num_experts)
        assert bool((ids[:, -1] == num_experts).all())  # the slot is the last: the parts' order
    # Ids are a set per token: compare them, and the weights, in id order.
    ids_sorted, order = ids.long().sort(-1)
    ref_sorted, ref_order = ref_ids.sort(-1)
    weight_error = float((weights.gather(1, order) - ref_weights.gather(1, ref_order)).abs().max())
    # align of the kernel's own ids (slot order matters to the pair numbers): every array must be align's.
    aligned = align(ids, num_experts + shared, block_m, num_blocks)
    same = all(torch.equal(a, b) for a, b in zip((sorted_ids, block_expert, used), aligned, strict=True))
    return [float(not torch.equal(ids_sorted, ref_sorted)), weight_error, float(not same)]


def kernel_results() -> list[float]:
    poison_empty()
    results = []
    for tokens in (1, 3, 8, 64):
        for num_experts in (8, 32, 128):
            for top_k in (2, 8):
                g = torch.Generator().manual_seed(tokens * 1000 + num_experts * 10 + top_k)
                logits = torch.randn(tokens, num_experts + 1, generator=g)  # the merged router's: the shared gate last
                norm = bool((tokens + top_k) % 2)
                block_m = (16, 32, 64)[(tokens + num_experts) % 3]
                results += compare(logits[:, :num_experts], top_k, norm, block_m)  # a strided view
                results += compare(logits, top_k, norm, block_m, shared=True)
    # Sizes that are not powers of two: padded experts and slots; several token tiles (128 experts: 32 a tile).
    g = torch.Generator().manual_seed(7)
    results += compare(torch.randn(5, 48, generator=g), 10, True, 16)
    results += compare(torch.randn(100, 128, generator=g) * 3, 10, False, 32)
    results += compare(torch.randn(100, 129, generator=g) * 3, 7, False, 16, shared=True)  # top_k + 1 a power of 2
    return results


def test_route_and_align_give_route_and_aligns_values_in_the_interpreter():
    results = run_interpreted("from test_kernel_route import kernel_results\nprint(*kernel_results(), sep='\\n')")
    ids_differ, weight_errors, arrays_differ = results[0::3], results[1::3], results[2::3]
    assert len(ids_differ) == 51
    assert ids_differ == [0.0] * 51 and arrays_differ == [0.0] * 51
    assert max(weight_errors) <= 1e-6


def tie_results() -> list[float]:
    """Logits from few values (many ties): ids must be the lowest-id top-k, in descending order."""
    from engine.ops.triton_moe import num_blocks_for
    from engine.ops.triton_route import route_and_align

    poison_empty()
    g = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 3, (9, 32), generator=g).float()
    logits[0] = 1.0  # every expert tied
    probs = torch.softmax(logits, -1)
    want = probs.sort(dim=-1, descending=True, stable=True).indices[:, :6]  # stable: lower id first among equals
    ids, weights, *_ = route_and_align(logits, 6, False, 16, num_blocks_for(54, 32, 16))
    return [float(not torch.equal(ids.long(), want)), float((weights - probs.gather(1, want)).abs().max())]


def test_ties_go_to_the_lower_expert_id_in_the_interpreter():
    ids_differ, weight_error = run_interpreted("from test_kernel_route import tie_results\n"
                                               "print(*tie_results(), sep='\\n')")
    assert ids_differ == 0.0 and weight_error <= 1e-7


def test_the_bound_picks_decode_sized_batches():
    from engine.ops.triton_route import fits_one_launch

    assert fits_one_launch(1, 512, 10) and fits_one_launch(64, 512, 10) and fits_one_launch(128, 32, 8)
    assert not fits_one_launch(65, 512, 10)  # more token tiles than one program should loop over
    assert not fits_one_launch(129, 32, 8)  # more pairs than MAX_PAIRS
    assert not fits_one_launch(0, 32, 8) and not fits_one_launch(4, 8, 9)
    # The shared expert's slot is one more pair a token, not one more expert to tile.
    assert fits_one_launch(93, 32, 10, shared=True) and not fits_one_launch(94, 32, 10, shared=True)
    assert fits_one_launch(94, 32, 10) and fits_one_launch(8, 4096, 10, shared=True)  # E + 1 > TILE: not tiled


def moe_layer(num_experts: int, top_k: int, norm: bool, shared: int, hidden: int = 64, seed: int = 0) -> SparseMoE:
    torch.manual_seed(seed)
    moe = SparseMoE(hidden, num_experts, top_k, 32, norm_topk_prob=norm, shared_intermediate_size=shared)
    for param in moe.parameters():
        nn.init.normal_(param, std=0.3)
    return moe


def layer_errors() -> list[float]:
    """The layer on the Triton path (forced on for fp32 CPU) against its float64 expert loop: routing in one launch,
    and once (400 tokens) route + align; a shared expert of the experts' width (32) runs as slot E. Parts summed."""
    from engine.layers.moe import Experts

    poison_empty()
    Experts.runs_triton = lambda self, x: x.dtype == torch.float32  # the interpreter serves fp32 CPU tensors
    results = []
    for tokens, num_experts, top_k, norm, shared in ((1, 8, 2, True, 48), (5, 32, 8, False, 0), (37, 8, 2, True, 0),
                                                     (64, 128, 8, True, 48), (1, 8, 2, True, 32),
                                                     (64, 128, 8, False, 32), (400, 8, 2, True, 32)):
        moe = moe_layer(num_experts, top_k, norm, shared, seed=tokens)
        double = copy.deepcopy(moe).double()
        moe.merge_projections()  # the router's logits as a strided view of the merged GEMV's
        x = torch.randn(tokens, 64)
        assert moe.experts.routes_in_one_launch(x, top_k) == (tokens < 400)
        with torch.no_grad():
            ours = moe(x)
            ref = double(x.double())
        slots = top_k + (shared == 32)
        if shared == 48:  # a shared expert of its own width runs as its own MLP: the layer sums
            assert ours.shape == x.shape
        else:
            assert ours.shape == (tokens, slots, 64)
            ours = ours.double().sum(1)
        results.append(float((ours.double() - ref).norm() / ref.norm()))
    return results


def test_the_layer_on_the_triton_path_matches_the_expert_loop_in_the_interpreter():
    errors = run_interpreted("from test_kernel_route import layer_errors\nprint(*layer_errors(), sep='\\n')")
    assert len(errors) == 7 and max(errors) <= FP32


# --- on a GPU: Qwen3-Next's sizes in bf16 ---------------------------------------------------------------------------


def distinct_logits(tokens: int, num_experts: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """Distinct logits a row, exact in bf16 (a tie could pick either expert on either path): consecutive bf16 values
    from 0.25 up (128 a binade), shuffled per row."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.arange(num_experts) + 0x3E80).to(torch.int16).view(torch.bfloat16)
    return values[torch.rand(tokens, num_experts, generator=g).argsort(-1)].to(device)


@cuda
def test_route_and_align_on_the_gpu():
    import test_kernel_route as me

    for tokens, num_experts, top_k in ((1, 512, 10), (16, 512, 10), (64, 512, 10), (128, 32, 8), (7, 128, 8)):
        for block_m in (16, 32, 64):
            logits = distinct_logits(tokens, num_experts, seed=tokens + block_m)
            ids_differ, weight_error, arrays_differ = me.compare(logits, top_k, True, block_m)
            assert ids_differ == 0.0 and arrays_differ == 0.0, (tokens, num_experts, top_k, block_m)
            assert weight_error <= 1e-2 * float(logits.float().softmax(-1).max()), (tokens, num_experts)
            if tokens * (top_k + 1) > 1024:
                continue
            shared_gate = torch.randn(tokens, 1, device="cuda").bfloat16()
            ids_differ, weight_error, arrays_differ = me.compare(torch.cat([logits, shared_gate], 1), top_k, True,
                                                                 block_m, shared=True)
            assert ids_differ == 0.0 and arrays_differ == 0.0, (tokens, num_experts, top_k, block_m)
            assert weight_error <= 1e-2, (tokens, num_experts)  # the sigmoid weight, up to 1, rounded to bf16


def gpu_layer(num_experts: int, top_k: int, seed: int) -> tuple[SparseMoE, SparseMoE]:
    """(bf16, fp32) copies of a layer at hidden 2048 whose router reads x's first E features as the logits (exact in
    either dtype, so both copies route alike when those features are distinct). The shared expert has the experts'
    width (Qwen3-Next's 512): merged, it is expert E."""
    torch.manual_seed(seed)
    fp32 = SparseMoE(2048, num_experts, top_k, 512, norm_topk_prob=True, shared_intermediate_size=512).cuda()
    for param in fp32.parameters():
        nn.init.normal_(param, std=0.02)
    fp32.gate.weight.data.zero_()
    fp32.gate.weight.data[:, :num_experts] = torch.eye(num_experts, device="cuda")
    bf16 = copy.deepcopy(fp32).bfloat16()
    for moe in (fp32, bf16):
        moe.merge_projections()
    assert bf16.experts.has_shared_slot
    return bf16, fp32


def gpu_input(tokens: int, num_experts: int, seed: int) -> torch.Tensor:
    x = torch.randn(tokens, 2048, generator=torch.Generator().manual_seed(seed)).cuda().bfloat16()
    x[:, :num_experts] = distinct_logits(tokens, num_experts, seed)
    return x


def summed(parts: torch.Tensor) -> torch.Tensor:
    """The layer's output from its Triton path's parts [tokens, top_k + 1, hidden], in float32 on the CPU."""
    assert parts.dim() == 3
    return parts.float().sum(1).cpu()


@cuda
def test_the_layer_in_bf16_on_the_gpu():
    for num_experts, top_k, tokens in ((512, 10, 1), (512, 10, 16), (128, 8, 64), (32, 8, 112), (512, 10, 300)):
        bf16, fp32 = gpu_layer(num_experts, top_k, seed=tokens)
        x = gpu_input(tokens, num_experts, seed=tokens)
        assert bf16.experts.routes_in_one_launch(x, top_k) == (tokens < 300)  # 300: route + align, then the slot
        with torch.inference_mode():
            ours = bf16(x)
            ref = fp32(x.float())  # fp32 on CUDA runs route + the expert loop + the gated shared MLP
        assert ours.shape == (tokens, top_k + 1, 2048) and torch.isfinite(ours).all()
        assert relative_error(summed(ours), ref.cpu()) <= BF16, (num_experts, tokens)


@cuda
@pytest.mark.parametrize("tokens", [1, 8])
def test_the_layer_replays_in_a_cuda_graph(tokens):
    bf16, fp32 = gpu_layer(512, 10, seed=1)
    static = gpu_input(tokens, 512, seed=0)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile outside the capture
            for _ in range(2):
                bf16(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = bf16(static)
        for seed in (11, 12):
            static.copy_(gpu_input(tokens, 512, seed))
            graph.replay()
            torch.cuda.synchronize()
            ref = fp32(static.float())
            assert relative_error(summed(out), ref.cpu()) <= BF16


@cuda
@pytest.mark.parametrize("tokens", [1, 8])
def test_a_layer_with_the_shared_slot_is_four_kernels(tokens):
    """The router GEMV, route_and_align, gate_up and down: no shared-expert kernels, no top-k sum."""
    bf16, _ = gpu_layer(512, 10, seed=2)
    x = gpu_input(tokens, 512, seed=2)
    with torch.inference_mode():
        for _ in range(2):  # Triton's compile outside the profile
            bf16(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            bf16(x)
            torch.cuda.synchronize()
    kernels = [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    for ours in ("_route_align_kernel", "_gate_up_kernel", "_down_kernel"):
        assert sum(ours in name for name in kernels) == 1, (ours, kernels)
    assert len(kernels) <= 4, kernels  # the fourth is the router's GEMV
