"""The norm kernels (engine/ops/triton_norm.py), the residual-stream decoder and the merged q/k/v projection.

Kernels run under Triton's interpreter on the CPU (float32 against a float64 formula; float16 against the eager code,
whose roundings they must reproduce) and, where a GPU is, in bf16 at real sizes. The interpreter rounds float32 to
bf16 by truncation (real Triton rounds to nearest even), so in the interpreter bf16 is held to a looser bound and the
exact rounding placement is held through float16, which it rounds correctly. The residual add also takes parts (an
MoE's unsummed expert outputs): summed in float32, rounded once, then added as before. The model checks run on the
CPU: the residual-stream layers and the merged projection must give today's values, and a layer range sums parts at
its end.
"""

import pytest
import torch

from engine.layers.merge import merge_projections
from engine.layers.norm import RMSNorm, add_rms_norm, gated_rms_norm, rms_norm, sum_parts
from engine.layers.step import LayerStep
from engine.loader import load_model
from engine.ops import fused
from engine.ops.attention import PagedMetadata
from tests.support.engine_checkpoints import TinyRunner
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
EPS = 1e-6
# Half-precision bounds against the eager code in the same dtype: float16 is rounded as eager rounds it, bf16 is
# truncated by the interpreter (up to an ulp at each of the kernel's roundings).
INTERPRETED_BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1.5e-2}


def _rel(ours: torch.Tensor, reference: torch.Tensor) -> float:
    ours, reference = ours.double(), reference.double()
    return float((ours - reference).norm() / reference.norm())


def _exact_norm(summed: torch.Tensor, weight: torch.Tensor, one_centred: bool) -> torch.Tensor:
    """The float64 formula; `summed` is already the dtype-rounded residual sum."""
    s = summed.double()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)
    return normed * (1 + weight.double()) if one_centred else normed * weight.double()


def _inputs(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, count: int) -> list[torch.Tensor]:
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(count)]


def _report_rms_norm() -> None:
    """Run in the interpreter: prints (error, bound) pairs for every case of kernel a."""
    from engine.ops.triton_norm import triton_rms_norm

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((5, 72), (3, 2048)):
            for one_centred in (True, False):
                x, residual = _inputs(g, shape, dtype, 2)
                weight = (torch.randn(shape[-1], generator=g) * 0.2 + (0.0 if one_centred else 1.0)).to(dtype)
                summed = residual + x
                out = torch.full_like(x, float("nan"))
                plain = triton_rms_norm(x, weight, EPS, one_centred, out=out)
                in_place, summed_out = residual.clone(), torch.full_like(x, float("nan"))
                fused_out = triton_rms_norm(x, weight, EPS, one_centred, in_place)
                kept = residual.clone()
                out_of_place = triton_rms_norm(x, weight, EPS, one_centred, kept, summed_out)
                if dtype == torch.float32:
                    references = (_exact_norm(x, weight, one_centred), _exact_norm(summed, weight, one_centred))
                else:
                    references = (rms_norm(x, weight, EPS, one_centred), add_rms_norm(x, residual, weight, EPS,
                                                                                     one_centred)[0])
                bound = INTERPRETED_BOUNDS[dtype]
                sum_bound = 0.0 if dtype != torch.bfloat16 else 8e-3  # the sum's own rounding: exact but in bf16
                for error, limit in ((_rel(plain, references[0]), bound), (_rel(fused_out, references[1]), bound),
                                     (_rel(out_of_place, references[1]), bound), (_rel(in_place, summed), sum_bound),
                                     (_rel(summed_out, summed), sum_bound), (_rel(kept, residual), 0.0)):
                    print(error, limit)
    # q/k norm: [tokens, heads, head_dim] read from a strided slice of the projection, as attention passes it.
    q = torch.randn(3, 4, 2 * 16, generator=g).chunk(2, dim=-1)[0]
    weight = torch.randn(16, generator=g) * 0.2
    print(_rel(triton_rms_norm(q, weight, EPS, True), _exact_norm(q, weight, True)), 1e-5)


def _report_rms_norm_parts() -> None:
    """Run in the interpreter: prints (error, bound) pairs for the residual add of parts [..., P, width]."""
    from engine.ops.triton_norm import triton_rms_norm

    g = torch.Generator().manual_seed(6)
    # (parts, residual) shapes: Qwen3-Next's 11 slots, a 4-D case, one part; the first parts a strided slice.
    shapes = (((5, 12, 72), (5, 72)), ((2, 3, 4, 64), (2, 3, 64)), ((3, 1, 2048), (3, 2048)))
    for dtype in (torch.float32, torch.float16):
        for (parts_shape, residual_shape), one_centred in [(s, c) for s in shapes for c in (True, False)]:
            parts = torch.randn(*parts_shape, generator=g).to(dtype)
            parts = parts[:, :11] if parts_shape[1] == 12 else parts
            residual = torch.randn(*residual_shape, generator=g).to(dtype)
            weight = (torch.randn(parts.shape[-1], generator=g) * 0.2 + (0.0 if one_centred else 1.0)).to(dtype)
            kept, summed_out, in_place = residual.clone(), torch.full_like(residual, float("nan")), residual.clone()
            out = torch.full_like(residual, float("nan"))
            triton_rms_norm(parts, weight, EPS, one_centred, kept, summed_out, out=out)
            in_place_out = triton_rms_norm(parts, weight, EPS, one_centred, in_place)
            if dtype == torch.float32:
                summed = residual.double() + parts.double().sum(-2)
                reference = _exact_norm(summed, weight, one_centred)
            else:
                reference, summed = add_rms_norm(parts, residual, weight, EPS, one_centred)
            bound = INTERPRETED_BOUNDS[dtype]
            for error, limit in ((_rel(out, reference), bound), (_rel(in_place_out, reference), bound),
                                 (_rel(summed_out, summed), bound / 10), (_rel(in_place, summed), bound / 10),
                                 (_rel(kept, residual), 0.0)):
                print(error, limit)


def _report_gated_rms_norm() -> None:
    """Run in the interpreter: prints (error, bound) pairs for every case of kernel b."""
    from engine.ops.triton_norm import triton_gated_rms_norm

    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((6, 72), (4, 128)):
            x, gate = _inputs(g, shape, dtype, 2)
            weight = (torch.randn(shape[-1], generator=g) * 0.2 + 1.0).to(dtype)
            out = triton_gated_rms_norm(x, gate, weight, EPS, out=torch.full_like(x, float("nan")))
            if dtype == torch.float32:
                s = x.double()
                normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
                reference = normed * torch.nn.functional.silu(gate.double())
            else:
                reference = gated_rms_norm(x, gate, weight, EPS)
            print(_rel(out, reference), INTERPRETED_BOUNDS[dtype])
    # The gate as GDN passes it: a strided slice of a wider projection.
    x, wide = torch.randn(5, 72, generator=g), torch.randn(5, 3 * 72, generator=g)
    gate, weight = wide[:, 72:144], torch.randn(72, generator=g)
    print(_rel(triton_gated_rms_norm(x, gate, weight, EPS), gated_rms_norm(x.double(), gate.double(),
                                                                          weight.double(), EPS)), 1e-5)
    # GDN's z, grouped: 3 tokens x 2 key heads x 3 value heads each, from a projection row wider than the groups.
    x, wide = torch.randn(3, 6, 72, generator=g), torch.randn(3, 2 * 5 * 72 + 8, generator=g)
    gate = wide[:, :2 * 5 * 72].unflatten(-1, (2, 5, 72))[:, :, 2:]  # each key head's last three of five columns
    reference = gated_rms_norm(x.double(), gate.reshape(x.shape).double(), weight.double(), EPS)
    print(_rel(triton_gated_rms_norm(x, gate, weight, EPS), reference), 1e-5)


def _interpreted_pairs(function: str) -> list[tuple[float, float]]:
    values = run_interpreted(f"from tests.engine.test_kernel_norm import {function}; {function}()")
    return list(zip(values[::2], values[1::2], strict=True))


def test_rms_norm_kernel_in_the_interpreter():
    pairs = _interpreted_pairs("_report_rms_norm")
    assert len(pairs) == 3 * 2 * 2 * 6 + 1
    assert all(error <= bound for error, bound in pairs), pairs


def test_rms_norm_kernel_sums_parts_in_the_interpreter():
    pairs = _interpreted_pairs("_report_rms_norm_parts")
    assert len(pairs) == 2 * 3 * 2 * 5
    assert all(error <= bound for error, bound in pairs), pairs


def test_gated_rms_norm_kernel_in_the_interpreter():
    pairs = _interpreted_pairs("_report_gated_rms_norm")
    assert len(pairs) == 3 * 2 + 2
    assert all(error <= bound for error, bound in pairs), pairs


@pytest.mark.parametrize("one_centred", [True, False])
def test_eager_residual_norm_is_the_add_then_the_norm(one_centred):
    g = torch.Generator().manual_seed(2)
    x, residual = _inputs(g, (7, 64), torch.float32, 2)
    norm = RMSNorm(64, EPS, one_centred)
    torch.nn.init.normal_(norm.weight, std=0.3)
    kept = residual.clone()
    with torch.no_grad():
        out, summed = norm(x, residual)
        assert torch.equal(summed, kept + x) and torch.equal(residual, kept)  # eager never writes the residual
        assert torch.equal(out, rms_norm(kept + x, norm.weight, EPS, one_centred))


@pytest.mark.parametrize("one_centred", [True, False])
def test_eager_residual_norm_sums_parts_once_then_adds(one_centred):
    g = torch.Generator().manual_seed(7)
    parts = torch.randn(7, 11, 64, generator=g).bfloat16()
    residual = torch.randn(7, 64, generator=g).bfloat16()
    norm = RMSNorm(64, EPS, one_centred).bfloat16()
    torch.nn.init.normal_(norm.weight, std=0.3)
    once = parts.float().sum(1).bfloat16()
    stepwise = parts[:, 0]
    for part in parts.unbind(1)[1:]:
        stepwise = stepwise + part
    assert not torch.equal(once, stepwise)  # where the rounding happens shows
    with torch.no_grad():
        out, summed = norm(parts, residual)
    assert torch.equal(sum_parts(parts, residual), once) and torch.equal(sum_parts(residual, residual), residual)
    assert torch.equal(summed, residual + once)
    assert torch.equal(out, rms_norm(residual + once, norm.weight, EPS, one_centred))


class _AsParts(torch.nn.Module):
    """An MLP whose output comes as two halves, [tokens, 2, hidden], as the MoE's Triton path returns its parts."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.inner = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        return torch.stack([out * 0.5, out * 0.5], dim=-2)  # halves of a float32 value sum back to it exactly


def test_layers_and_the_range_end_sum_an_mlps_parts(reference_checkpoint):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    ranges = [load_model(folder, 0, 2), load_model(folder, 2, 4)]
    whole = _steps(TinyRunner(ranges))
    for model in ranges:
        for layer in model.layers.values():
            layer.mlp = _AsParts(layer.mlp)
    parts = _steps(TinyRunner(ranges))  # every norm and the first range's end now receive parts
    assert all(torch.equal(a, b) for a, b in zip(parts, whole, strict=True))


# --- the model: merged projections and the residual stream give today's values -------------------------------------


def _legacy_forward(model, hidden_or_ids, ctx, caches):
    """The model as it ran before the residual stream: x + mixer(norm(x)), then + mlp(norm(x)), then the final norm."""
    hidden = model.embed_tokens(hidden_or_ids) if model.embed_tokens is not None else hidden_or_ids
    step = LayerStep(ctx, caches)
    if model.rotary is not None:
        step.paged = PagedMetadata.build(ctx)
        step.cos, step.sin = model.rotary.cos_sin(ctx.positions, hidden.dtype)
    for layer in model.layers.values():
        hidden = hidden + getattr(layer, layer.mixer_name)(layer.input_layernorm(hidden), step)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.norm(hidden) if model.norm is not None else hidden


class _Legacy:
    """A layer range that runs _legacy_forward; everything else is the wrapped model's."""

    def __init__(self, model):
        self.model = model

    def __call__(self, hidden_or_ids, ctx, caches):
        return _legacy_forward(self.model, hidden_or_ids, ctx, caches)

    def __getattr__(self, name):
        return getattr(self.model, name)


def _steps(runner: TinyRunner) -> list[torch.Tensor]:
    prompts = {"a": list(range(1, 12)), "b": list(range(30, 35))}
    outs = [runner.step(prompts)]
    for _ in range(3):
        outs.append(runner.step({name: [int(row.argmax())] for name, row in zip(prompts, outs[-1], strict=True)}))
    return outs


@pytest.mark.parametrize("case", ["qwen3_next_tied_mixed", "llama_untied", "qwen2_bias"])
def test_the_residual_stream_gives_the_old_layers_values(case, reference_checkpoint):
    folder, _ = reference_checkpoint(case)
    whole = load_model(folder)
    ranges = [load_model(folder, 0, 1), load_model(folder, 1, 3), load_model(folder, 3, 4)]
    for models in ([whole], ranges):
        ours = _steps(TinyRunner(models))
        legacy = _steps(TinyRunner([_Legacy(model) for model in models]))
        assert all(torch.equal(a, b) for a, b in zip(ours, legacy, strict=True))


@pytest.mark.parametrize("case", ["qwen3_next_moe", "qwen2_bias", "qwen3_tied"])
def test_merged_qkv_projection_gives_the_separate_projections_values(case, reference_checkpoint):
    folder, _ = reference_checkpoint(case)
    model = load_model(folder)
    names = sorted(name for name, _ in model.named_parameters())
    separate = _steps(TinyRunner(model))
    merge_projections(model)
    attention = [m for m in model.modules() if hasattr(m, "qkv_weight")]
    assert attention and all(m.qkv_weight is not None for m in attention)
    for m in attention:
        assert m.q_proj.weight.data_ptr() == m.qkv_weight.data_ptr()  # the parameters are views of the merged rows
        assert (m.qkv_bias is not None) == (m.q_proj.bias is not None)
    assert sorted(name for name, _ in model.named_parameters()) == names  # no new parameter or name
    assert not any(name.endswith(("qkv_weight", "qkv_bias")) for name in model.state_dict())
    merged = _steps(TinyRunner(model))
    for a, b in zip(merged, separate, strict=True):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max()


# --- on a GPU: the bf16 kernels at real sizes ---------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("one_centred", [True, False])
def test_rms_norm_kernel_on_the_gpu(one_centred, monkeypatch):
    from engine.ops.triton_norm import triton_rms_norm

    monkeypatch.setattr(fused, "enabled", False)  # the eager bf16 code as written, not Inductor's float32 version
    g = torch.Generator().manual_seed(3)
    for tokens in (1, 37, 300):
        x, residual = _inputs(g, (tokens, 2048), torch.float32, 2)
        weight = torch.randn(2048, generator=g) * 0.1 + (0.0 if one_centred else 1.0)
        x16, residual16, weight16 = (t.cuda().bfloat16() for t in (x, residual, weight))
        summed16 = residual16 + x16
        out = torch.full_like(x16, float("nan"))
        triton_rms_norm(x16, weight16, EPS, one_centred, residual16, out=out)
        assert torch.equal(residual16, summed16)  # in place, rounded exactly as the eager add
        assert _rel(out.cpu(), _exact_norm(residual + x, weight, one_centred)) <= 1e-2
        assert _rel(out, rms_norm(summed16, weight16, EPS, one_centred)) <= 4e-3
        plain = triton_rms_norm(x16, weight16, EPS, one_centred, out=torch.full_like(x16, float("nan")))
        assert _rel(plain.cpu(), _exact_norm(x, weight, one_centred)) <= 1e-2
    # q/k norm at head_dim 128, read from the strided [query | gate] projection.
    q = torch.randn(37, 16, 256, generator=g).chunk(2, dim=-1)[0]
    weight = torch.randn(128, generator=g) * 0.1
    ours = triton_rms_norm(q.cuda().bfloat16(), weight.cuda().bfloat16(), EPS, one_centred)
    assert _rel(ours.cpu(), _exact_norm(q, weight, one_centred)) <= 1e-2


@cuda
def test_gated_rms_norm_kernel_on_the_gpu(monkeypatch):
    from engine.ops.triton_norm import triton_gated_rms_norm

    monkeypatch.setattr(fused, "enabled", False)
    g = torch.Generator().manual_seed(4)
    x, gate = _inputs(g, (592, 128), torch.float32, 2)
    weight = torch.randn(128, generator=g) * 0.1 + 1.0
    x16, gate16, weight16 = (t.cuda().bfloat16() for t in (x, gate, weight))
    ours = triton_gated_rms_norm(x16, gate16, weight16, EPS, out=torch.full_like(x16, float("nan")))
    assert _rel(ours.cpu(), gated_rms_norm(x, gate, weight, EPS)) <= 1e-2
    assert _rel(ours, gated_rms_norm(x16, gate16, weight16, EPS)) <= 4e-3
    # GDN's z at Qwen3-Next's sizes: 16 key heads of 2 value heads each, from the merged projection's row.
    row = torch.randn(37, 16 * 768 + 64, generator=g)
    z = row[:, :16 * 768].unflatten(-1, (16, 768))[..., 512:].unflatten(-1, (2, 128))
    x = torch.randn(37, 32, 128, generator=g)
    ours = triton_gated_rms_norm(x.cuda().bfloat16(), z.cuda().bfloat16(), weight16, EPS)
    assert _rel(ours.cpu(), gated_rms_norm(x, z.reshape(x.shape), weight, EPS)) <= 1e-2


@cuda
def test_the_norm_module_updates_the_residual_in_place_and_replays_in_a_graph(monkeypatch):
    monkeypatch.setattr(fused, "enabled", False)
    g = torch.Generator().manual_seed(5)
    norm = RMSNorm(2048, EPS, one_centred=True).cuda().bfloat16()
    x, residual = (t.cuda().bfloat16() for t in _inputs(g, (8, 2048), torch.float32, 2))
    kept = residual.clone()
    with torch.inference_mode():
        _, summed = norm(x, residual, in_place=False)
        assert torch.equal(residual, kept) and torch.equal(summed, kept + x)
        out, summed = norm(x, residual)
        assert summed is residual and torch.equal(residual, kept + x)
        # Captured, the kernel reads whatever the input buffers hold at replay.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = norm(x, residual)
        for _ in range(2):
            fresh_x, fresh_residual = (t.cuda().bfloat16() for t in _inputs(g, (8, 2048), torch.float32, 2))
            x.copy_(fresh_x)
            residual.copy_(fresh_residual)
            graph.replay()
            assert torch.equal(residual, fresh_residual + fresh_x)
            assert _rel(out, add_rms_norm(fresh_x, fresh_residual, norm.weight, EPS, True)[0]) <= 4e-3


@cuda
@pytest.mark.parametrize("one_centred", [True, False])
def test_rms_norm_kernel_sums_parts_on_the_gpu(one_centred, monkeypatch):
    """Qwen3-Next's 11 parts (10 routed experts and the shared one) added to the residual, then normed."""
    monkeypatch.setattr(fused, "enabled", False)
    g = torch.Generator().manual_seed(8)
    norm = RMSNorm(2048, EPS, one_centred).cuda()
    torch.nn.init.normal_(norm.weight, std=0.1, mean=0.0 if one_centred else 1.0)
    norm = norm.bfloat16()
    for tokens in (1, 8, 300):
        parts, residual = torch.randn(tokens, 11, 2048, generator=g) * 0.1, torch.randn(tokens, 2048, generator=g)
        parts16, residual16 = parts.cuda().bfloat16(), residual.cuda().bfloat16()
        want = residual16 + parts16.float().sum(1).bfloat16()  # the eager sum: float32, rounded once, then the add
        with torch.inference_mode():
            out, summed = norm(parts16, residual16, in_place=False)
            # The kernel's float32 order of the parts may round a few sums to the neighbouring bf16 value.
            assert float((summed != want).float().mean()) <= 0.01 and _rel(summed, want) <= 1e-3
            exact = _exact_norm(residual + parts.sum(1), norm.weight.float().cpu(), one_centred)
            assert _rel(out.cpu(), exact) <= 1e-2
            assert _rel(out, add_rms_norm(parts16, residual16, norm.weight, EPS, one_centred)[0]) <= 4e-3
            # Captured, it reads whatever the parts and the residual hold at replay, and updates the residual in place.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out, _ = norm(parts16, residual16)
            kept = residual16.clone()
            parts16.copy_(torch.randn(tokens, 11, 2048, generator=g).cuda().bfloat16())
            graph.replay()
            fresh = kept + parts16.float().sum(1).bfloat16()
            assert float((residual16 != fresh).float().mean()) <= 0.01
            assert _rel(out, add_rms_norm(parts16, kept, norm.weight, EPS, one_centred)[0]) <= 4e-3
