"""The MoE's pre-norm folded into the router's partials launch (engine/ops/triton_router.py::normed_router_partials)
and the decoder layer that uses it (engine/layers/decoder.py, SparseMoE.forward_with_norm).

The reference is the two launches the fold replaces: triton_norm's _rms_norm_kernel (residual add, then the norm),
then router_partials of its output. The new residual must be exact (the same float32 add, rounded once). The normed
rows may differ in the last place: the fold sums a row's squares chunk by chunk (elementwise over the chunks, then
one reduction), the norm kernel in one reduction of the whole row, so the float32 sum (and rsqrt of it) can differ
by an ulp, which survives the final rounding only near a rounding boundary: within one bf16 ulp on the GPU (these
cases come out exact in bf16 in the interpreter, so they are held exact there), a few float32 ulps in float32.
The partials must be exactly router_partials of the normed rows the fold wrote (the dot reads what is stored), and
sum to the separate path's logits. CPU: Triton's interpreter, float32 and bf16 (whose tl.dot the interpreter
multiplies as raw bits: there the logits are only compared with the same dot's), 1, 5 and 40 tokens (one tile and
three), both norm forms, strided inputs, a hidden size that is not a multiple of a chunk. The decoder layer with the
fold against the layer with it disabled, on the CPU (the Triton path forced on for float32) and, in bf16 at
Qwen3-Next's sizes, on the GPU.
"""


import pytest
import torch

from engine.layers.decoder import DecoderLayer
from engine.layers.moe import SparseMoE
from tests.support.engine_checkpoints import relative_error
from tests.support.interpret import run_interpreted
from tests.support.moe_layers import BF16, EPS, decoder_layer, gpu_layer, moe_layer, poison_empty

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7}


def ulps(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest |ours - reference| in units of the last place of the reference's dtype at the reference."""
    _, exponent = torch.frexp(reference.double())
    ulp = torch.ldexp(torch.ones_like(exponent, dtype=torch.float64), exponent - 1 - MANTISSA_BITS[reference.dtype])
    return float(((ours.double() - reference.double()).abs() / ulp).max())


def fold_case(tokens: int, hidden: int, dtype: torch.dtype, one_centred: bool, shared: bool, seed: int,
              device: str = "cpu") -> list[float]:
    """[summed differs, residual written, normed's ulps, partials differ from router_partials(normed), relative error
    of the logits against the separate path's] of the fold against the norm kernel then router_partials. The mixer
    output is a strided view (every other feature), the residual rows a slice of wider rows."""
    from engine.ops.triton_norm import triton_rms_norm
    from engine.ops.triton_router import normed_router_partials, router_partials

    g = torch.Generator().manual_seed(seed)
    mixer = torch.randn(tokens, 2 * hidden, generator=g).to(dtype).to(device)[:, ::2]
    residual = (torch.randn(tokens, hidden + 8, generator=g) * 2).to(dtype).to(device)[:, :hidden]
    norm_weight = (torch.randn(hidden, generator=g) * 0.2 + (0.0 if one_centred else 1.0)).to(dtype).to(device)
    router_weight = (torch.randn(32 + shared, hidden, generator=g) * 0.05).to(dtype).to(device)
    kept = residual.clone()
    partials, normed, summed = normed_router_partials(mixer, residual, norm_weight, EPS, one_centred, router_weight,
                                                      shared)
    ref_summed = torch.empty_like(kept)
    ref_normed = triton_rms_norm(mixer, norm_weight, EPS, one_centred, kept.clone(), ref_summed)
    ref_partials = router_partials(ref_normed, router_weight, shared)
    return [float(not torch.equal(summed, ref_summed)), float(not torch.equal(residual, kept)),
            ulps(normed, ref_normed), float(not torch.equal(partials, router_partials(normed, router_weight, shared))),
            relative_error(partials.double().sum(0).cpu(), ref_partials.double().sum(0).cpu())]


def fold_results() -> list[float]:
    poison_empty()  # what the fold leaves unwritten is NaN: it fails the comparisons
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for tokens in (1, 5, 40):
            for one_centred in (True, False):
                results += fold_case(tokens, 300, dtype, one_centred, shared=one_centred, seed=tokens)
    results += fold_case(1, 2048, torch.bfloat16, True, True, seed=9)  # Qwen3-Next's hidden: 16 chunks
    return results


def assert_folds_match(results: list[float], dtypes: list[torch.dtype], bf16_ulps: float) -> None:
    """Every case exact but the normed rows: within 8 float32 ulps (the interpreter shows up to 4), `bf16_ulps`."""
    cases = [results[i:i + 5] for i in range(0, len(results), 5)]
    assert len(cases) == len(dtypes)
    for (summed_differs, residual_written, normed_ulps, partials_differ, logits_error), dtype in zip(
            cases, dtypes, strict=True):
        assert summed_differs == 0.0 and residual_written == 0.0 and partials_differ == 0.0, cases
        assert normed_ulps <= (8.0 if dtype == torch.float32 else bf16_ulps), cases
        if dtype == torch.float32:  # the interpreter's bf16 dot is no reference
            assert logits_error <= 1e-6, cases


def test_the_folded_norm_gives_the_norm_kernels_rows_and_partials_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_router_norm import fold_results\n"
                              "print(*fold_results(), sep='\\n')")
    assert_folds_match(results, [torch.float32] * 6 + [torch.bfloat16] * 7, bf16_ulps=0.0)  # exact here


def unfolded_outputs(layer: DecoderLayer, hidden: torch.Tensor, residual: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's (parts, residual) with the fold disabled: the norm kernel (or eager norm), then the MoE."""
    folds_norm = SparseMoE.folds_norm
    SparseMoE.folds_norm = lambda self, mixer_out, norm: False
    try:
        return layer(hidden.clone(), None if residual is None else residual.clone(), None)
    finally:
        SparseMoE.folds_norm = folds_norm


def layer_results() -> list[float]:
    """[folds taken, parts' relative error, residual differs, caller's tensors written] a case: the decoder layer
    with the fold against it disabled, float32 on the CPU with the Triton path forced on; a merged layer whose shared
    expert is slot E and one without a shared expert; the range's first layer (no residual: the input is the
    caller's) and a later one; both norm forms; one tile of tokens and three."""
    import engine.layers.moe as moe_module
    from engine.layers.moe import Experts

    poison_empty()
    Experts.runs_triton = lambda self, x: x.dtype == torch.float32  # the interpreter serves fp32 CPU tensors
    fold, folds = moe_module.normed_router_partials, [0]

    def counted(*args, **kwargs):
        folds[0] += 1
        return fold(*args, **kwargs)

    moe_module.normed_router_partials = counted
    results = []
    for tokens, shared, one_centred, first in ((1, 32, True, True), (5, 32, False, False), (40, 0, True, False),
                                               (40, 32, False, True)):
        moe = moe_layer(8, 2, True, shared, seed=tokens)
        moe.merge_projections()
        layer = decoder_layer(moe, one_centred, seed=tokens)
        g = torch.Generator().manual_seed(tokens)
        hidden = torch.randn(tokens, 64, generator=g)
        residual = None if first else torch.randn(tokens, 64, generator=g)
        kept = [hidden.clone(), None if first else residual.clone()]
        with torch.no_grad():
            ref_parts, ref_residual = unfolded_outputs(layer, hidden, residual)
            folds[0] = 0
            parts, new_residual = layer(hidden, residual, None)
        written = not torch.equal(hidden, kept[0]) or not first and not torch.equal(residual, kept[1])
        results += [float(folds[0]), relative_error(parts.sum(1), ref_parts.sum(1)),
                    float(not torch.equal(new_residual, ref_residual)), float(written)]
    return results


def test_a_decoder_layer_with_the_norm_folded_matches_it_unfolded_in_the_interpreter():
    results = run_interpreted("from tests.engine.test_kernel_router_norm import layer_results\n"
                              "print(*layer_results(), sep='\\n')")
    assert len(results) == 16
    folds, errors, residual_differs, written = results[0::4], results[1::4], results[2::4], results[3::4]
    assert folds == [1.0] * 4 and max(errors) <= 1e-5 and residual_differs == [0.0] * 4 and written == [0.0] * 4


# --- on a GPU: bf16 at Qwen3-Next's sizes (hidden 2048, the merged router [33, 2048]) --------------------------------


@cuda
def test_the_folded_norm_gives_the_norm_kernels_rows_and_partials_on_the_gpu():
    results, dtypes = [], []
    for tokens in (1, 5, 16, 17, 40, 512):
        for one_centred in (True, False):
            for shared in (True, False):
                results += fold_case(tokens, 2048, torch.bfloat16, one_centred, shared, seed=tokens, device="cuda")
                dtypes.append(torch.bfloat16)
    # Real bf16 dots: the logits against the separate path's are near (one-ulp normed differences aside).
    assert max(results[4::5]) <= 1e-3
    results[4::5] = [0.0] * len(dtypes)
    assert_folds_match(results, dtypes, bf16_ulps=1.0)


@cuda
@pytest.mark.parametrize("tokens", [1, 16, 64, 512])
@pytest.mark.parametrize("one_centred", [True, False])
def test_a_decoder_layer_with_the_norm_folded_matches_it_unfolded_on_the_gpu(tokens, one_centred):
    """The bf16 layer (32 experts top-8, the shared expert as slot E) as the first layer of a range and a later one:
    the same new residual (exact) and parts as with the fold disabled, the caller's hidden rows unwritten. On the GPU
    the input norm adds into the residual it is given (in place, by design), so each side gets its own copy."""
    bf16, _ = gpu_layer(32, 8, seed=tokens)
    layer = decoder_layer(bf16, one_centred, seed=tokens)
    g = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 2048, generator=g).bfloat16().cuda()
    for residual in (None, torch.randn(tokens, 2048, generator=g).bfloat16().cuda()):
        assert bf16.folds_norm(hidden, layer.post_attention_layernorm)
        kept = hidden.clone()
        with torch.inference_mode():
            ref_parts, ref_residual = unfolded_outputs(layer, hidden, residual)
            parts, new_residual = layer(hidden, None if residual is None else residual.clone(), None)
        assert torch.equal(hidden, kept)
        assert torch.equal(new_residual, ref_residual)
        assert parts.shape == ref_parts.shape == (tokens, 9, 2048)
        assert relative_error(parts.float().sum(1).cpu(), ref_parts.float().sum(1).cpu()) <= BF16
