"""GDN's prefill conv kernels (engine/ops/triton_conv_prefill.py) against the PyTorch per-span path (conv_prefill).

On the CPU, Triton's interpreter runs them in float32 (held to 1e-5): spans of 1, 2, 3, 7 and 40 tokens (shorter and
longer than kernel - 1), fresh and continuing, on shuffled slots (untouched slots keep their bytes), with rows between
spans that no span owns (a mixed step's decode rows: they must stay unwritten), grouped and plain strided inputs,
channel tails; segment widths that give aligned channel runs of 16 to 128 columns (several runs per segment too) and
masked ones; spans longer than a token tile, packed back to back so tiles hold one span's end and the next one's
start, heads straddling tiles, continuing spans shorter than kernel - 1. On a GPU, bf16 and float32 at Qwen3-Next's
sizes (8192 channels: 64 spans x 512, 2,048 tokens over 4 uneven spans) against float32 (1e-2 and 1e-5), and the
wiring through conv_forward in a mixed step.
"""

from __future__ import annotations

import pytest
import torch

from engine.ops.conv import conv_decode, conv_forward, conv_prefill, ungroup
from engine.step_plan import StepContext
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP32, BF16 = 1e-5, 1e-2
GAP = 2  # rows left between consecutive spans, owned by no span


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """||ours - reference|| / ||reference|| (NaN, so failing, where an element was never written)."""
    ours, reference = ours.detach().cpu().double(), reference.detach().cpu().double()
    return float((ours - reference).norm() / reference.norm())


def check_prefill(seed: int, lengths: tuple[int, ...], num_slots: int, groups: int, segments: tuple[int, ...],
                  kernel: int, grouped: bool = True, device: str = "cpu", dtype: torch.dtype = torch.float32,
                  state_dtype: torch.dtype = torch.float32, gap: int = GAP) -> list[float]:
    """The kernel over spans of `lengths` (every other one continuing its slot's state), `gap` rows apart, on a
    strided input: grouped [tokens, groups, width] read through `segments` (each group has 5 unread columns, as GDN's
    z), or plain [tokens, channels] (a row stride of its own). Returns [output error, touched-state error, largest
    untouched-slot change (must be 0), count of written elements outside the spans (must be 0)]."""
    from engine.ops.triton_conv_prefill import triton_conv_prefill

    g = torch.Generator().manual_seed(seed)
    channels = groups * sum(segments)
    starts = [sum(lengths[:i]) + gap * (i + 1) for i in range(len(lengths))]
    tokens = starts[-1] + lengths[-1] + gap
    width = sum(segments) + 5 if grouped else channels // groups
    x = torch.randn(tokens, groups * width + 3, generator=g).to(device, dtype)[:, :groups * width]
    x = x.unflatten(1, (groups, width)) if grouped else x
    weight = (torch.randn(channels, kernel, generator=g) * 0.5).to(device, dtype)
    state = torch.randn(num_slots, channels, kernel - 1, generator=g).to(device, state_dtype)
    slots = torch.randperm(num_slots, generator=g)[:len(lengths)].tolist()
    spans = [(start, start + n, slot, i % 2 == 1)
             for i, (start, n, slot) in enumerate(zip(starts, lengths, slots, strict=True))]

    plain = (ungroup(x, segments) if grouped else x).float()
    expected, reference = state.float().clone(), torch.zeros(tokens, channels, device=device)
    for start, end, slot, continues in spans:
        out, new = conv_prefill(plain[start:end], weight.float(), expected[slot] if continues else None)
        reference[start:end], expected[slot] = out, new.to(state_dtype).float()
    before = state.clone()
    out = torch.full((tokens, channels), float("nan"), dtype=dtype, device=device)
    triton_conv_prefill(x, weight, state, spans, segments if grouped else None, out=out)

    in_span = torch.zeros(tokens, dtype=torch.bool, device=device)
    for start, end, *_ in spans:
        in_span[start:end] = True
    touched = torch.tensor(slots, device=device)
    untouched = torch.ones(num_slots, dtype=torch.bool, device=device)
    untouched[touched] = False
    change = (state[untouched].double() - before[untouched].double()).abs().max() if untouched.any() else 0.0
    return [relative(out[in_span], reference[in_span]), relative(state[touched], expected[touched]), float(change),
            float(out[~in_span].isfinite().sum())]


def _check_interpreted(cases: list[str]) -> None:
    """Run check_prefill(case) for each case under the interpreter: outputs and states within FP32, rows outside the
    spans and slots outside them untouched."""
    lines = "\n".join(f"print(*check_prefill({case}), sep='\\n')" for case in cases)
    values = run_interpreted(f"from tests.engine.test_kernel_conv_prefill import check_prefill\n{lines}")
    assert len(values) == 4 * len(cases)
    for i, case in enumerate(cases):
        out, state, untouched, stray = values[4 * i:4 * i + 4]
        assert out <= FP32 and state <= FP32 and untouched == 0.0 and stray == 0.0, (case, out, state, untouched,
                                                                                       stray)


def test_conv_prefill_kernel_matches_the_pytorch_path_in_the_interpreter():
    cases = [
        "0, lengths=(1, 2, 3, 7, 40, 1, 2, 3), num_slots=11, groups=2, segments=(4, 4, 6), kernel=4",  # GDN's layout
        "1, lengths=(40, 3, 1, 7), num_slots=6, groups=3, segments=(100,), kernel=4, grouped=False",  # 300: 3 blocks
        "2, lengths=(2, 1, 5, 40), num_slots=5, groups=1, segments=(8, 8, 20), kernel=3, gap=0",  # odd kernel, abutting
    ]
    _check_interpreted(cases)


def test_tiles_are_aligned_runs_dividing_every_segment_width_or_masked():
    from engine.ops.triton_conv_prefill import conv_prefill_tiles

    aligned = {(128, 128, 256): 128, (32, 32, 64): 32, (64, 64, 128): 64, (16, 48): 16, (8192,): 128}
    for segments, block_c in aligned.items():
        tiles = conv_prefill_tiles(segments)
        assert tiles.aligned and tiles.block_c == block_c, (segments, tiles)
        assert all(width % tiles.block_c == 0 for width in segments)
    masked = {(4, 4, 6): 8, (100,): 128, (8, 8, 24): 32}  # no power of two >= 16 divides them
    for segments, block_c in masked.items():
        tiles = conv_prefill_tiles(segments)
        assert not tiles.aligned and tiles.block_c == block_c, (segments, tiles)


def test_conv_prefill_kernel_tiles_and_span_edges_in_the_interpreter():
    """Aligned runs of 32, 64, 16 and 128 columns (two runs per segment for some), spans longer than a token tile
    packed back to back (tiles holding one span's end and the next one's start, heads straddling a tile boundary),
    continuing spans of 1 and 2 tokens (shorter than kernel - 1) between long ones; kernels of 4, 3 and 2."""
    from engine.ops.triton_conv_prefill import BLOCK_T

    tile = BLOCK_T
    cases = [
        # Span 0 ends inside tile 0, span 1 (continuing) starts there; span 3's head straddles tiles 1 and 2.
        f"3, lengths=({tile - 6}, 1, {tile + 3}, 40, 2, {2 * tile}), num_slots=9, groups=2, segments=(32, 32, 64), "
        "kernel=4, gap=0",
        f"4, lengths=(2, {tile + 1}, 1, {tile - 1}), num_slots=4, groups=3, segments=(64, 64, 128), kernel=4",
        f"5, lengths=({tile + 30}, 3, 2, {tile}), num_slots=6, groups=2, segments=(16, 48), kernel=3, gap=0",
        f"6, lengths=(1, 2, {tile}, {tile + 2}), num_slots=5, groups=1, segments=(256,), kernel=2, grouped=False, "
        "gap=1",
    ]
    _check_interpreted(cases)


# --- on a GPU: bf16 at Qwen3-Next's sizes against the float32 reference -----------------------------------------


@cuda
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32])
def test_conv_prefill_kernel_in_bf16_on_the_gpu(state_dtype):
    """64 spans x 512 tokens over 8192 channels (16 key heads of q 128 | k 128 | v 2 x 128), kernel 4."""
    values = check_prefill(0, (512,) * 64, 80, 16, (128, 128, 256), 4, device="cuda", dtype=torch.bfloat16,
                           state_dtype=state_dtype)
    out, state, untouched, stray = values
    assert out <= BF16 and state <= BF16 and untouched == 0.0 and stray == 0.0, values


@cuda
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.bfloat16, BF16), (torch.float32, FP32)])
@pytest.mark.parametrize("gap", [0, GAP])
def test_conv_prefill_kernel_at_the_bench_shape_on_the_gpu(dtype, tolerance, gap):
    """2,048 tokens over 4 uneven spans (a continuing one shorter than kernel - 1) at the bench model's 16 key heads
    of q 128 | k 128 | v 256, kernel 4: aligned runs of 128 columns, float32 math against the float32 reference."""
    values = check_prefill(1, (700, 2, 846, 500), 8, 16, (128, 128, 256), 4, device="cuda", dtype=dtype,
                           state_dtype=dtype, gap=gap)
    out, state, untouched, stray = values
    assert out <= tolerance and state <= tolerance and untouched == 0.0 and stray == 0.0, values


@cuda
def test_conv_forward_runs_a_mixed_step_through_the_kernels_on_the_gpu():
    """A step of a decode row, a continuing chunk, a new prompt and another decode row: conv_forward in bf16 on the GPU
    (both Triton kernels) against its float32 path, states included."""
    g = torch.Generator().manual_seed(5)
    groups, segments, kernel, num_slots = 16, (128, 128, 256), 4, 8
    channels = groups * sum(segments)
    query_lens, cached_lens, slots = [1, 37, 300, 1], [9, 64, 0, 2], [6, 1, 3, 4]
    x = torch.randn(sum(query_lens), groups, sum(segments) + 256, generator=g).bfloat16()
    weight = (torch.randn(channels, kernel, generator=g) * 0.5).bfloat16()
    state = torch.randn(num_slots, channels, kernel - 1, generator=g)
    results = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        ctx = StepContext(query_lens, cached_lens, slots, [[0]] * 4, 16,
                          torch.zeros(sum(query_lens), dtype=torch.long, device=device))
        pool = state.clone().to(device)  # a copy on the CPU too: each run steps its own pool from the same start
        results.append((conv_forward(x.to(device, dtype), weight.to(device, dtype), pool, ctx, segments), pool))
    (reference, expected), (ours, pool) = results
    assert relative(ours, reference) <= BF16 and relative(pool, expected) <= BF16
    # The decode rows took the decode kernel's window slide, the spans the prefill kernel.
    rows = torch.tensor([0, 338])
    decoded, _ = conv_decode(ungroup(x[rows].float(), segments), weight.float(), state[[6, 4]])
    assert relative(ours[rows.cuda()], decoded) <= BF16
