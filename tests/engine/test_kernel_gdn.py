"""GDN's in-place decode kernels (engine/ops/triton_gdn.py) against the PyTorch decode path, and the merged projection.

On the CPU, Triton's interpreter runs both kernels in float32 (held to 1e-5): slots in a shuffled order with some slots
untouched (they must keep their bytes), grouped value heads, a value dim that is not a multiple of the block, strided
inputs, and rows that are copies of another (a CUDA graph's padding). On a GPU, bf16 at Qwen3-Next's sizes against the
float32 reference (1e-2), with bf16 and float32 state pools, inside a CUDA graph, and the layer's decode wiring.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.config import ModelConfig
from engine.layers.caches import InMemoryCaches
from engine.layers.gated_deltanet import GatedDeltaNet, gdn_gates
from engine.layers.step import LayerStep
from engine.ops.conv import conv_decode, ungroup
from engine.ops.gdn import gated_delta_step
from engine.step_plan import StepContext
from tests.support.engine_checkpoints import CASES
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP32, BF16 = 1e-5, 1e-2
# Qwen3-Next-80B's GDN: 16 key heads, 32 value heads, 128 x 128 heads, conv 8192 channels of kernel 4.
REAL = dict(key_heads=16, heads=32, key_dim=128, value_dim=128)


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """||ours - reference|| / ||reference|| (NaN, so failing, where an element was never written)."""
    ours, reference = ours.detach().cpu().double(), reference.detach().cpu().double()
    return float((ours - reference).norm() / reference.norm())


def _slots(g: torch.Generator, seqs: int, num_slots: int, copies: int) -> torch.Tensor:
    """`seqs` distinct slots in a shuffled order (the rest untouched), then `copies` repeats of the first."""
    slots = torch.randperm(num_slots, generator=g)[:seqs]
    return torch.cat([slots, slots[:1].expand(copies)])


def _repeat_first(t: torch.Tensor, copies: int) -> torch.Tensor:
    return torch.cat([t, t[:1].expand(copies, *t.shape[1:])])


def _pool_checks(before: torch.Tensor, after: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor) -> list[float]:
    """[error of the touched slots, largest change of an untouched slot (must be 0)]."""
    untouched = torch.ones(before.shape[0], dtype=torch.bool)
    untouched[slots.cpu()] = False
    change = (after.cpu()[untouched].double() - before.cpu()[untouched].double()).abs().max()
    return [relative(after[slots], expected[slots.cpu()]), float(change)]


def check_conv(seed: int, seqs: int, num_slots: int, groups: int, segments: tuple[int, ...], kernel: int,
               grouped: bool = True, copies: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32,
               state_dtype: torch.dtype = torch.float32, steps: int = 1) -> list[float]:
    """The conv kernel, `steps` times, on a strided input: grouped [seqs, groups, width] read through `segments`
    (each group has 5 unread columns, as GDN's z), or plain [seqs, channels] (a row stride of its own).
    Returns [output error, touched-state error, untouched change]."""
    from engine.ops.triton_gdn import triton_conv_decode

    g = torch.Generator().manual_seed(seed)
    channels = groups * sum(segments)
    width = sum(segments) + 5 if grouped else channels // groups
    rows = _repeat_first(torch.randn(seqs, groups * width + 3, generator=g), copies).to(device, dtype)
    x = rows[:, :groups * width]
    x = x.unflatten(1, (groups, width)) if grouped else x
    weight = (torch.randn(channels, kernel, generator=g) * 0.5).to(device, dtype)
    state = torch.randn(num_slots, channels, kernel - 1, generator=g).to(device, state_dtype)
    slots = _slots(g, seqs, num_slots, copies).to(device)
    before, expected = state.clone(), state.cpu().float().clone()  # clone: .float() on a CPU fp32 tensor aliases it
    plain = ungroup(x.cpu().float(), segments) if grouped else x.cpu().float()
    for _ in range(steps):
        reference, states = conv_decode(plain, weight.cpu().float(), expected[slots.cpu()])
        expected[slots.cpu()] = states.to(state_dtype).float()
        out = torch.full((x.shape[0], channels), float("nan"), dtype=dtype, device=device)
        triton_conv_decode(x, weight, state, slots, segments if grouped else None, out=out)
    return [relative(out, reference), *_pool_checks(before, state, expected, slots)]


def check_gdn(seed: int, seqs: int, num_slots: int, key_heads: int, heads: int, key_dim: int, value_dim: int,
              copies: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32,
              state_dtype: torch.dtype = torch.float32, steps: int = 1) -> list[float]:
    """The GDN kernel on strided q, k, v (slices of the conv output) and b, a (slices of ba), `steps` times.
    Returns [output error, touched-state error, untouched change]."""
    from engine.ops.triton_gdn import triton_gdn_decode

    g = torch.Generator().manual_seed(seed)
    group, key_width = heads // key_heads, key_heads * key_dim
    width = 2 * key_width + heads * value_dim
    mixed = _repeat_first(torch.randn(seqs, width + 3, generator=g), copies).to(device, dtype)[:, :width]
    q = mixed[:, :key_width].unflatten(1, (key_heads, key_dim))
    k = mixed[:, key_width:2 * key_width].unflatten(1, (key_heads, key_dim))
    v = mixed[:, 2 * key_width:].unflatten(1, (heads, value_dim))
    ba = _repeat_first(torch.randn(seqs, key_heads, 2 * group + 1, generator=g), copies).to(device, dtype)
    b, a = ba[..., :group], ba[..., group:2 * group]
    a_log, dt_bias = (torch.randn(heads, generator=g) * 0.5).to(device, dtype), torch.randn(heads, generator=g)
    dt_bias = dt_bias.to(device, dtype)
    state = (torch.randn(num_slots, heads, key_dim, value_dim, generator=g) * 0.3).to(device, state_dtype)
    slots = _slots(g, seqs, num_slots, copies).to(device)
    before, expected = state.clone(), state.cpu().float().clone()  # clone: .float() on a CPU fp32 tensor aliases it
    cpu = [t.cpu().float() for t in (q, k, v, b.flatten(1), a.flatten(1), a_log, dt_bias)]
    for _ in range(steps):
        beta, decay = gdn_gates(cpu[3], cpu[4], cpu[5], cpu[6])
        reference, states = gated_delta_step(*cpu[:3], decay, beta, expected[slots.cpu()])
        expected[slots.cpu()] = states.to(state_dtype).float()
        out = torch.full(v.shape, float("nan"), dtype=dtype, device=device)
        triton_gdn_decode(q, k, v, b, a, a_log, dt_bias, state, slots, out=out)
    return [relative(out, reference), *_pool_checks(before, state, expected, slots)]


def _interpreted(call: str, cases: list[str]) -> list[list[float]]:
    lines = "\n".join(f"print(*{call}({case}), sep='\\n')" for case in cases)
    values = run_interpreted(f"from tests.engine.test_kernel_gdn import {call}\n{lines}")
    return [values[i:i + 3] for i in range(0, len(values), 3)]


def test_conv_kernel_matches_the_pytorch_decode_in_the_interpreter():
    cases = [
        "0, seqs=3, num_slots=7, groups=2, segments=(4, 4, 6), kernel=4",  # GDN's layout in miniature
        "1, seqs=2, num_slots=5, groups=3, segments=(64, 64, 160), kernel=4, steps=2",  # 864 channels: 4 blocks
        "2, seqs=3, num_slots=4, groups=3, segments=(100,), kernel=3, grouped=False",  # plain x, odd kernel
        "3, seqs=3, num_slots=6, groups=2, segments=(4, 4, 6), kernel=4, copies=2",  # graph padding
    ]
    for case, (out, state, untouched) in zip(cases, _interpreted("check_conv", cases), strict=True):
        assert out <= FP32 and state <= FP32 and untouched == 0.0, (case, out, state, untouched)


def test_gdn_kernel_matches_the_pytorch_decode_in_the_interpreter():
    cases = [
        "0, seqs=3, num_slots=7, key_heads=2, heads=4, key_dim=20, value_dim=48",  # grouped heads, tails in both
        "1, seqs=2, num_slots=3, key_heads=1, heads=1, key_dim=16, value_dim=32, steps=2",
        "2, seqs=2, num_slots=6, key_heads=2, heads=4, key_dim=16, value_dim=16, copies=3",  # graph padding
    ]
    for case, (out, state, untouched) in zip(cases, _interpreted("check_gdn", cases), strict=True):
        assert out <= FP32 and state <= FP32 and untouched == 0.0, (case, out, state, untouched)


def _config() -> ModelConfig:
    return ModelConfig.from_dict(dict(CASES["qwen3_next_dense"][1], model_type="qwen3_next", rms_norm_eps=1e-6))


def _layer(seed: int = 0) -> GatedDeltaNet:
    torch.manual_seed(seed)
    layer = GatedDeltaNet(_config(), 0)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.3)
    return layer


def _prefill_then_decode(layer: GatedDeltaNet, device: str = "cpu", dtype: torch.dtype = torch.float32,
                         steps: int = 2) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Two sequences (slots 2 and 0 of 3): a prefill, then `steps` decode steps; the outputs and the final states.
    The inputs are bf16 values whatever `dtype`, so a bf16 run and the float32 reference start from the same ones."""
    hidden, lengths, slots, tables = layer.in_proj_qkvz.in_features, [5, 3], [2, 0], [[0], [1]]
    caches = InMemoryCaches(_config(), num_blocks=4, block_size=16, num_slots=3, layers=range(1), device=device)
    g = torch.Generator().manual_seed(7)
    ctx = StepContext.for_prefill(lengths, slots, tables, 16, device)
    outs = [layer(torch.randn(sum(lengths), hidden, generator=g).bfloat16().to(device, dtype), LayerStep(ctx, caches))]
    for step in range(steps):
        cached = [n + step for n in lengths]
        ctx = StepContext([1, 1], cached, slots, tables, 16, torch.tensor(cached, device=device)).with_decode_tensors()
        assert ctx.decode is not None
        outs.append(layer(torch.randn(2, hidden, generator=g).bfloat16().to(device, dtype), LayerStep(ctx, caches)))
    return [out.float().cpu() for out in outs], caches.state(0)


def test_merged_projections_give_the_unmerged_values():
    layer = _layer()
    merged = copy.deepcopy(layer)
    merged.merge_projections()
    assert not isinstance(merged.in_proj_merged, torch.nn.Parameter)
    assert merged.in_proj_qkvz.weight.data_ptr() == merged.in_proj_merged.data_ptr()  # views of its rows
    assert torch.equal(merged.in_proj_merged[-layer.in_proj_ba.out_features:], layer.in_proj_ba.weight)
    with torch.inference_mode():
        (ours, our_states), (theirs, their_states) = _prefill_then_decode(merged), _prefill_then_decode(layer)
    for mine, reference in zip([*ours, *our_states], [*theirs, *their_states], strict=True):
        # The same rows of the same GEMM; a BLAS may block a wider N differently (last-bit float32 differences).
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-6)


# --- on a GPU: bf16 at Qwen3-Next's sizes against the float32 reference -----------------------------------------


@cuda
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seqs", [1, 64])
def test_kernels_in_bf16_on_the_gpu(seqs, state_dtype):
    per_key = REAL["heads"] // REAL["key_heads"]
    segments = (REAL["key_dim"], REAL["key_dim"], per_key * REAL["value_dim"])  # 16 x 512 = 8192 channels
    conv = check_conv(0, seqs, seqs + 16, REAL["key_heads"], segments, 4, device="cuda", dtype=torch.bfloat16,
                      state_dtype=state_dtype)
    gdn = check_gdn(1, seqs, seqs + 16, **REAL, device="cuda", dtype=torch.bfloat16, state_dtype=state_dtype)
    for out, state, untouched in (conv, gdn):
        assert out <= BF16 and state <= BF16 and untouched == 0.0, (conv, gdn)


@cuda
def test_kernels_step_the_state_inside_a_cuda_graph():
    """Captured once, replayed twice: the states advance twice (graph padding included: 3 sequences + a copy)."""
    from engine.ops.triton_gdn import triton_conv_decode, triton_gdn_decode

    g = torch.Generator().manual_seed(3)
    heads, key_heads, key_dim, value_dim = REAL["heads"], REAL["key_heads"], REAL["key_dim"], REAL["value_dim"]
    per_key, key_width = heads // key_heads, key_heads * key_dim
    segments = (key_dim, key_dim, per_key * value_dim)
    slots = torch.tensor([5, 2, 7, 5], device="cuda")
    proj = _repeat_first(torch.randn(3, key_heads, sum(segments) + per_key * value_dim, generator=g), 1)
    ba = _repeat_first(torch.randn(3, key_heads, 2 * per_key, generator=g), 1)
    weight = torch.randn(2 * key_width + heads * value_dim, 4, generator=g) * 0.5
    a_log, dt_bias = torch.randn(heads, generator=g) * 0.5, torch.randn(heads, generator=g)
    conv_state = torch.randn(8, weight.shape[0], 3, generator=g)
    state = torch.randn(8, heads, key_dim, value_dim, generator=g) * 0.3
    gpu = [t.cuda().bfloat16() for t in (proj, ba, weight, a_log, dt_bias)]
    gpu_conv, gpu_state = conv_state.cuda(), state.cuda()

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        mixed = triton_conv_decode(gpu[0], gpu[2], gpu_conv, slots, segments)
        q, k = (mixed[:, i * key_width:(i + 1) * key_width].unflatten(1, (key_heads, key_dim)) for i in (0, 1))
        v = mixed[:, 2 * key_width:].unflatten(1, (heads, value_dim))
        b, a = gpu[1][..., :per_key], gpu[1][..., per_key:]
        return mixed, triton_gdn_decode(q, k, v, b, a, gpu[3], gpu[4], gpu_state, slots)

    step()  # compiles the kernels outside the capture
    gpu_conv.copy_(conv_state)
    gpu_state.copy_(state)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mixed, out = step()
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()

    rows, cpu = slots[:3].cpu(), [t.float().cpu() for t in gpu]
    for _ in range(2):
        reference_mixed, states = conv_decode(ungroup(cpu[0][:3], segments), cpu[2], conv_state[rows])
        conv_state[rows] = states
        q, k, v = reference_mixed.split([key_width, key_width, heads * value_dim], dim=-1)
        beta, decay = gdn_gates(cpu[1][:3, :, :per_key].flatten(1), cpu[1][:3, :, per_key:].flatten(1), cpu[3], cpu[4])
        reference, states = gated_delta_step(q.unflatten(1, (key_heads, key_dim)), k.unflatten(1, (key_heads, key_dim)),
                                             v.unflatten(1, (heads, value_dim)), decay, beta, state[rows])
        state[rows] = states
    assert relative(mixed, _repeat_first(reference_mixed, 1)) <= BF16
    assert relative(out, _repeat_first(reference, 1)) <= BF16
    assert relative(gpu_conv, conv_state) <= BF16 and relative(gpu_state, state) <= BF16


@cuda
def test_the_layer_decodes_in_place_on_the_gpu():
    """The wiring: the merged layer in bf16 on the GPU (decode steps through the kernels) against float32 on the CPU,
    both from the same bf16 weights and inputs."""
    layer = _layer(1).to(torch.bfloat16).float()
    with torch.inference_mode():
        reference, reference_states = _prefill_then_decode(layer)
        gpu = copy.deepcopy(layer).to("cuda", torch.bfloat16)
        gpu.merge_projections()
        ours, our_states = _prefill_then_decode(gpu, "cuda", torch.bfloat16)
    for mine, theirs in zip([*ours, *our_states], [*reference, *reference_states], strict=True):
        assert relative(mine, theirs) <= 2e-2  # activations round to bf16 between ops: a little above one kernel's
