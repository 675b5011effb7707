"""The routing kernels (engine/ops/triton_route.py), the router's GEMV split over hidden chunks before them
(engine/ops/triton_router.py), and the MoE layer that uses them.

CPU, under Triton's interpreter: the router's partials (their sum over 1 to 16 chunks, chunks narrower for a wide
router, hidden sizes not a multiple of a chunk) against x @ W^T in float64; the kernels against `route` + `align` (the
same experts a token, the same weights, and exactly align's arrays, so align's invariants hold), from logits and from
x and the router's weight (against route + align of x @ W^T in float32: dyadic values make those logits exact in any
summation order, so no near-tie can flip), with and without the shared expert's slot, in one routing launch (one tile
of tokens) and in two; the tie rule; NaN rows; the whole layer on each path (its parts summed) against the float64
expert loop, with no router GEMV when the kernels compute the logits. Outputs come from torch.empty filled with NaN /
the largest integer (torch's fill_uninitialized_memory), so an unwritten element fails. The CPU runs float32 only
(Triton 3.6's interpreter multiplies bf16 tl.dot operands as raw bits). CUDA (the lead's H200): bf16 at the real
models' sizes, the partials against float64, the layer against fp32, the layer inside a CUDA graph, and its kernel
count.
"""

import copy
import math

import pytest
import torch

from tests.support.engine_checkpoints import relative_error
from tests.support.interpret import run_interpreted
from tests.support.moe_layers import (
    BF16,
    decoder_layer,
    distinct_logits,
    gpu_input,
    gpu_layer,
    moe_layer,
    poison_empty,
    summed,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP32 = 1e-5


def exact_router(tokens: int, hidden: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, hidden] and a router weight [rows, hidden] (rows <= 65) whose logits are exact in float32 (and in
    bf16 inputs) in any summation order and distinct a token: the products lie on a grid of 2^-(6 + shift), and
    feature 0 adds expert e's e / 64 of a grid step. `shift` keeps the logits' spread near hidden 64's."""
    g = torch.Generator().manual_seed(seed)
    shift = max(0, round(math.log2(hidden / 64) / 2))
    x = torch.randint(-4, 5, (tokens, hidden), generator=g) / 4
    weight = torch.randint(-8, 9, (rows, hidden), generator=g) / 2 ** (4 + shift)
    x[:, 0] = 1
    weight[:, 0] = torch.arange(rows) / 2 ** (12 + shift)
    return x, weight


def compare(source: torch.Tensor, top_k: int, norm: bool, block_m: int, shared: bool = False,
            weight: torch.Tensor | None = None) -> list[float]:
    """[ids differ, weight error, aligned arrays differ] of route_and_align against route + align (with `shared`,
    the logits' last column is the shared gate's: against route + with_shared_slot + align over E + 1 experts).
    `source` is the logits, or with `weight` the x the kernel multiplies by it (the reference: x @ weight^T, fp32)."""
    from engine.layers.moe import route, with_shared_slot
    from engine.ops.triton_moe import align, num_blocks_for
    from engine.ops.triton_route import route_and_align

    logits = source if weight is None else source.float() @ weight.float().T
    tokens, num_experts = logits.shape[0], logits.shape[1] - shared
    num_blocks = num_blocks_for(tokens * (top_k + shared), num_experts + shared, block_m)
    ids, weights, sorted_ids, block_expert, used = route_and_align(source, top_k, norm, block_m, num_blocks, shared,
                                                                   router_weight=weight)
    ref_ids, ref_weights = route(logits[:, :num_experts], top_k, norm)
    if shared:
        ref_ids, ref_weights = with_shared_slot(ref_ids, ref_weights, logits[:, num_experts:], num_experts)
        assert bool((ids[:, -1] == num_experts).all())  # the slot is the last: the parts' order
    # Ids are a set per token: compare them, and the weights, in id order.
    ids_sorted, order = ids.long().sort(-1)
    ref_sorted, ref_order = ref_ids.sort(-1)
    weight_error = float((weights.gather(1, order).float() - ref_weights.gather(1, ref_order).float()).abs().max())
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
    # Sizes that are not powers of two: padded experts and slots; many token tiles (7, 19; with 512 experts 13 tiles
    # of 8, summed 8 tiles' counts at a time), sentinel fills that take several rounds of every program.
    g = torch.Generator().manual_seed(7)
    results += compare(torch.randn(5, 48, generator=g), 10, True, 16)
    results += compare(torch.randn(100, 128, generator=g) * 3, 10, False, 32)
    results += compare(torch.randn(100, 129, generator=g) * 3, 7, False, 16, shared=True)  # top_k + 1 a power of 2
    results += compare(torch.randn(300, 33, generator=g), 8, True, 64, shared=True)
    results += compare(torch.randn(100, 513, generator=g) * 3, 10, True, 16, shared=True)
    return results


def assert_interpreted_cases_match(results: str, cases: int) -> None:
    """Run `results` (a function of this module returning compare()'s triples) under the interpreter: every case with
    route's ids, align's arrays and route's weights."""
    values = run_interpreted(f"from tests.engine.test_kernel_route import {results}\nprint(*{results}(), sep='\\n')")
    ids_differ, weight_errors, arrays_differ = values[0::3], values[1::3], values[2::3]
    assert len(ids_differ) == cases
    assert ids_differ == [0.0] * cases and arrays_differ == [0.0] * cases
    assert max(weight_errors) <= 1e-6


def test_route_and_align_give_route_and_aligns_values_in_the_interpreter():
    assert_interpreted_cases_match("kernel_results", 53)


def partials_results() -> list[float]:
    """The router's partials [chunks, tokens, E (+1)]: [relative error of their sum against x @ W^T in float64, chunks
    as router_chunks says, the chunks] a case; one chunk to 16 (hidden 2048), hidden sizes not a multiple of a chunk,
    more than one token tile, a router wide enough (128 padded experts) for narrower chunks, strided x."""
    from engine.ops.triton_router import router_chunks, router_partials

    poison_empty()
    results = []
    for tokens, num_experts, shared, hidden in ((1, 32, True, 2048), (40, 32, True, 300), (17, 8, True, 48),
                                                (20, 100, False, 256), (3, 16, False, 600)):
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, 2 * hidden, generator=g)[:, ::2]
        weight = torch.randn(num_experts + shared, hidden, generator=g)
        partials = router_partials(x, weight, shared)
        ref = x.double() @ weight.double().T
        chunks = router_chunks(num_experts, hidden)
        results += [float((partials.double().sum(0) - ref).norm() / ref.norm()),
                    float(partials.shape == (chunks, tokens, num_experts + shared)), float(chunks)]
    return results


def test_the_router_partials_sum_to_the_logits_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_route import partials_results\n"
                              "print(*partials_results(), sep='\\n')")
    errors, shapes_right, chunks = results[0::3], results[1::3], results[2::3]
    assert len(errors) == 5 and max(errors) <= FP32
    assert shapes_right == [1.0] * 5
    assert min(chunks) == 1 and len(set(chunks)) >= 4 and chunks[0] >= 8  # hidden 2048: 16 chunks of 128 today


def gemv_results() -> list[float]:
    """The logits from x and the weight (the router's partials, summed by the routing launch): one tile (<= 16 tokens)
    and several, one hidden chunk and several (up to 16: Qwen3-Next's hidden 2048), hidden sizes that are not a
    multiple of a chunk, the routed rows of a merged weight, strided x and weight."""
    poison_empty()
    results = []
    for tokens, num_experts, top_k, hidden, block_m in ((1, 32, 8, 64, 16), (5, 8, 2, 80, 32), (16, 32, 8, 600, 16),
                                                        (17, 64, 8, 64, 64), (64, 32, 8, 256, 32),
                                                        (200, 16, 4, 48, 16), (1, 32, 8, 2048, 16),
                                                        (40, 32, 8, 300, 32)):
        x, weight = exact_router(tokens, 2 * hidden, num_experts + 1, seed=tokens)
        x, weight = x[:, ::2], weight[:, ::2]  # strided: the kernel takes strides (feature 0 still leads)
        norm = bool(tokens % 2)
        results += compare(x, top_k, norm, block_m, shared=True, weight=weight)
        results += compare(x, top_k, norm, block_m, weight=weight[:num_experts].t().contiguous().t())
    return results


def test_the_router_gemv_inside_the_routing_kernels_gives_route_and_aligns_values_in_the_interpreter():
    assert_interpreted_cases_match("gemv_results", 16)


def tie_results() -> list[float]:
    """Logits from few values (many ties): ids must be the lowest-id top-k, in descending order; from logits in one
    tile, then across 3 tiles, then computed from x and a weight whose rows repeat (exact ties among their logits)."""
    from engine.ops.triton_moe import num_blocks_for
    from engine.ops.triton_route import route_and_align

    poison_empty()
    g = torch.Generator().manual_seed(3)
    x, distinct = exact_router(40, 64, 3, seed=3)
    weight = distinct[torch.randint(0, 3, (32,), generator=g)]  # three logit values a token
    cases = [(torch.randint(0, 3, (9, 32), generator=g).float(), None),
             (torch.randint(0, 3, (40, 32), generator=g).float(), None), (x, weight)]
    cases[0][0][0] = 1.0  # every expert tied
    results = []
    for source, router_weight in cases:
        logits = source if router_weight is None else source @ router_weight.T
        probs = torch.softmax(logits, -1)
        want = probs.sort(dim=-1, descending=True, stable=True).indices[:, :6]  # stable: lower id first among equals
        tokens = logits.shape[0]
        ids, weights, *_ = route_and_align(source, 6, False, 16, num_blocks_for(tokens * 6, 32, 16),
                                           router_weight=router_weight)
        results += [float(not torch.equal(ids.long(), want)), float((weights - probs.gather(1, want)).abs().max())]
    return results


def test_ties_go_to_the_lower_expert_id_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_route import tie_results\n"
                              "print(*tie_results(), sep='\\n')")
    assert len(results) == 6
    assert results[0::2] == [0.0] * 3 and max(results[1::2]) <= 1e-6


def nan_results() -> list[float]:
    """A token with a NaN feature (x and a weight) or a NaN logit, among 20: its routed weights are NaN, its ids
    distinct experts, every array is still align's of the ids, and the other tokens route as without it."""
    from engine.ops.triton_moe import align, num_blocks_for
    from engine.ops.triton_route import route_and_align

    poison_empty()
    x, weight = exact_router(20, 64, 17, seed=5)
    logits = x @ weight.T
    x[3, 7] = float("nan")
    logits[3, 2] = float("nan")
    results = []
    for source, router_weight in ((x, weight), (logits, None)):
        num_blocks = num_blocks_for(20 * 5, 17, 16)
        ids, weights, *arrays = route_and_align(source, 4, True, 16, num_blocks, True, router_weight=router_weight)
        rest = torch.arange(20) != 3
        ref_ids, ref_weights, *_ = route_and_align(source[rest], 4, True, 16, num_blocks_for(19 * 5, 17, 16), True,
                                                   router_weight=router_weight)
        results += [float(weights[3, :4].isnan().all()), float(ids[3, :4].unique().numel() == 4),
                    float(bool((ids[3] >= 0).all() and (ids[3] <= 16).all())),
                    float(all(torch.equal(a, b) for a, b in zip(arrays, align(ids, 17, 16, num_blocks), strict=True))),
                    float(torch.equal(ids[rest], ref_ids) and torch.equal(weights[rest], ref_weights))]
    return results


def test_a_nan_row_gets_nan_weights_and_distinct_ids_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_route import nan_results\n"
                              "print(*nan_results(), sep='\\n')")
    assert results == [1.0] * 10


def test_the_bounds_pick_decode_sized_batches_and_small_routers():
    from engine.ops.triton_route import fits_routing_kernels
    from engine.ops.triton_router import fits_router_gemv

    assert fits_routing_kernels(1, 32, 8) and fits_routing_kernels(512, 32, 8)  # every decode graph (LADDER's top)
    assert not fits_routing_kernels(513, 32, 8)  # a prefill: route + align
    assert fits_routing_kernels(1, 512, 10) and fits_routing_kernels(256, 512, 10)  # 32 tiles of 8 x 512 counts
    assert not fits_routing_kernels(257, 512, 10)  # more counts than each placing program should sum
    assert not fits_routing_kernels(0, 32, 8) and not fits_routing_kernels(4, 8, 9)
    assert fits_routing_kernels(4, 4096, 10) and not fits_routing_kernels(5, 4096, 10)  # tiles of one token
    assert not fits_routing_kernels(1, 4097, 10)
    # The GEMV inside: Qwen3-Next's router (32 experts, the shared gate's row aside) at hidden 2048, not 512 experts.
    assert fits_router_gemv(32, 2048) and fits_router_gemv(64, 2048) and not fits_router_gemv(65, 2048)
    assert not fits_router_gemv(512, 2048) and not fits_router_gemv(512, 64)  # 16 x 512 logits: more than a tile
    assert fits_router_gemv(32, 4096) and not fits_router_gemv(32, 4097)  # 32 chunks of 32 partials a token, not 33


def layer_errors() -> list[float]:
    """The layer on the Triton path (forced on for fp32 CPU) against its float64 expert loop, parts summed: the logits
    computed inside the routing kernels (a merged layer whose shared expert of the experts' width, 32, is slot E; a
    layer without a shared expert), from F.linear into them (a shared expert of its own width, 48; an unmerged layer;
    512 experts, too many for the GEMV inside) and once (600 tokens) route + align. Then the F.linear calls of each
    forward: none when the kernel computes the logits."""
    from engine.layers.moe import Experts

    poison_empty()
    Experts.runs_triton = lambda self, x: x.dtype == torch.float32  # the interpreter serves fp32 CPU tensors
    linear = torch.nn.functional.linear
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return linear(*args, **kwargs)

    results, linear_calls = [], []
    for tokens, num_experts, top_k, norm, shared, merged in (
            (1, 8, 2, True, 32, True), (37, 8, 2, True, 32, True), (64, 32, 8, False, 32, True),
            (5, 32, 8, False, 0, True), (1, 8, 2, True, 48, True), (64, 128, 8, True, 48, True),
            (5, 8, 2, True, 32, False), (9, 512, 10, True, 32, True), (600, 8, 2, True, 32, True)):
        moe = moe_layer(num_experts, top_k, norm, shared, seed=tokens)
        double = copy.deepcopy(moe).double()
        if merged:
            moe.merge_projections()  # the router's logits as a strided view of the merged GEMV's
        x = torch.randn(tokens, 64)
        in_kernel = (shared == 32 and merged or not shared) and num_experts <= 64 and tokens <= 512
        assert (moe.kernel_router(x) is not None) == in_kernel
        assert moe.experts.routes_in_kernels(x, top_k) == (tokens <= 512)
        with torch.no_grad():
            torch.nn.functional.linear, calls[0] = counted, 0
            ours = moe(x)
            torch.nn.functional.linear = linear
            if in_kernel:
                linear_calls.append(float(calls[0]))
            ref = double(x.double())
        slots = top_k + (shared == 32 and merged)
        if shared == 48 or not merged and shared:  # a shared expert that is not a slot runs as its own MLP
            assert ours.shape == x.shape
        else:
            assert ours.shape == (tokens, slots, 64)
            ours = ours.double().sum(1)
        results.append(float((ours.double() - ref).norm() / ref.norm()))
    return results + linear_calls


def test_the_layer_on_the_triton_path_matches_the_expert_loop_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_route import layer_errors\n"
                              "print(*layer_errors(), sep='\\n')")
    errors, linear_calls = results[:9], results[9:]
    assert len(errors) == 9 and max(errors) <= FP32
    assert linear_calls == [0.0] * 4  # the router's GEMV is the routing kernels' partials: no F.linear


# --- on a GPU: the real models' sizes in bf16 (hidden 2048; 32 experts top-8 and 512 top-10, a shared expert) ------


@cuda
def test_route_and_align_on_the_gpu():
    from tests.engine import test_kernel_route as me

    # From logits: one launch (a tile: 16 tokens, 8 at 512 experts) and two, up to the bounds.
    for tokens, num_experts, top_k in ((1, 512, 10), (16, 512, 10), (64, 512, 10), (256, 512, 10), (128, 32, 8),
                                       (7, 128, 8), (512, 32, 8)):
        for block_m in (16, 32, 64):
            logits = distinct_logits(tokens, num_experts, seed=tokens + block_m)
            ids_differ, weight_error, arrays_differ = me.compare(logits, top_k, True, block_m)
            assert ids_differ == 0.0 and arrays_differ == 0.0, (tokens, num_experts, top_k, block_m)
            assert weight_error <= 1e-2 * float(logits.float().softmax(-1).max()), (tokens, num_experts)
            shared_gate = torch.randn(tokens, 1, device="cuda").bfloat16()
            ids_differ, weight_error, arrays_differ = me.compare(torch.cat([logits, shared_gate], 1), top_k, True,
                                                                 block_m, shared=True)
            assert ids_differ == 0.0 and arrays_differ == 0.0, (tokens, num_experts, top_k, block_m)
            assert weight_error <= 1e-2, (tokens, num_experts)  # the sigmoid weight, up to 1, rounded to bf16
    # From x and the merged router [33, 2048]: the logits in the kernel (bf16 products, float32 sums) against x @ W^T
    # in float32, both exact by construction.
    for tokens in (1, 8, 16, 17, 64, 256, 512):
        x, weight = (t.cuda().bfloat16() for t in exact_router(tokens, 2048, 33, seed=tokens))
        for block_m in (16, 32, 64):
            for shared in (True, False):
                ids_differ, weight_error, arrays_differ = me.compare(x, 8, True, block_m, shared,
                                                                     weight=weight[:32 + shared])
                assert ids_differ == 0.0 and arrays_differ == 0.0, (tokens, block_m, shared)
                assert weight_error <= 1e-2, (tokens, block_m, shared)  # weights rounded to bf16


@cuda
def test_the_router_partials_on_the_gpu():
    """The merged router [33, 2048] in bf16 (and its 32 routed rows): the partials' sum against x @ W^T in float64
    (bf16 products are exact in float32: only the summation order differs), one tile of tokens and many."""
    from engine.ops.triton_router import router_chunks, router_partials

    for tokens in (1, 16, 64, 512):
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, 2048, generator=g).bfloat16()
        weight = (torch.randn(33, 2048, generator=g) * 0.02).bfloat16()
        for shared in (True, False):
            rows = weight[:32 + shared]
            partials = router_partials(x.cuda(), rows.cuda(), shared)
            assert partials.shape == (router_chunks(32, 2048), tokens, 32 + shared)
            ref = x.double() @ rows.double().T
            assert relative_error(partials.double().sum(0).cpu(), ref) <= FP32, (tokens, shared)


@cuda
def test_the_layer_in_bf16_on_the_gpu():
    # (experts, top_k, tokens, the logits computed in the routing kernel, the routing kernels at all)
    for num_experts, top_k, tokens, in_kernel, kernels in (
            (32, 8, 1, True, True), (32, 8, 16, True, True), (32, 8, 64, True, True), (32, 8, 512, True, True),
            (32, 8, 600, False, False), (512, 10, 1, False, True), (512, 10, 16, False, True),
            (128, 8, 64, False, True), (512, 10, 300, False, False)):
        bf16, fp32 = gpu_layer(num_experts, top_k, seed=tokens)
        x = gpu_input(tokens, num_experts, seed=tokens)
        assert (bf16.kernel_router(x) is not None) == in_kernel, (num_experts, tokens)
        assert bf16.experts.routes_in_kernels(x, top_k) == kernels, (num_experts, tokens)  # else route + align
        with torch.inference_mode():
            ours = bf16(x)
            ref = fp32(x.float())  # fp32 on CUDA runs route + the expert loop + the gated shared MLP
        assert ours.shape == (tokens, top_k + 1, 2048) and torch.isfinite(ours).all()
        assert relative_error(summed(ours), ref.cpu()) <= BF16, (num_experts, tokens)


@cuda
@pytest.mark.parametrize(("num_experts", "top_k", "tokens"), [(32, 8, 1), (32, 8, 64), (512, 10, 1), (512, 10, 8)])
def test_the_layer_replays_in_a_cuda_graph(num_experts, top_k, tokens):
    """The routing launches in the graph: with 32 experts the router's partials, then routing (and placing at 64
    tokens); with 512 the router's cuBLAS GEMV, then routing."""
    bf16, fp32 = gpu_layer(num_experts, top_k, seed=1)
    static = gpu_input(tokens, num_experts, seed=0)
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
            static.copy_(gpu_input(tokens, num_experts, seed))
            graph.replay()
            torch.cuda.synchronize()
            ref = fp32(static.float())
            assert relative_error(summed(out), ref.cpu()) <= BF16


def layer_kernels(num_experts: int, top_k: int, tokens: int, in_decoder: bool = False) -> list[str]:
    """The CUDA kernels one forward of the bf16 layer launches, compiled first; `in_decoder`: of a decoder layer
    around it (after a residual), whose mixer passes its input through (no kernels of its own)."""
    bf16, _ = gpu_layer(num_experts, top_k, seed=2)
    x = gpu_input(tokens, num_experts, seed=2)
    if in_decoder:
        layer = decoder_layer(bf16, one_centred=True, seed=2)
        layer.self_attn.forward = lambda hidden, step: hidden
        residual = torch.randn_like(x)  # written in place by the input norm at each call: its kernels stay the same

        def forward():
            return layer(x, residual, None)
    else:
        def forward():
            return bf16(x)
    with torch.inference_mode():
        for _ in range(2):  # Triton's compile outside the profile
            forward()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            forward()
            torch.cuda.synchronize()
    return [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@cuda
@pytest.mark.parametrize(("tokens", "launches"), [(1, 4), (16, 4), (64, 5), (512, 5)])
def test_a_layer_with_the_router_inside_is_four_kernels_up_to_a_tile(tokens, launches):
    """32 experts: the router's partials, the routing launch (summing them), gate_up and down; past one tile of 16
    tokens the placing launch too. No cuBLAS router GEMV, no shared-expert kernels, no top-k sum. (The layer's norm
    joins the partials' launch in a decoder layer: the next test.)"""
    kernels = layer_kernels(32, 8, tokens)
    for ours in ("_router_partials_kernel", "_route_kernel", "_gate_up_kernel", "_down_kernel"):
        assert sum(ours in name for name in kernels) == 1, (ours, kernels)
    assert sum("_place_kernel" in name for name in kernels) == launches - 4, kernels
    assert len(kernels) == launches, kernels


@cuda
@pytest.mark.parametrize(("tokens", "launches"), [(1, 4), (16, 4), (64, 5), (512, 5)])
def test_a_decoder_layers_moe_norm_rides_in_the_router_launch(tokens, launches):
    """The decoder layer around it: its input norm (one _rms_norm_kernel), then the post-attention norm inside the
    router's partials launch: the MoE's launches and no norm kernel of its own (one launch fewer than before)."""
    kernels = layer_kernels(32, 8, tokens, in_decoder=True)
    assert sum("_rms_norm_kernel" in name for name in kernels) == 1, kernels
    for ours in ("_router_partials_kernel", "_route_kernel", "_gate_up_kernel", "_down_kernel"):
        assert sum(ours in name for name in kernels) == 1, (ours, kernels)
    assert len(kernels) == 1 + launches, kernels


@cuda
@pytest.mark.parametrize("tokens", [1, 8])
def test_a_layer_with_a_large_router_is_its_gemv_and_three_kernels(tokens):
    """512 experts: the router's GEMV (cuBLAS: up to 3 kernels at batch 1), then the routing launch (one tile of 8),
    gate_up and down."""
    kernels = layer_kernels(512, 10, tokens)
    for ours in ("_route_kernel", "_gate_up_kernel", "_down_kernel"):
        assert sum(ours in name for name in kernels) == 1, (ours, kernels)
    assert not any("_place_kernel" in name or "_router_partials_kernel" in name for name in kernels)
    assert len(kernels) <= 6, kernels
