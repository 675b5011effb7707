from dataclasses import replace

import pytest

from solvers.capacity import pp_pool
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.rig import load_rig
from solvers.shapes import (
    DEFAULT_SAFETY_BAND,
    GIB,
    concurrency,
    fit,
    fit_on_rig,
    largest_max_model_len,
    pool_needed,
    tokens,
)
from tests.support.solver_factories import hybrid_census

BPT = 1000  # bytes per token in the synthetic cases


def test_tokens_concurrency_and_pool_needed():
    assert tokens(10_999, BPT) == 10
    assert concurrency(65536, 32768) == 2.0
    assert pool_needed(8, 32768, 32768) == 8 * 2**30


def test_fit_counts_the_safety_band_and_fits_at_the_boundary():
    needed = pool_needed(4, 8192, BPT)
    exact = fit(needed + DEFAULT_SAFETY_BAND, BPT, 8192, 4)
    assert exact.fits and exact.refusal is None
    assert exact.usable_tokens == 4 * 8192 and exact.concurrency == 4.0
    assert exact.tokens == (needed + DEFAULT_SAFETY_BAND) // BPT
    assert exact.to_dict()["usable_bytes"] == needed


def test_a_shape_one_byte_short_is_refused_with_its_arithmetic():
    needed = pool_needed(4, 8192, BPT)
    short = fit(needed + DEFAULT_SAFETY_BAND - 1, BPT, 8192, 4)
    assert not short.fits
    assert f"= {needed - 1} B < needed 4 seqs x 8192 tokens x {BPT} B/token = {needed} B" in short.refusal
    assert "short by 1 B" in short.refusal and "safety band 2147483648 B" in short.refusal


def test_safety_band_is_configurable():
    needed = pool_needed(1, 1024, BPT)
    assert fit(needed, BPT, 1024, 1, safety_band_bytes=0).fits
    assert not fit(needed + 2 * GIB, BPT, 1024, 1, safety_band_bytes="3GiB").fits
    assert fit(needed + 3 * GIB, BPT, 1024, 1, safety_band_bytes="3GiB").safety_band_bytes == 3 * GIB


@pytest.mark.parametrize("args, kwargs, message", [
    ((-1, BPT, 1024, 1), {}, "pool_bytes"),
    ((10**9, 0, 1024, 1), {}, "bytes_per_token"),
    ((10**9, BPT, 0, 1), {}, "max_model_len"),
    ((10**9, BPT, 1024, 0), {}, "seqs"),
    ((10**9, BPT, 1024, 1), {"safety_band_bytes": "2 parsecs"}, "safety_band"),
])
def test_fit_rejects_bad_inputs(args, kwargs, message):
    with pytest.raises(SolverError, match=message):
        fit(*args, **kwargs)


def test_largest_steps_down_then_keeps_a_fitting_bonus_half_step():
    result = largest_max_model_len(2 * 41_000 * BPT, BPT, 2, start=65536, safety_band_bytes=0)
    assert result.tried == ((65536, False), (49152, False), (32768, True), (40960, True))
    assert result.max_model_len == 40960 and result.fit.fits and result.refusal is None


def test_largest_drops_a_bonus_step_that_does_not_fit():
    result = largest_max_model_len(2 * 36_000 * BPT, BPT, 2, start=65536, safety_band_bytes=0)
    assert result.tried[-1] == (40960, False)
    assert result.max_model_len == 32768 and result.fit.max_model_len == 32768


def test_largest_takes_no_bonus_above_its_start():
    result = largest_max_model_len(10**12, BPT, 2, start=65536)
    assert result.tried == ((65536, True),) and result.max_model_len == 65536


def test_largest_starts_from_the_models_max_position_embeddings():
    model = replace(hybrid_census(), max_position_embeddings=32768)
    result = largest_max_model_len(10**12, BPT, 1, model=model, step=8192)
    assert result.start == 32768 and result.max_model_len == 32768


def test_largest_refuses_with_arithmetic_when_even_the_smallest_step_fails():
    result = largest_max_model_len(2 * 10_000 * BPT, BPT, 2, start=65536, safety_band_bytes=0)
    assert result.max_model_len is None and result.tried[-1] == (16384, False)
    assert result.refusal.startswith("even max_model_len 16384 (the smallest step) does not fit")
    assert "< needed 2 seqs x 16384 tokens" in result.refusal
    assert result.to_dict()["max_model_len"] is None


def test_largest_rejects_bad_starts():
    with pytest.raises(SolverError, match="max_position_embeddings"):
        largest_max_model_len(10**9, BPT, 1, model=hybrid_census())
    with pytest.raises(SolverError, match="exceeds"):
        largest_max_model_len(10**9, BPT, 1, start=65536, model=replace(hybrid_census(), max_position_embeddings=4096))
    with pytest.raises(SolverError, match="step"):
        largest_max_model_len(10**9, BPT, 1, start=65536, step=0)


def test_fit_on_rig_prices_the_pool_through_capacity():
    model, rig = load_census("reference-hybrid-64"), load_rig("reference")
    result = fit_on_rig(model, rig, 4096, 2)
    priced = pp_pool(model, rig, (28, 20, 16), replace(rig.shape, max_model_len=4096, max_num_seqs=2))
    assert result.pool_tokens == priced.pool_tokens and result.binding_rank == priced.binding_rank
    assert result.bytes_per_token == model.kv_bytes_per_token("bf16")
    assert result.fit.pool_bytes == result.pool_tokens * model.kv_bytes_per_token("bf16")
    assert result.fit.fits and result.to_dict()["fits"] is True


def test_fit_on_rig_refuses_a_long_contract_with_arithmetic_even_when_capacity_has_no_pool():
    model, rig = load_census("reference-hybrid-64"), load_rig("reference")
    result = fit_on_rig(model, rig, 200_000, 1)
    assert not result.pricing.feasible  # capacity: the pool cannot hold one sequence
    assert result.pool_tokens > 0 and result.binding_rank == 1
    assert "< needed 1 seqs x 200000 tokens x 32768 B/token" in result.refusal


def test_fit_on_rig_refuses_a_cut_that_cannot_clear_its_floor():
    model, rig = load_census("reference-hybrid-64"), load_rig("reference")
    result = fit_on_rig(model, rig, 4096, 1, cut=(40, 12, 12))
    assert result.fit is None and result.pool_tokens is None
    assert result.refusal.startswith("cut [40, 12, 12] refused: rank 0") and "arming floor" in result.refusal


def test_fit_on_rig_rejects_bad_inputs():
    model, rig = load_census("reference-hybrid-64"), load_rig("reference")
    with pytest.raises(SolverError, match="dtype"):
        fit_on_rig(model, rig, 4096, 1, kv_dtype="int3")
    with pytest.raises(SolverError, match="seqs"):
        fit_on_rig(model, rig, 4096, 0)
    with pytest.raises(SolverError, match="sums to"):
        fit_on_rig(model, rig, 4096, 1, cut=(28, 20, 15))
