"""Decode attention's split merge and fused output gate (engine/ops/triton_decode.py) and the gate's wiring.

On the CPU, Triton's interpreter runs the kernels against the float64 PyTorch path (engine/ops/paged_decode.py): one
split (the decode kernel writes the output itself), two, five and seven (masked split slots, splits left empty by a
short sequence or a sliding window) and the rule's own count; gated and plain; a gate read through a strided view (the
layer's [query | gate] projection); a group and a head_dim that need padding; float16 q (its dtype kept); an fp8 cache.
The launches are counted: one at one split, two otherwise. The PyTorch paths must gate exactly as the layer did before.
On a GPU: bf16 at Qwen3-Next's attention sizes (16 query heads, 2 kv heads, head_dim 256) at batches 1, 64 and 200
(32, 2 and 1 splits) against float64, inside a CUDA graph with the K/V write, and the layer's decode wiring.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from engine.config import ModelConfig
from engine.layers.attention import Attention
from engine.layers.caches import InMemoryCaches
from engine.layers.rotary import RotaryEmbedding
from engine.layers.step import LayerStep
from engine.ops.attention import PagedMetadata, paged_attention
from engine.ops.paged_decode import gate_output, torch_paged_decode
from engine.step_plan import DecodeBatch, StepContext
from tests.engine.test_gpu_paths import _cache_case
from tests.support.engine_checkpoints import CASES
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP32, FP16, BF16 = 1e-5, 1e-3, 1e-2
REAL = dict(heads=16, kv_heads=2, dim=256)  # Qwen3-Next-80B's gated attention


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """||ours - reference|| / ||reference|| (NaN, so failing, where an element was never written)."""
    ours, reference = ours.detach().cpu().double(), reference.detach().cpu().double()
    return float((ours - reference).norm() / reference.norm())


class _Counted:
    """A Triton kernel that counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def check_decode(seed: int, splits: int | None = None, gated: bool = True, window: int | None = None,
                 lens: tuple[int, ...] = (1, 77, 160), dtype: torch.dtype = torch.float32,
                 cache_dtype: torch.dtype | None = None, heads: int = 8, kv_heads: int = 2, dim: int = 64,
                 device: str = "cpu") -> list[float]:
    """triton_paged_decode with `splits` forced (None: the rule's count) against float64 on the same (dtype-rounded)
    values. Returns [relative error, splits used, decode launches, merge launches, 1 if the output has q's dtype]."""
    from engine.ops import triton_decode as kernels

    q, k_cache, v_cache, table, lengths = _cache_case(seed, heads=heads, kv_heads=kv_heads, dim=dim, lens=lens)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(cache_dtype or dtype), v_cache.to(cache_dtype or dtype)
    # q_proj's [query | gate] per head: the gate is a strided view, as the layer passes it.
    gate = torch.randn(len(lens), heads, 2 * dim, generator=torch.Generator().manual_seed(seed)).to(dtype)[..., dim:]
    reference = torch_paged_decode(q.double(), k_cache.double(), v_cache.double(), table, lengths, dim**-0.5, window)
    if gated:
        reference = reference * torch.sigmoid(gate.double())
    used = splits or kernels.splits_for(len(lens), kv_heads)
    decode, merge = _Counted(kernels._decode_kernel), _Counted(kernels._merge_kernel)
    with mock.patch.multiple(kernels, splits_for=lambda *_: used, _decode_kernel=decode, _merge_kernel=merge):
        out = kernels.triton_paged_decode(q.to(device), k_cache.to(device), v_cache.to(device), table.to(device),
                                          lengths.to(device), dim**-0.5, window, gate.to(device) if gated else None)
    return [relative(out, reference), used, decode.launches, merge.launches, float(out.dtype == dtype)]


def _check_interpreted(cases: dict[str, float]) -> None:
    """check_decode(case) under the interpreter for each case, within its bound, with the launches the split count
    promises: the decode kernel once, the merge once where there are several splits."""
    lines = "\n".join(f"print(*check_decode({case}), sep='\\n')" for case in cases)
    values = run_interpreted(f"import torch\nfrom tests.engine.test_paged_decode import check_decode\n{lines}")
    assert len(values) == 5 * len(cases)
    for i, (case, bound) in enumerate(cases.items()):
        error, splits, decode, merge, same_dtype = values[5 * i:5 * i + 5]
        assert error <= bound and same_dtype == 1.0, (case, error)
        assert (decode, merge) == (1, 0 if splits == 1 else 1), (case, splits, decode, merge)


def test_one_split_writes_the_gated_output_in_one_launch_in_the_interpreter():
    _check_interpreted({
        "0, splits=1": FP32,
        "1, splits=1, gated=False, window=20": FP32,
        "2, splits=1, heads=6, dim=72, lens=(5, 130)": FP32,  # group 3 and head_dim 72: padded
    })


def test_splits_merge_with_the_gate_in_a_second_launch_in_the_interpreter():
    _check_interpreted({
        "3": FP32,  # the rule's count: 32 splits for 3 sequences x 2 kv heads
        "4, splits=2": FP32,
        "5, splits=7, gated=False, window=20": FP32,  # a 20-key window fills split 0 only: six empty splits
        "6, splits=5, heads=6, dim=72, lens=(5, 130, 300)": FP32,
        "7, splits=3, dtype=torch.float16": FP16,
        "8, splits=4, cache_dtype=torch.float8_e4m3fn": FP32,
    })


def test_the_pytorch_paths_gate_as_the_layer_did():
    """On the CPU, paged_attention(gate=...) is bit for bit the old layer's gate_output on the flattened output, on the
    batched decode path and on the per-sequence path alike."""
    g = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, block_size = 4, 2, 16, 4
    k_cache, v_cache = (torch.randn(12, block_size, kv_heads, dim, generator=g) for _ in range(2))
    for query_lens, cached in (([1, 1], [5, 9]), ([3, 1], [0, 6])):
        ctx = StepContext(query_lens, cached, [0, 1], [[0, 1, 2, 3], [4, 5, 6, 7]], block_size,
                          torch.cat([torch.arange(c, c + n) for n, c in zip(query_lens, cached, strict=True)]))
        ctx = ctx.with_decode_tensors()
        assert (ctx.decode is not None) == (query_lens == [1, 1])
        tokens = sum(query_lens)
        q = torch.randn(tokens, heads, 2 * dim, generator=g)
        q, gate = q[..., :dim], q[..., dim:]
        k, v = (torch.randn(tokens, kv_heads, dim, generator=g) for _ in range(2))
        meta = PagedMetadata.build(ctx)
        plain = paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.25).reshape(tokens, -1)
        gated = paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.25, gate=gate)
        assert torch.equal(gated.reshape(tokens, -1), gate_output(plain, gate.reshape(tokens, -1)))


# --- on a GPU: bf16 at Qwen3-Next's sizes against float64 ----------------------------------------------------------


@cuda
@pytest.mark.parametrize(("lens", "splits"), [((3000,), 32), (tuple(range(7, 2000, 31))[:64], 2),
                                              (tuple(range(1, 400, 2)), 1)])
@pytest.mark.parametrize("gated", [True, False])
def test_decode_kernels_at_qwen3_next_sizes_on_the_gpu(lens, splits, gated):
    error, used, decode, merge, same_dtype = check_decode(0, None, gated, None, lens, torch.bfloat16, device="cuda",
                                                          **REAL)
    assert used == splits and (decode, merge) == (1, 0 if splits == 1 else 1)
    assert error <= BF16 and same_dtype == 1.0, error


@cuda
def test_decode_kernels_read_an_fp8_cache_on_the_gpu():
    error, *_ = check_decode(1, None, True, None, (900, 5, 1200, 64), torch.bfloat16, torch.float8_e4m3fn,
                             device="cuda", **REAL)
    assert error <= BF16, error


@cuda
@pytest.mark.parametrize("seqs", [3, 63, 199])  # + a copy of the first: 32, 2 and 1 splits
def test_kv_write_and_gated_decode_replay_in_a_cuda_graph(seqs):
    """paged_attention at decode (the K/V write, the decode kernel and, with splits, the merge) captured once over a
    DecodeBatch's buffers, then replayed on new tokens, new lengths and new slots: the graph's padding row (a copy of
    the first sequence) writes the same row with the same values."""
    g = torch.Generator().manual_seed(9)
    heads, kv_heads, dim, block_size = REAL["heads"], REAL["kv_heads"], REAL["dim"], 16
    rows = seqs + 1
    tables = [list(range(s * 8, s * 8 + 8)) for s in range(seqs)]  # 8 blocks of 16 a sequence
    caches = [torch.randn(seqs * 8, block_size, kv_heads, dim, generator=g).bfloat16() for _ in range(2)]
    gpu_caches = [c.cuda() for c in caches]

    def decode_batch(cached: list[int]) -> DecodeBatch:
        padded = cached + cached[:1]
        return DecodeBatch.build(padded, list(range(seqs)) + [0], tables + tables[:1], block_size, "cuda", width=8)

    def fresh() -> list[torch.Tensor]:
        q, gate = torch.randn(seqs, heads, 2 * dim, generator=g).bfloat16().chunk(2, dim=-1)
        k, v = (torch.randn(seqs, kv_heads, dim, generator=g).bfloat16() for _ in range(2))
        return [torch.cat([t, t[:1]]) for t in (q, k, v, gate)]  # the padding row: a copy of the first

    def write_reference(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        for cache, new in zip(caches, (k, v), strict=True):  # the torch write, on the CPU
            cache.view(-1, kv_heads, dim)[slot_mapping.cpu()] = new

    cached = [int(n) for n in torch.randint(0, 100, (seqs,), generator=g)]
    batch = decode_batch(cached)
    ctx = StepContext([1] * rows, cached + cached[:1], [0] * rows, [[0]] * rows, block_size,
                      torch.zeros(rows, dtype=torch.long, device="cuda"), batch)
    meta = PagedMetadata.build(ctx)
    values = fresh()
    inputs = [t.cuda() for t in values]
    with torch.inference_mode():
        paged_attention(*inputs[:3], *gpu_caches, meta, dim**-0.5, None, inputs[3])  # compiles outside the capture
        write_reference(values[1], values[2], batch.slot_mapping)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = paged_attention(*inputs[:3], *gpu_caches, meta, dim**-0.5, None, inputs[3])
        for step in range(2):
            cached = [n + 1 + step * 7 for n in cached]  # a jump: new rows, sometimes new blocks
            new_batch, values = decode_batch(cached), fresh()
            for name in ("block_table", "context_lens", "slot_mapping"):
                getattr(batch, name).copy_(getattr(new_batch, name))
            for buffer, value in zip(inputs, values, strict=True):
                buffer.copy_(value)
            graph.replay()
            torch.cuda.synchronize()
            q, k, v, gate = values
            write_reference(k, v, new_batch.slot_mapping)
            reference = torch_paged_decode(q.double(), caches[0].double(), caches[1].double(),
                                           new_batch.block_table.cpu(), new_batch.context_lens.cpu(), dim**-0.5)
            assert relative(out, reference * torch.sigmoid(gate.double())) <= BF16
            assert all(torch.equal(ours.cpu(), theirs) for ours, theirs in zip(gpu_caches, caches, strict=True))


def _real_attention_config() -> ModelConfig:
    return ModelConfig.from_dict(dict(CASES["qwen3_next_dense"][1], model_type="qwen3_next", rms_norm_eps=1e-6,
                                      hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                      partial_rotary_factor=0.25))


def _prefill_then_decode(layer: Attention, config: ModelConfig, device: str = "cpu",
                         dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Two sequences: a prefill of 37 and 130 tokens, then two decode steps. The inputs are bf16 values whatever
    `dtype`, so a bf16 run and the float32 reference start from the same ones."""
    lengths, tables, block_size = [37, 130], [[3, 0, 5], [1, 2, 4, 6, 7, 8, 9, 10, 11]], 16
    caches = InMemoryCaches(config, num_blocks=12, block_size=block_size, num_slots=2, layers=range(3, 4),
                            device=device, kv_dtype=dtype)
    rotary, g = RotaryEmbedding(config), torch.Generator().manual_seed(11)
    steps = [StepContext.for_prefill(lengths, [0, 1], tables, block_size, device)]
    steps += [StepContext([1, 1], [n + i for n in lengths], [0, 1], tables, block_size,
                          torch.tensor([n + i for n in lengths], device=device)).with_decode_tensors() for i in (0, 1)]
    outs = []
    for ctx in steps:
        step = LayerStep(ctx, caches, PagedMetadata.build(ctx))
        step.cos, step.sin = rotary.cos_sin(ctx.positions, dtype)
        x = torch.randn(len(ctx.positions), config.hidden_size, generator=g).bfloat16().to(device, dtype)
        outs.append(layer(x, step).float().cpu())
    return outs


@cuda
def test_the_gated_layer_decodes_through_the_kernels_on_the_gpu():
    """The wiring: the merged Qwen3-Next attention layer at its real sizes in bf16 on the GPU (the K/V write kernel,
    the decode kernels with the fused gate) against float32 on the CPU from the same bf16 weights and inputs."""
    config = _real_attention_config()
    assert config.attn_output_gate and config.qk_norm
    torch.manual_seed(0)
    layer = Attention(config, 3)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.02)
    layer = layer.to(torch.bfloat16).float()
    with torch.inference_mode():
        reference = _prefill_then_decode(layer, config)
        gpu = layer.to("cuda", torch.bfloat16)
        gpu.merge_projections()
        ours = _prefill_then_decode(gpu, config, "cuda", torch.bfloat16)
    for mine, theirs in zip(ours, reference, strict=True):
        assert relative(mine, theirs) <= 2e-2  # activations round to bf16 between ops: a little above one kernel's
