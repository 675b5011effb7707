"""The fused MoE path (engine/ops/triton_moe.py), the shared expert as expert E, and the merged projections.

CPU: align's sorted, padded expert runs; each Triton kernel and the whole fused path (its parts summed, with and without
the shared expert as one more slot) under Triton's interpreter against the float64 expert loop (outputs poisoned with
NaN first, so an unwritten element fails); merged equals unmerged, and merging keeps every parameter's name, shape and
values as views of the merged storage. CUDA (the lead's H200): the bf16 kernels against the fp32 loop at the reference
model's sizes, and inside a CUDA graph.
"""

import pytest
import torch
from torch import nn

from engine.layers.merge import merge_projections
from engine.layers.mlp import GatedMLP
from engine.layers.moe import Experts, SparseMoE
from tests.support.engine_checkpoints import relative_error
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16 = 1e-2
FP32 = 1e-5


def distinct_ids(tokens: int, num_experts: int, top_k: int, seed: int) -> torch.Tensor:
    """Top-k ids as the router gives them: distinct per token."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, num_experts, generator=g).topk(top_k, dim=-1).indices


def moe_case(tokens: int, seed: int, ids: torch.Tensor | None = None, num_experts=8, hidden=64, inter=32, top_k=3):
    """Experts, x (a strided view: the kernels take strides), ids, weights; fp32."""
    g = torch.Generator().manual_seed(seed)
    experts = Experts(num_experts, hidden, inter)
    experts.gate_up_proj.data.normal_(generator=g)
    experts.down_proj.data.normal_(generator=g)
    x = torch.randn(tokens, 2 * hidden, generator=g)[:, ::2]
    ids = distinct_ids(tokens, num_experts, top_k, seed) if ids is None else ids
    weights = torch.rand(ids.shape, generator=g)
    return experts, x, ids, weights


def reference(experts: Experts, x, ids, weights) -> torch.Tensor:
    double = Experts(experts.num_experts, x.shape[1], experts.down_proj.shape[2]).double()
    double.gate_up_proj.data.copy_(experts.gate_up_proj.data)
    double.down_proj.data.copy_(experts.down_proj.data)
    with torch.no_grad():
        return double.looped(x.double(), ids, weights.double())


def norm_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref.double()).norm() / ref.double().norm())


def edge_cases() -> list[tuple[str, torch.Tensor]]:
    return [
        ("one expert takes every pair", torch.full((37, 1), 5)),
        ("three experts take every token", torch.tensor([[2, 0, 1]] * 40)),  # runs longer than any block
        ("most experts unhit", torch.tensor([[6, 1, 4], [4, 6, 1]])),
    ]


# --- align (tensor ops: runs on CPU as is) -----------------------------------------------------------------------


def check_align(ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    from engine.ops.triton_moe import align, num_blocks_for

    num_pairs = ids.numel()
    num_blocks = num_blocks_for(num_pairs, num_experts, block_m)
    sorted_ids, block_expert, used = align(ids, num_experts, block_m, num_blocks)
    assert sorted_ids.shape == (num_blocks * block_m,) and block_expert.shape == (num_blocks,)
    real = sorted_ids < num_pairs
    assert torch.equal(sorted_ids[real].sort().values, torch.arange(num_pairs, dtype=torch.int32))  # each pair once
    assert bool((sorted_ids[~real] == num_pairs).all())  # padding holds exactly the sentinel
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts)
    used_blocks = int(((counts + block_m - 1) // block_m).sum())
    assert int(used) == used_blocks * block_m
    assert bool((block_expert[used_blocks:] == -1).all()) and not bool(real[used_blocks * block_m:].any())
    blocks = sorted_ids[:used_blocks * block_m].view(used_blocks, block_m)
    seen = []
    for block, expert in zip(blocks, block_expert[:used_blocks].tolist(), strict=True):
        pairs = block[block < num_pairs].long()
        assert pairs.numel() > 0 and bool((flat[pairs] == expert).all())  # one expert per block, none empty
        assert bool((block[:pairs.numel()] < num_pairs).all())  # real pairs first, padding after
        seen.append(expert)
    # Each hit expert's run is contiguous, in expert order, padded to whole blocks.
    assert seen == sorted(seen)
    assert all(seen.count(e) == -(-int(counts[e]) // block_m) for e in range(num_experts))


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_align_pads_one_run_per_expert_and_keeps_every_pair_once(block_m):
    pytest.importorskip("triton")
    for tokens in (1, 5, 37, 300):
        check_align(distinct_ids(tokens, 8, 3, seed=tokens), 8, block_m)
    for _, ids in edge_cases():
        check_align(ids, 8, block_m)
    check_align(distinct_ids(3, 128, 8, seed=0), 128, block_m)  # more experts than pairs


# --- the kernels under the interpreter --------------------------------------------------------------------------


def kernel_errors() -> list[float]:
    """Each kernel against the float64 expert math: relative error, then the count of unwritten (NaN) outputs."""
    import torch.nn.functional as F

    from engine.ops.triton_moe import CONFIGS, align, down_weighted, gate_up_silu, num_blocks_for

    results = []
    for tokens, block_m in ((1, 16), (5, 32), (37, 16), (37, 64)):
        experts, x, ids, weights = moe_case(tokens, seed=tokens + block_m)
        config, top_k, num_pairs = CONFIGS[block_m], ids.shape[1], ids.numel()
        sorted_ids, block_expert, used = align(ids, 8, block_m, num_blocks_for(num_pairs, 8, block_m))
        gate_up, down = experts.gate_up_proj.data, experts.down_proj.data
        rows = torch.nonzero(sorted_ids < num_pairs).squeeze(1)
        pairs = sorted_ids[rows].long()
        row_experts = block_expert[rows // block_m].long()
        gate, up = torch.einsum("ph,pnh->pn", x[pairs // top_k].double(), gate_up[row_experts].double()).chunk(2, -1)

        h = torch.full((sorted_ids.numel(), 32), float("nan"))
        gate_up_silu(x, gate_up, sorted_ids, block_expert, top_k, config, out=h)
        results += [norm_error(h[rows], F.silu(gate) * up), float(h[:int(used)].isnan().sum())]

        h_in = torch.randn(h.shape, dtype=torch.float64)
        y_ref = torch.einsum("pi,phi->ph", h_in[rows], down[row_experts].double()) * weights.reshape(-1)[pairs, None]
        y = torch.full((num_pairs, 64), float("nan"))
        down_weighted(h_in.float(), down, sorted_ids, block_expert, weights.reshape(-1), config, out=y)
        results += [norm_error(y[pairs], y_ref), float(y.isnan().sum())]
    return results


def test_each_kernel_matches_the_expert_math_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_moe import kernel_errors\n"
                              "print(*kernel_errors(), sep='\\n')")
    errors, unwritten = results[0::2], results[1::2]
    assert len(errors) == 8 and max(errors) <= FP32
    assert unwritten == [0.0] * 8


def fused_errors() -> list[float]:
    from engine.ops.triton_moe import fused_experts

    results = []
    cases = [(tokens, None, block_m) for tokens in (1, 5, 37) for block_m in (None, 16, 64)]
    cases += [(ids.shape[0], ids, block_m) for _, ids in edge_cases() for block_m in (16, 64)]
    for tokens, ids, block_m in cases:
        experts, x, ids, weights = moe_case(tokens, seed=tokens, ids=ids)
        parts = fused_experts(x, ids, weights.t().contiguous().t(), experts.gate_up_proj.data,
                              experts.down_proj.data, block_m)
        assert parts.shape == (*ids.shape, x.shape[1])
        results.append(norm_error(parts.double().sum(1), reference(experts, x, ids, weights)))
    return results


def test_the_fused_path_matches_the_expert_loop_in_the_interpreter():
    errors = run_interpreted("from tests.engine.test_kernel_moe import fused_errors\nprint(*fused_errors(), sep='\\n')")
    assert len(errors) == 15 and max(errors) <= FP32


def shared_case(tokens: int, seed: int, num_experts: int = 8, hidden: int = 64, inter: int = 32, top_k: int = 3
                ) -> tuple[SparseMoE, torch.Tensor]:
    """A merged SparseMoE whose shared expert has an expert's size (so it is expert E), and x (a strided view)."""
    g = torch.Generator().manual_seed(seed)
    moe = SparseMoE(hidden, num_experts, top_k, inter, norm_topk_prob=True, shared_intermediate_size=inter)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    merge_projections(nn.Sequential(moe))
    return moe, torch.randn(tokens, 2 * hidden, generator=g)[:, ::2]


def shared_slot_errors() -> list[float]:
    """fused_experts over route's pairs plus the shared slot, its parts summed, against the float64 loop over the
    routed pairs plus sigmoid(g) * the shared MLP; then the count of unwritten (NaN) outputs."""
    from engine.layers.moe import route, with_shared_slot
    from engine.ops.triton_moe import fused_experts

    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch.empty gives NaN: what is unwritten shows
    results = []
    for tokens, block_m in ((1, 16), (5, 16), (37, 32), (37, 64)):
        moe, x = shared_case(tokens, seed=tokens + block_m)
        experts = moe.experts
        logits = x @ moe.router_weight.t()
        ids, weights = with_shared_slot(*route(logits[:, :8], 3, True), logits[:, 8:], 8)
        parts = fused_experts(x, ids, weights, experts.gate_up_with_shared, experts.down_with_shared, block_m)
        double = SparseMoE(64, 8, 3, 32, norm_topk_prob=True, shared_intermediate_size=32).double()  # unmerged
        double.load_state_dict(moe.state_dict())
        with torch.no_grad():
            routed = double.experts.looped(x.double(), ids[:, :3], weights[:, :3].double())
            ref = routed + torch.sigmoid(logits[:, 8:].double()) * double.shared_expert(x.double())
        results += [norm_error(parts.double().sum(1), ref), float(parts.isnan().sum())]
    return results


def test_the_shared_expert_as_one_more_slot_matches_the_loop_plus_the_shared_mlp_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_moe import shared_slot_errors\n"
                              "print(*shared_slot_errors(), sep='\\n')")
    errors, unwritten = results[0::2], results[1::2]
    assert len(errors) == 4 and max(errors) <= FP32
    assert unwritten == [0.0] * 4


# --- merged projections -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [48, 32, 0])
def test_the_merged_router_gives_the_unmerged_values(shared):
    torch.manual_seed(0)
    moe = SparseMoE(64, 8, 3, 32, norm_topk_prob=True, shared_intermediate_size=shared)
    for param in moe.parameters():
        nn.init.normal_(param, std=0.3)
    x = torch.randn(9, 64)
    with torch.inference_mode():
        before = moe(x)
        merge_projections(nn.Sequential(moe))  # as the engine does: every module that knows how
        after = moe(x)
    assert (moe.router_weight is not None) == bool(shared)
    if shared:
        assert moe.gate.weight.data_ptr() == moe.router_weight.data_ptr()  # a view: no byte held twice
        assert moe.shared_expert.gate_up_weight is not None
    assert moe.experts.has_shared_slot == (shared == 32)  # only a shared expert of an expert's size becomes one
    assert relative_error(after, before) <= 1e-6


def test_the_shared_expert_stacked_as_expert_e_keeps_every_parameter_as_a_view():
    torch.manual_seed(2)
    moe = SparseMoE(64, 8, 3, 32, norm_topk_prob=True, shared_intermediate_size=32)
    for param in moe.parameters():
        nn.init.normal_(param, std=0.3)
    model = nn.Sequential(moe)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    state_names = list(model.state_dict())
    merge_projections(model)  # the walk reaches SparseMoE, then its shared GatedMLP: the MLP must keep the view
    experts, shared = moe.experts, moe.shared_expert
    gate_up, down = experts.gate_up_with_shared, experts.down_with_shared
    assert gate_up.shape == (9, 64, 64) and down.shape == (9, 64, 32)
    params = dict(model.named_parameters())
    assert list(params) == list(before) and list(model.state_dict()) == state_names
    for name, param in params.items():
        assert param.is_contiguous() and torch.equal(param, before[name]), name  # same shape, values, bytes
    assert experts.gate_up_proj.data_ptr() == gate_up.data_ptr() and experts.down_proj.data_ptr() == down.data_ptr()
    assert shared.gate_proj.weight.data_ptr() == gate_up[8].data_ptr()
    assert shared.up_proj.weight.data_ptr() == gate_up[8, 32:].data_ptr()
    assert shared.down_proj.weight.data_ptr() == down[8].data_ptr()
    assert shared.gate_up_weight.data_ptr() == gate_up[8].data_ptr()
    # Nothing held twice: the merged storages hold exactly the parameters' bytes.
    held = sum(t.untyped_storage().nbytes() for t in (gate_up, down, moe.router_weight))
    assert held == sum(param.numel() * param.element_size() for param in model.parameters())

    merge_projections(model)  # parameters still its views (a kept layer): kept, not copied
    assert experts.gate_up_with_shared is gate_up and experts.down_with_shared is down
    fresh = torch.randn(32, 64)
    shared.up_proj.weight = nn.Parameter(fresh.clone(), requires_grad=False)  # refilled, as a reconfiguration does
    merge_projections(model)
    restacked = experts.gate_up_with_shared
    assert restacked is not gate_up and torch.equal(restacked[8, 32:], fresh)
    assert torch.equal(restacked[:8], before["0.experts.gate_up_proj"])
    assert torch.equal(restacked[8, :32], before["0.shared_expert.gate_proj.weight"])
    assert shared.up_proj.weight.data_ptr() == restacked[8, 32:].data_ptr()
    assert shared.gate_up_weight.data_ptr() == restacked[8].data_ptr()
    assert experts.gate_up_proj.data_ptr() == restacked.data_ptr()


@pytest.mark.parametrize("bias", [False, True])
def test_the_merged_mlp_gives_the_unmerged_values(bias):
    torch.manual_seed(1)
    mlp = GatedMLP(64, 96, bias=bias)
    for param in mlp.parameters():
        nn.init.normal_(param, std=0.2)
    x = torch.randn(2, 7, 64)
    with torch.inference_mode():
        before = mlp(x)
        mlp.merge_projections()
        after = mlp(x)
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up_weight[96:].data_ptr()
    assert relative_error(after, before) <= 1e-6


# --- on a GPU: bf16 against the fp32 loop -------------------------------------------------------------------------


def gpu_case(num_experts: int, tokens: int, seed: int, ids: torch.Tensor | None = None):
    torch.manual_seed(seed)
    experts = Experts(num_experts, 2048, 512)
    nn.init.normal_(experts.gate_up_proj, std=0.02)
    nn.init.normal_(experts.down_proj, std=0.02)
    ids = distinct_ids(tokens, num_experts, 8, seed) if ids is None else ids
    return experts, torch.randn(tokens, 2048), ids, torch.rand(ids.shape)


@cuda
def test_fused_experts_on_the_gpu():
    from engine.ops.triton_moe import fused_experts

    cases = [(32, tokens, None) for tokens in (1, 8, 64, 256, 2048)]
    cases += [(128, tokens, None) for tokens in (1, 8, 300)]
    cases += [(32, 256, torch.arange(8).repeat(256, 1))]  # every token on the same 8 experts
    for num_experts, tokens, ids in cases:
        experts, x, ids, weights = gpu_case(num_experts, tokens, seed=tokens, ids=ids)
        with torch.inference_mode():
            ref = experts.looped(x, ids, weights)
            gpu = experts.to("cuda", torch.bfloat16)
            args = x.cuda().bfloat16(), ids.cuda(), weights.cuda().bfloat16()
            # The grouped matmuls (no Triton in them) round in bf16 after each op and sum the top-k parts in bf16
            # (index_add_): twice the kernels' tolerance (seen on the H200: 1.01e-2 at 32 experts, 8 tokens).
            outs = [("grouped", gpu(*args), 2 * BF16)]
            outs += [(f"triton block_m {m}", fused_experts(*args, gpu.gate_up_proj, gpu.down_proj, m).float().sum(1),
                      BF16) for m in (16, 32, 64)]
            for path, out, tolerance in outs:
                assert torch.isfinite(out).all()
                assert relative_error(out.float().cpu(), ref) <= tolerance, (path, num_experts, tokens)


@cuda
def test_fused_experts_replay_in_a_cuda_graph():
    from engine.ops.triton_moe import fused_experts

    experts, x, ids, weights = gpu_case(32, 4, seed=5)
    gpu = experts.to("cuda", torch.bfloat16)
    static = [x.cuda().bfloat16(), ids.cuda(), weights.cuda().bfloat16()]
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (Triton compile, torch.compile of align) outside the capture
            for _ in range(2):
                fused_experts(*static, gpu.gate_up_proj, gpu.down_proj)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_experts(*static, gpu.gate_up_proj, gpu.down_proj)
        for seed in (11, 12):
            _, x, ids, weights = gpu_case(32, 4, seed=seed)
            for buffer, new in zip(static, (x, ids, weights), strict=True):
                buffer.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            experts_cpu = Experts(32, 2048, 512)
            experts_cpu.gate_up_proj.data.copy_(gpu.gate_up_proj.float().cpu())
            experts_cpu.down_proj.data.copy_(gpu.down_proj.float().cpu())
            ref = experts_cpu.looped(static[0].float().cpu(), ids, static[2].float().cpu())
            assert relative_error(out.float().sum(1).cpu(), ref) <= BF16
