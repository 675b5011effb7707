import pytest

from solvers.capacity import CutPricer, pp_pool
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.rig import load_rig
from tests.support.solver_factories import MIB, hybrid_census, make_rig


def test_pp_pool_is_the_min_over_ranks_of_hand_computed_allowed_tokens():
    result = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"]), [4, 12])
    rank0, rank1 = result.table()
    # rank 0: 64 - 1 overhead - (4 layers x 2 MiB + 1 MiB embeddings) - 1 workspace - 2 seqs x 3 linear x 8 KiB
    assert rank0["weights"] == 9 * MIB and rank0["state"] == 48 * 1024
    assert rank0["floor"] == 3 * MIB + 2 * MIB  # corridor 4 MiB less 25%, plus the 2 MiB seam reserve
    # (64 - 1 - 9 - 1 - 48 KiB - 5 MiB) / 2048 B = 24552 tokens, floored to whole 16-token blocks
    assert rank0["allowed"] == 24544
    assert rank1["cell_bytes"] == 3 * 2048
    assert rank1["allowed"] == 5424  # 5437.33 tokens -> 339 blocks of 16
    assert (result.pool_tokens, result.binding_rank) == (5424, 1)
    assert rank1["slack"] == 0 and rank0["slack"] == 24544 - 5424
    assert result.attention_split == (1, 3)


def test_the_pool_is_a_whole_number_of_kv_blocks():
    shape = {"max_model_len": 64, "max_num_seqs": 2, "max_num_batched_tokens": 64, "kv_dtype": "bf16"}
    exact = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"], shape={**shape, "block_size": 1}), [4, 12])
    blocked = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"], shape={**shape, "block_size": 32}), [4, 12])
    assert exact.pool_tokens == 5437
    assert blocked.pool_tokens == 5437 // 32 * 32


def test_ties_bind_on_the_lowest_rank():
    result = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"]), [8, 8])
    assert result.pool_tokens == 10208 and result.binding_rank == 0


def test_a_token_vector_passed_to_a_pp_pool_is_a_type_error():
    with pytest.raises(TypeError, match="layer-sharded"):
        pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"]), [8, 8], token_vector=[2.4, 1])


def test_a_cut_that_cannot_clear_its_floor_is_refused_with_the_arithmetic():
    result = pp_pool(hybrid_census(), make_rig(["20MiB", "64MiB"]), [8, 8])
    assert not result.feasible and result.pool_tokens is None
    assert "rank 0 (r0) cannot clear its arming floor" in result.reasons[0]
    assert "floor 5242880 B" in result.reasons[0]


def test_weights_that_fit_the_card_are_not_enough():
    # Rank 0 holds its weights (17 MiB of 24 MiB) but not the 5 MiB floor on top of the rest.
    result = pp_pool(hybrid_census(), make_rig(["24MiB", "64MiB"]), [8, 8])
    assert result.table()[0]["weights"] < 24 * MIB
    assert not result.feasible


def test_pool_is_not_monotone_in_the_cut():
    rig, model = make_rig(["64MiB", "40MiB"]), hybrid_census()
    results = {n: pp_pool(model, rig, [n, 16 - n]) for n in range(1, 16)}
    pools = [results[n].pool_tokens for n in range(1, 16)]
    peak = 1 + pools.index(max(pools))
    assert peak == 11, pools  # rises while layers leave the binder (rank 1) ...
    assert results[10].binding_rank == 1 and results[12].binding_rank == 0  # ... until rank 0 binds
    assert results[12].pool_tokens < results[11].pool_tokens


def test_a_rank_without_attention_layers_never_binds():
    model = hybrid_census(num_layers=8, interval=8)  # only layer 7 is attention
    result = pp_pool(model, make_rig(["64MiB", "64MiB"]), [6, 2])
    assert result.table()[0]["allowed"] is None
    assert result.binding_rank == 1


def test_a_pool_below_one_max_length_sequence_is_refused():
    rig = make_rig(["64MiB", "64MiB"], shape={"max_model_len": 20000, "max_num_seqs": 1,
                                             "max_num_batched_tokens": 64})
    result = pp_pool(hybrid_census(), rig, [8, 8])
    assert not result.feasible and "cannot hold one sequence of max_model_len 20000" in result.reasons[0]


def test_a_pool_of_exactly_one_max_length_sequence_is_feasible():
    """Guard: the one-sequence check of CutPricer.price refuses a pool below max_model_len, never one equal to it
    (a pool of exactly max_model_len tokens holds one full-length sequence)."""
    shape = {"max_num_seqs": 1, "max_num_batched_tokens": 64, "kv_dtype": "bf16"}
    pool = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"], shape={**shape, "max_model_len": 64}), [8, 8])
    assert pool.feasible and pool.pool_tokens % 16 == 0
    exact = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"], shape={**shape, "max_model_len": pool.pool_tokens}),
                    [8, 8])
    assert exact.feasible and exact.reasons == () and exact.pool_tokens == pool.pool_tokens
    beyond = pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"],
                                               shape={**shape, "max_model_len": pool.pool_tokens + 1}), [8, 8])
    assert not beyond.feasible
    assert f"pool {pool.pool_tokens} tokens (bound by rank 0) cannot hold one sequence" in beyond.reasons[0]


@pytest.mark.parametrize("cut, message", [
    ([8, 7], "sums to 15 layers; the model has 16"),
    ([16, 0], "positive whole number"),
    ([8, -1, 9], "has 3 entries"),
    ("8,8", "list of layer counts"),
    ([8.0, 8], "positive whole number"),
])
def test_bad_cuts_are_refused_with_the_reason(cut, message):
    with pytest.raises(SolverError, match=message):
        pp_pool(hybrid_census(), make_rig(["64MiB", "64MiB"]), cut)


def test_the_arena_costs_pool_on_the_rank_that_holds_it():
    model, rig = hybrid_census(), make_rig(["64MiB", "64MiB"])
    plain = CutPricer(model, rig).price([4, 12])
    armed = CutPricer(model, rig, arena_bytes=[0, 4 * MIB]).price([4, 12])
    assert armed.table()[1]["arena"] == 4 * MIB
    row = plain.table()[1]
    tokens = (row["rest"] - 4 * MIB - row["floor"]) // row["cell_bytes"]
    assert armed.pool_tokens == tokens - tokens % 16
    assert armed.pool_tokens < plain.pool_tokens


def test_reference_rig_incumbent_binds_on_the_x4_card():
    result = pp_pool(load_census("reference-hybrid-64"), load_rig("reference"), [28, 20, 16])
    assert result.feasible and result.binding_rank == 1
    assert result.attention_split == (7, 5, 4)
    # Measured seam reserves exist for this split: the floors are not estimates.
    assert all(not row["floor_detail"]["estimated"] for row in result.table())
    # Moving two layers off the binder raises the pool (slack there was unreachable at the incumbent).
    assert pp_pool(load_census("reference-hybrid-64"), load_rig("reference"), [30, 18, 16]).pool_tokens > \
        result.pool_tokens


def test_a_tied_head_is_a_second_copy_of_the_embeddings_on_a_separate_last_rank():
    from dataclasses import replace

    tied = replace(hybrid_census(), lm_head_params=0)
    two = pp_pool(tied, make_rig(["64MiB", "64MiB"]), [8, 8]).table()
    one = pp_pool(tied, make_rig(["128MiB"]), [16]).table()
    assert two[1]["weights"] == 16 * MIB + tied.embedding_bytes  # 8 layers + the copied matrix
    assert one[0]["weights"] == 32 * MIB + tied.embedding_bytes  # one rank: embeddings serve as the head
