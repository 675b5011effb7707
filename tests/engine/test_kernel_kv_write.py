"""The K/V write kernel (engine/ops/triton_decode.py `triton_write_kv`) against write_kv's index assignments.

Every byte of both caches must equal the PyTorch path's, rows not written included. On the CPU, Triton's interpreter
runs the kernel: k and v as strided views of one projection row (as the attention layer passes them), kv heads and
head dims that need padding, float32, float16 and bfloat16 caches, the casts float32 -> float16 and bfloat16 -> fp8
(on values fp8 holds exactly: the interpreter's fp8 rounding is not the GPU's, and it truncates to bf16), decode
slots, a prefill's run of slots, and a slot written twice with the same values (a CUDA graph's padding row). On a GPU,
at Qwen3-Next's sizes (2 kv heads x 256) with real rounding (float32 -> bf16, bf16 -> fp8 in range), a 4,096-token
prefill, through write_kv's dispatch, and replayed inside a CUDA graph on new slots.
"""

from __future__ import annotations

import pytest
import torch

from engine.ops.attention import PagedMetadata, write_kv
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP8 = torch.float8_e4m3fn


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def _inputs(seed: int, tokens: int, kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
            source_dtype: torch.dtype, cache_dtype: torch.dtype, fp8_exact: bool, copies: int, prefill: bool,
            device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v [tokens + copies, kv_heads, head_dim] as views of a wider row; caches of random values; slots (a shuffled
    sample, or one run of consecutive rows for a prefill), the first repeated `copies` times; all on `device`."""
    g = torch.Generator().manual_seed(seed)
    width = kv_heads * head_dim
    rows = torch.randn(tokens, 3 * width + 5, generator=g) * 4
    if fp8_exact:
        rows = rows.to(FP8).float()
    rows = torch.cat([rows, rows[:1].expand(copies, -1)]).to(device, source_dtype)
    k = rows[:, width:2 * width].unflatten(1, (kv_heads, head_dim))
    v = rows[:, 2 * width + 5:].unflatten(1, (kv_heads, head_dim))
    caches = [(torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g) * 4).to(device, cache_dtype)
              for _ in range(2)]
    if prefill:
        start = int(torch.randint(0, num_blocks * block_size - tokens, (1,), generator=g))
        slots = torch.arange(start, start + tokens)
    else:
        slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    return k, v, caches[0], caches[1], torch.cat([slots, slots[:1].expand(copies)]).to(device)


def check_write(seed: int, tokens: int, kv_heads: int, head_dim: int, block_size: int = 16, num_blocks: int = 12,
                source_dtype: torch.dtype = torch.float32, cache_dtype: torch.dtype | None = None,
                fp8_exact: bool = False, copies: int = 0, prefill: bool = False, device: str = "cpu",
                through_write_kv: bool = False) -> list[float]:
    """The kernel (or write_kv, which dispatches to it on CUDA) against write_kv's index assignments on the CPU.
    Returns [count of K cache bytes that differ, count of V cache bytes that differ]."""
    from engine.ops.triton_decode import triton_write_kv

    ours = _inputs(seed, tokens, kv_heads, head_dim, block_size, num_blocks, source_dtype, cache_dtype or source_dtype,
                   fp8_exact, copies, prefill, device)
    k, v, expected_k, expected_v, slots = (t.cpu().clone() for t in ours)
    write_kv(k, v, expected_k, expected_v, PagedMetadata(slots, [], [], []))  # CPU tensors: the index assignments
    if through_write_kv:
        write_kv(*ours[:4], PagedMetadata(ours[4], [], [], []))
    else:
        triton_write_kv(*ours)
    return [float((_bytes(ours[2]) != _bytes(expected_k)).sum()), float((_bytes(ours[3]) != _bytes(expected_v)).sum())]


def test_kv_write_kernel_matches_the_index_assignments_in_the_interpreter():
    cases = [
        "0, tokens=5, kv_heads=2, head_dim=64",  # decode slots, float32
        "1, tokens=3, kv_heads=3, head_dim=72, copies=2",  # padded heads and dims; a graph's padding rows
        "2, tokens=40, kv_heads=2, head_dim=32, prefill=True, source_dtype=torch.bfloat16",  # a prefill's run
        "3, tokens=6, kv_heads=1, head_dim=16, block_size=4, source_dtype=torch.float16",
        "4, tokens=7, kv_heads=2, head_dim=64, cache_dtype=torch.float16",  # float32 -> float16, rounded
        "5, tokens=9, kv_heads=2, head_dim=64, source_dtype=torch.bfloat16, cache_dtype=FP8, fp8_exact=True",
    ]
    lines = "\n".join(f"print(*check_write({case}), sep='\\n')" for case in cases)
    values = run_interpreted(f"import torch\nfrom tests.engine.test_kernel_kv_write import FP8, check_write\n{lines}")
    assert len(values) == 2 * len(cases)
    assert values == [0.0] * len(values), list(zip(cases, values[::2], values[1::2], strict=True))


def test_the_pytorch_write_stays_the_index_assignment_on_the_cpu():
    """write_kv on CPU tensors never reaches the kernel: the reference path is the one the CPU runs."""
    from unittest import mock

    from engine.ops import attention

    with mock.patch.object(attention, "triton_write_kv", side_effect=AssertionError("the kernel ran on the CPU")):
        assert check_write(6, tokens=4, kv_heads=2, head_dim=16, through_write_kv=True) == [0.0, 0.0]


# --- on a GPU: Qwen3-Next's 2 kv heads x 256, real rounding ----------------------------------------------------------


@cuda
@pytest.mark.parametrize(("source_dtype", "cache_dtype"), [(torch.bfloat16, torch.bfloat16),
                                                           (torch.float32, torch.bfloat16),
                                                           (torch.bfloat16, FP8), (torch.float32, torch.float32)])
@pytest.mark.parametrize(("tokens", "prefill", "copies"), [(1, False, 0), (63, False, 1), (4096, True, 0)])
def test_kv_write_kernel_at_qwen3_next_sizes_on_the_gpu(source_dtype, cache_dtype, tokens, prefill, copies):
    """Bit for bit the torch cast's rounding (to nearest even; fp8 values in range: |x| < 448), through write_kv."""
    values = check_write(7, tokens, 2, 256, num_blocks=300, source_dtype=source_dtype, cache_dtype=cache_dtype,
                         copies=copies, prefill=prefill, device="cuda", through_write_kv=True)
    assert values == [0.0, 0.0], values


@cuda
def test_kv_write_kernel_replays_in_a_cuda_graph():
    """Captured once over fixed k/v/slot buffers, replayed on new values at new slots: the cache follows the torch
    write each time, rows not written keep their bytes."""
    from engine.ops.triton_decode import triton_write_kv

    gpu = _inputs(8, 5, 2, 256, 16, 40, torch.bfloat16, FP8, False, 1, False, "cuda")  # k, v strided views
    k, v, k_cache, v_cache, slots = (t.cpu().clone() for t in gpu)
    triton_write_kv(*gpu)  # compiles outside the capture
    expected = [k_cache, v_cache]
    write_kv(k, v, *expected, PagedMetadata(slots, [], [], []))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_write_kv(*gpu)
    for seed in (9, 10):
        new_k, new_v, _, _, new_slots = _inputs(seed, 5, 2, 256, 16, 40, torch.bfloat16, FP8, False, 1, False)
        for buffer, value in zip((gpu[0], gpu[1], gpu[4]), (new_k, new_v, new_slots), strict=True):
            buffer.copy_(value)
        graph.replay()
        write_kv(new_k, new_v, *expected, PagedMetadata(new_slots, [], [], []))
        torch.cuda.synchronize()
        assert torch.equal(_bytes(gpu[2]), _bytes(expected[0])) and torch.equal(_bytes(gpu[3]), _bytes(expected[1]))
