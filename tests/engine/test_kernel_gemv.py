"""The small-batch GEMV (engine/ops/triton_gemv.py) and `project` (engine/layers/linear.py), which routes out_proj and
o_proj to it.

CPU: the kernel under Triton's interpreter in float32 against the float64 product (outputs poisoned with NaN first, so
an unwritten element fails): 1, 3 and 8 rows, N and K off the block sizes, strided x and out, with and without bias,
the chosen tiles and forced split-K ones; the tile choice's promises; `project` is F.linear on the CPU, and with the
kernel let in (interpreter) the hybrid model's GDN and attention layers give F.linear's float32 outputs.
CUDA (the lead's H200): bf16 at the real out_proj shape against float32, inside a CUDA graph, `project` takes the
kernel only for 1..MAX_ROWS half-precision rows, and the hybrid layers at batch 1 give F.linear's outputs.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from engine_checkpoints import TinyRunner
from interpret import run_interpreted
from torch import nn

from engine.layers import linear
from engine.layers.attention import Attention
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.loader import load_model

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP32 = 1e-5
BF16 = 1e-2


def _rel(ours: torch.Tensor, reference: torch.Tensor) -> float:
    ours, reference = ours.double(), reference.double()
    return float((ours - reference).norm() / reference.norm())


def _case(g: torch.Generator, rows: int, n: int, k: int, bias: bool):
    """x as a strided view (row stride 3k + 1, K stride 1 or 2 by rows' parity), weight, bias or None."""
    wide = torch.randn(rows, 3 * k + 1, generator=g)
    x = wide[:, 1:2 * k + 1:2] if rows % 2 else wide[:, 1:k + 1]
    weight = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return x, weight, b


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


def _report_gemv() -> None:
    """Run in the interpreter: prints (error, bound) pairs, one per case."""
    from engine.ops.triton_gemv import GemvTiles, gemv

    g = torch.Generator().manual_seed(0)
    # Split-K forced: three splits ending mid-step, and eight splits of which the last ones lie past K (all masked).
    forced = (GemvTiles(block_n=8, block_k=32, split_k=3), GemvTiles(block_n=16, block_k=16, split_k=8))
    for rows in (1, 3, 8):
        for n, k in ((37, 300), (70, 45)):
            for bias in (False, True):
                x, weight, b = _case(g, rows, n, k, bias)
                reference = _reference(x, weight, b)
                for tiles in (None, *forced):
                    out = torch.full((rows, 2 * n), float("nan"))[:, ::2]  # written through its strides
                    gemv(x, weight, b, out=out, tiles=tiles)
                    print(_rel(out, reference), FP32)
                    print(_rel(gemv(x, weight, b, tiles=tiles), reference), FP32)
    # project's leading dims, with the kernel let in on the CPU: [2, 3, K] is six rows.
    linear._gemv_serves = lambda layer, x: True
    layer = nn.Linear(45, 37)
    x = torch.randn(2, 3, 45, generator=g)
    with torch.no_grad():
        ours = linear.project(layer, x)
        print(float(ours.shape == (2, 3, 37)), 1.0)
        print(_rel(ours, _reference(x, layer.weight, layer.bias)), FP32)


def test_gemv_kernel_in_the_interpreter():
    values = run_interpreted("from test_kernel_gemv import _report_gemv; _report_gemv()")
    pairs = list(zip(values[::2], values[1::2], strict=True))
    assert len(pairs) == 3 * 2 * 2 * 3 * 2 + 2
    assert all(error <= bound for error, bound in pairs[:-2]), pairs
    assert pairs[-2] == (1.0, 1.0) and pairs[-1][0] <= FP32


@pytest.mark.parametrize("rows", range(1, 9))
def test_tiles_cover_every_sm_at_out_proj_shapes(rows):
    triton_gemv = pytest.importorskip("engine.ops.triton_gemv")
    sms = 132
    for n, k in ((2048, 4096), (4096, 2048), (1024, 8192)):
        tiles = triton_gemv.choose_tiles(rows, n, k, sms)
        programs = -(-n // tiles.block_n) * tiles.split_k
        assert programs >= sms, (n, k, tiles)
        assert tiles.block_k & (tiles.block_k - 1) == 0 and tiles.block_n & (tiles.block_n - 1) == 0
        assert -(-k // tiles.block_k) >= tiles.split_k  # every split has K to read
    wide = triton_gemv.choose_tiles(rows, 65536, 4096, sms)
    assert wide.split_k == 1  # columns alone cover the SMs: no workspace round trip
    assert triton_gemv.choose_tiles(rows, 512, 8192, sms).split_k > 1  # 64 column blocks: split to fill the card


def test_gemv_refuses_more_rows_than_it_is_built_for():
    triton_gemv = pytest.importorskip("engine.ops.triton_gemv")
    x, weight = torch.randn(triton_gemv.MAX_ROWS + 1, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="rows"):
        triton_gemv.gemv(x, weight)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8, 9])
def test_project_is_f_linear_on_the_cpu(rows, bias, monkeypatch):
    calls = []
    monkeypatch.setattr(linear, "gemv", lambda *args, **kwargs: calls.append(args))
    layer = nn.Linear(48, 20, bias=bias)
    x = torch.randn(rows, 48)
    with torch.no_grad():
        assert torch.equal(linear.project(layer, x), layer(x))
        assert torch.equal(linear.project(layer, x.view(1, rows, 48)), layer(x.view(1, rows, 48)))
    assert calls == []


PREFILL, DECODE = [3, 17, 40, 9, 88], (5, 60, 7, 100)
MIXERS = 4  # the tiny hybrid checkpoint's layers: GDN and attention alternate
EXPECTED_ROWS = [len(PREFILL)] * MIXERS + [1] * MIXERS * len(DECODE)  # gemv's calls, in order: one per mixer and step


def _recording(gemv, rows_seen: list[int]):
    """gemv, appending each call's row count to rows_seen."""

    def spy(x, *args, **kwargs):
        rows_seen.append(x.shape[0])
        return gemv(x, *args, **kwargs)

    return spy


def _mixer_outputs(folder, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every GDN and attention layer's output, step by step, over a prefill and four decode steps of one sequence
    (fixed tokens: a flipped argmax must not change the inputs)."""
    model = load_model(folder, device=device, dtype=dtype)
    outputs = []
    for module in model.modules():
        if isinstance(module, GatedDeltaNet | Attention):
            module.register_forward_hook(lambda _module, _args, out: outputs.append(out.float().cpu()))
    runner = TinyRunner(model, device=device, block_size=16, num_blocks=16)
    for tokens in (PREFILL, *([token] for token in DECODE)):
        runner.step({"a": tokens})
    return outputs


def _report_layers(folder: str) -> None:
    """Run in the interpreter: the mixers' outputs in float32 with project's kernel let in on the CPU, against
    F.linear's; prints (error, bound) pairs, then (1, 1) if gemv served exactly the calls expected."""
    from engine.ops.triton_gemv import MAX_ROWS, gemv

    reference = _mixer_outputs(folder, "cpu", torch.float32)
    rows_seen = []
    linear.gemv = _recording(gemv, rows_seen)
    linear._gemv_serves = lambda layer, x: math.prod(x.shape[:-1]) <= MAX_ROWS
    for ours, theirs in zip(_mixer_outputs(folder, "cpu", torch.float32), reference, strict=True):
        print(_rel(ours, theirs), FP32)
    print(float(rows_seen == EXPECTED_ROWS), 1.0)


def test_the_hybrid_layers_with_the_kernel_in_the_interpreter(reference_checkpoint):
    folder, _ = reference_checkpoint("qwen3_next_dense")
    values = run_interpreted(f"from test_kernel_gemv import _report_layers; _report_layers({str(folder)!r})")
    pairs = list(zip(values[::2], values[1::2], strict=True))
    assert len(pairs) == len(EXPECTED_ROWS) + 1 and pairs[-1] == (1.0, 1.0)
    assert all(error <= bound for error, bound in pairs), pairs


# --- on a GPU: bf16 at real sizes, CUDA graphs, the layers ------------------------------------------------------


@cuda
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_on_the_gpu_against_float32(bias):
    from engine.ops.triton_gemv import MAX_ROWS, GemvTiles, gemv

    g = torch.Generator().manual_seed(1)
    for rows in (1, 3, 4, MAX_ROWS):
        for n, k in ((2048, 4096), (2050, 4100), (8192, 2048)):
            x, weight, b = _case(g, rows, n, k, bias)
            reference = _reference(x, weight, b)
            x16, w16 = x.cuda().bfloat16(), weight.cuda().bfloat16()
            b16 = None if b is None else b.cuda().bfloat16()
            for tiles in (None, GemvTiles(block_n=8, block_k=128, split_k=1), GemvTiles(8, 128, 4)):
                ours = gemv(x16, w16, b16, tiles=tiles)
                assert ours.dtype == torch.bfloat16
                assert _rel(ours.cpu(), reference) <= BF16, (rows, n, k, tiles)


@cuda
def test_gemv_and_project_replay_in_a_cuda_graph():
    from engine.ops.triton_gemv import GemvTiles, gemv

    g = torch.Generator().manual_seed(2)
    layer = nn.Linear(4096, 2048, bias=True).cuda().bfloat16()
    x = torch.zeros(2, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        plain_tiles, split_tiles = GemvTiles(8, 128, 1), GemvTiles(8, 128, 2)
        for tiles in (plain_tiles, split_tiles):  # compile outside the capture
            gemv(x, layer.weight, tiles=tiles)
        linear.project(layer, x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plain = gemv(x, layer.weight, tiles=plain_tiles)
            split = gemv(x, layer.weight, tiles=split_tiles)  # the workspace comes from the graph's pool
            projected = linear.project(layer, x)
        for _ in range(2):
            fresh = torch.randn(2, 4096, generator=g)
            x.copy_(fresh)
            graph.replay()
            weight, bias = layer.weight.float().cpu(), layer.bias.float().cpu()
            reference = _reference(fresh, weight, None)
            assert _rel(plain.cpu(), reference) <= BF16 and _rel(split.cpu(), reference) <= BF16
            assert _rel(projected.cpu(), _reference(fresh, weight, bias)) <= BF16


@cuda
def test_project_takes_the_kernel_for_few_rows_on_the_gpu(monkeypatch):
    from engine.ops.triton_gemv import gemv

    rows_seen = []
    monkeypatch.setattr(linear, "gemv", _recording(gemv, rows_seen))
    layer = nn.Linear(512, 256).cuda().bfloat16()
    with torch.inference_mode():
        for shape in ((1, 512), (2, 4, 512), (9, 512), (3, 3, 512)):
            x = torch.randn(shape, device="cuda").bfloat16()
            ours = linear.project(layer, x)
            assert ours.shape == (*shape[:-1], 256)
            assert _rel(ours, F.linear(x.float(), layer.weight.float(), layer.bias.float())) <= BF16
        small = torch.randn(2, 512, device="cuda")
        layer.float()
        assert torch.equal(linear.project(layer, small), F.linear(small, layer.weight, layer.bias))
    assert rows_seen == [1, 8]  # nine rows, and float32, are F.linear's


@cuda
def test_the_hybrid_layers_at_batch_1_give_f_linears_outputs(reference_checkpoint, monkeypatch):
    from engine.ops.triton_gemv import gemv

    folder, _ = reference_checkpoint("qwen3_next_dense")  # no router: a bf16 rounding cannot move a token's expert
    monkeypatch.setattr(linear, "gemv", None)
    reference = _mixer_outputs(folder, "cuda", torch.bfloat16)
    rows_seen = []
    monkeypatch.setattr(linear, "gemv", _recording(gemv, rows_seen))
    ours = _mixer_outputs(folder, "cuda", torch.bfloat16)
    assert rows_seen == EXPECTED_ROWS  # every out_proj and o_proj went through the kernel
    for index, (a, b) in enumerate(zip(ours, reference, strict=True)):
        assert _rel(a, b) <= BF16, divmod(index, MIXERS)
